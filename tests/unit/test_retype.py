"""Which retyped values render otherwise in the new type (cdcserver/reread/retype.py): those
rows are deleted in the old version before an ALTER's new one."""

from __future__ import annotations

from decimal import Decimal

from cdcserver.core.changes import TableChange
from cdcserver.reread.retype import renders_otherwise, retyped
from cdcserver.schema.history import SchemaHistory


def _alter(sql: str) -> tuple[TableChange, dict]:
    history = SchemaHistory(None)
    history.apply("CREATE TABLE t (id INT PRIMARY KEY, d DECIMAL(10,3), f DOUBLE, "
                  "s VARCHAR(20), n BIGINT, at DATETIME(3))", "db", None)
    _, changes = history.apply(sql, "db", None)
    [change] = changes
    assert change.previous is not None
    return change, retyped(change, change.previous)


def test_values_a_narrower_type_renders_alike_or_not():
    _, columns = _alter("ALTER TABLE t MODIFY d DECIMAL(10,1), MODIFY f FLOAT, "
                        "MODIFY s VARCHAR(5), MODIFY n INT, MODIFY at DATETIME")
    assert set(columns) == {"d", "f", "n", "at"}  # a VARCHAR's length is not its type
    assert not renders_otherwise({"d": Decimal("1.500"), "f": 4.5, "s": "long text",
                                  "n": 7, "at": None}, columns)
    assert renders_otherwise({"d": Decimal("12.345")}, columns)
    assert renders_otherwise({"f": 18.5714286}, columns)  # FLOAT prints 18.57143
    assert not renders_otherwise({"f": 18.5714}, columns)  # FLOAT prints 18.5714 too
    assert renders_otherwise({"d": Decimal("1234567890.5")}, columns)  # past DECIMAL(10,1)
    assert renders_otherwise({"at": "2024-01-02 03:04:05.678"}, columns)
    # Found by the soak (seed 70000): a float32 holds 35048288 exactly, but FLOAT prints it
    # with seven digits, 3.504829e+07 (35048290), where the DOUBLE printed 35048288.0.
    assert renders_otherwise({"f": 35048288.0}, columns)
    assert not renders_otherwise({"f": 16777216.0}, columns)  # printed 16777216 in both
    # Soak seed 92001: a FLOAT holds 78375862 as 78375864 (the nearest float32), though
    # "78375862" is also the shortest text that reads back as that float32
    assert renders_otherwise({"f": 78375862.0}, columns)


def test_renamed_and_unchanged_columns_are_not_retyped():
    _, columns = _alter("ALTER TABLE t CHANGE s s2 VARCHAR(20), MODIFY d DECIMAL(12,4)")
    assert "s" not in columns
    assert not renders_otherwise({"d": Decimal("12.345")}, columns)  # a wider scale holds it


def test_a_float_widened_to_double_renders_alike_unless_single_precision_shows():
    history = SchemaHistory(None)
    history.apply("CREATE TABLE w (id INT PRIMARY KEY, f FLOAT)", "db", None)
    _, [change] = history.apply("ALTER TABLE w MODIFY f DOUBLE", "db", None)
    assert change.previous is not None
    columns = retyped(change, change.previous)
    assert not renders_otherwise({"f": 0.5}, columns)
    assert not renders_otherwise({"f": 1.25}, columns)
    assert renders_otherwise({"f": 0.10000000149011612}, columns)  # FLOAT 0.1 as a double
