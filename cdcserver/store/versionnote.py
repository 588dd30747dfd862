"""What a schema statement did to a table, as the ``ddl`` key of the version it starts says it.

The key tells a reader of the table's stream why a new version begins: the statement (only its
own part of a statement that renamed or dropped several tables), a rename, values the statement
rewrote without row events (a repair follows), columns renamed under the rows stored before.
"""

from __future__ import annotations

from typing import Any

from cdcserver.core.capture import RULED_STATEMENT
from cdcserver.core.changes import Ddl, TableChange


def version_note(ddl: Ddl, change: TableChange) -> dict[str, Any]:
    """The ``ddl`` key of the version ``change`` starts."""
    about: dict[str, Any] = {"kind": change.kind, "statement": own_statement(ddl, change)}
    if change.layout is not None and change.layout.image is not None:
        about["statement"] = RULED_STATEMENT
    if change.note:
        about["note"] = change.note
    if change.renamed is not None:  # a reference, as a client requests the other name
        about["renamed_to" if change.kind == "drop" else "renamed_from"] = change.renamed.ref()
    if change.rewrites:  # rows changed without row events: a repair follows
        about["rewrites"] = change.rewrites
    if change.renamed_columns:  # the rows stored before keep their values, renamed
        about["renamed_columns"] = dict(change.renamed_columns)
    return about


def own_statement(ddl: Ddl, change: TableChange) -> str:
    """The statement as a version of ``change``'s table shows it. One that renamed or
    dropped several tables is told as its part for this table alone (``RENAME TABLE a TO
    b``, ``DROP TABLE a``): a user who may read one table does not learn the others'
    names from its schema."""
    own = {(change.database, change.table)}
    if change.renamed is not None:
        own.add((change.renamed.database, change.renamed.table))
    named = {(c.database, c.table) for c in ddl.changes}
    if ddl.kind not in ("rename", "drop") or named <= own:
        return ddl.sql
    this = _quoted(change.database, change.table)
    if change.renamed is not None:
        other = _quoted(change.renamed.database, change.renamed.table)
        return f"RENAME TABLE {this} TO {other}" if change.kind == "drop" else \
            f"RENAME TABLE {other} TO {this}"
    return f"DROP TABLE {this}"


def _quoted(database: str, table: str) -> str:
    return ".".join("`" + name.replace("`", "``") + "`" for name in (database, table))
