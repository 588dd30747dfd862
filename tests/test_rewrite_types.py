"""An ALTER that changes a column's type family rewrites every value; the repair's records
carry each row as the table has it now, in the new types (never a value of the old type in
a column of the new one)."""

from __future__ import annotations

import pytest

from tests.conftest import RunningService, Source
from tests.test_rowless import _equal, _repairs, _run

pytestmark = pytest.mark.mariadb


async def test_a_type_change_repairs_in_the_new_types(cdc: RunningService, source: Source):
    _run(source, "CREATE TABLE t (id INT PRIMARY KEY, a INT, b VARCHAR(10), c DATE, d FLOAT)",
         "INSERT INTO t VALUES (1, 5, '42', '2024-01-02', 0.5), (2, NULL, 'x', NULL, NULL)")
    await cdc.caught_up(source)
    _run(source, "ALTER TABLE t MODIFY a VARCHAR(10), MODIFY b INT, MODIFY c DATETIME,"
         " MODIFY d VARCHAR(20)", session=("SET SESSION sql_mode = ''",))
    rebuilt = await _equal(cdc, source, "t")
    assert _repairs(rebuilt)
    _run(source, "UPDATE t SET a = 'six' WHERE id = 1")
    await _equal(cdc, source, "t")
