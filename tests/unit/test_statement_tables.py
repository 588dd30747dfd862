"""Which tables a data change logged as an SQL statement names (replication/rowless.py): the
tables read again after a session logged it so. More than it changed, never fewer."""

from __future__ import annotations

from cdcserver.core.names import TableName
from cdcserver.replication.rowless import statement_tables
from cdcserver.schema.history import SchemaHistory


def _history() -> SchemaHistory:
    history = SchemaHistory(None)
    for sql in ("CREATE TABLE orders (id INT PRIMARY KEY, total INT)",
                "CREATE TABLE `line items` (id INT PRIMARY KEY, order_id INT)",
                "CREATE TABLE audit (id INT PRIMARY KEY, what TEXT)"):
        history.apply(sql, "shop", None)
    history.apply("CREATE TABLE orders (id INT PRIMARY KEY)", "crm", None)
    return history


def test_every_table_named_but_none_in_literals_or_comments():
    history = _history()
    found = statement_tables(
        "UPDATE orders o JOIN `line items` li ON li.order_id = o.id /* audit */ "
        "SET o.total = 1, li.order_id = 2 WHERE o.id = 'audit'", "shop", history)
    assert found == [TableName("shop", "orders"), TableName("shop", "line items")]


def test_qualified_names_and_another_default_database():
    history = _history()
    assert statement_tables("INSERT INTO shop.audit SELECT id, 'x' FROM crm.orders",
                            "other", history) == [TableName("shop", "audit"),
                                                  TableName("crm", "orders")]
    assert statement_tables("DELETE FROM ORDERS WHERE id = 1", "crm", history) == \
        [TableName("crm", "orders")]
    assert statement_tables("INSERT INTO some_view VALUES (1)", "shop", history) == []
