"""What one application's session sets for itself stops no other table (issue 50, item 2).

A session may set ``binlog_row_image`` to ``MINIMAL`` or ``NOBLOB`` for itself: its row events
then miss columns, and the table's stream cannot be exact from them. That table is
quarantined (marked in-band, its readers told), every other table streams on, and the service
resyncs it by itself once it can read it (at once here): the table rebuilt from its raw JSON
stream equals ``SELECT`` on the source. It used to stop the whole service (exit 1)."""

from __future__ import annotations

import asyncio

import pytest

from cdcserver.core.names import TableName
from tests.conftest import RunningService, Source
from tests.helpers import PASSWORD, USER, eventually
from tests.oracle import assert_stream_equals_table, read_stream

pytestmark = pytest.mark.mariadb


@pytest.mark.parametrize("image", ["MINIMAL", "NOBLOB"])
async def test_a_session_with_a_partial_row_image_quarantines_its_table_alone(
        cdc: RunningService, source: Source, image: str):
    db = source.database
    table = TableName(db, "pi")
    source.execute(f"CREATE TABLE `{db}`.pi (id INT PRIMARY KEY, a VARCHAR(20), b INT, "
                   "t TEXT)",
                   f"CREATE TABLE `{db}`.other (id INT PRIMARY KEY, v INT)",
                   f"INSERT INTO `{db}`.pi VALUES (1, 'one', 1, 'x'), (2, 'two', 2, 'y')")
    await cdc.caught_up(source)
    source.execute(f"SET SESSION binlog_row_image = {image}",
                   f"UPDATE `{db}`.pi SET b = 20 WHERE id = 2",  # a partial image
                   f"INSERT INTO `{db}`.other VALUES (1, 1)",
                   "SET SESSION binlog_row_image = FULL",
                   f"INSERT INTO `{db}`.other VALUES (2, 2)")
    await cdc.caught_up(source)  # the service goes on
    assert table in cdc.service.store.quarantined
    assert "binlog_row_image" in cdc.service.store.quarantined[table].cause
    others = await read_stream(cdc.port, f"`{db}`.other", user=USER, password=PASSWORD,
                               quiet=0.5)
    assert [r["id"] for r in others if "event_type" in r] == [1, 2]

    async def released() -> bool:  # the resync rides on the source's next transaction
        source.execute(f"INSERT INTO `{db}`.other SELECT MAX(id) + 1, 0 FROM `{db}`.other")
        await asyncio.sleep(0.2)
        return table not in cdc.service.store.quarantined

    await eventually(released, bool, 60, "the resync")
    conn = source.server.connect()
    try:
        await assert_stream_equals_table(cdc.port, conn, db, "pi", user=USER,
                                         password=PASSWORD)
    finally:
        conn.close()
