"""The oracle checks itself: on every type, the stream rebuilt over a raw socket equals the table,
and a change the stream does not carry is seen as a difference."""

from __future__ import annotations

import pytest

from tests.conftest import RunningService, Source
from tests.helpers import PASSWORD, USER
from tests.oracle import assert_stream_equals_table
from tests.server.test_types import _fill

pytestmark = pytest.mark.mariadb


async def test_the_oracle_sees_every_type_equal_and_a_hidden_change_different(
        cdc: RunningService, source: Source):
    _fill(source)
    await cdc.caught_up(source)
    conn = source.server.connect()
    try:
        await assert_stream_equals_table(cdc.port, conn, source.database, "types",
                                         user=USER, password=PASSWORD)
        # A change the binlog does not carry (statement format, not decoded by the stream's
        # readers... here: binlogging off) must make the oracle fail.
        with conn.cursor() as cur:
            cur.execute("SET SESSION sql_log_bin = 0")
            cur.execute(f"UPDATE `{source.database}`.types SET d2 = 1.25 WHERE id = 3")
            cur.execute("SET SESSION sql_log_bin = 1")
        with pytest.raises(AssertionError, match="key \\(3,\\)"):
            await assert_stream_equals_table(cdc.port, conn, source.database, "types",
                                             user=USER, password=PASSWORD, quiet=0.3)
    finally:
        conn.close()
