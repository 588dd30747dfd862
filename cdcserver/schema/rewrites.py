"""Which ALTER actions rewrite the values a table already holds, without row events.

``ALTER TABLE`` copies or converts every row inside the server; the binlog logs only the
statement. Where the new column can hold every old value unchanged (a wider integer, a longer
string in the same or a larger character set, more decimal places, an ENUM with labels
appended) the rows a consumer holds are still the table's. Anything else may have changed
stored values: a narrower type truncates or clips them under a permissive ``sql_mode``,
``NOT NULL`` turns NULLs into zeros, another character set replaces characters it lacks with
``?``, FLOAT to DOUBLE exposes the float's binary value, a temporal type changes the text of
every value. An added column with a value other than NULL (a DEFAULT, NOT NULL, AUTO_INCREMENT,
a generated column) gives every existing row that value. Those actions are named here, so
that the stream re-reads the table (:mod:`cdcserver.replication.rowless`).

This errs on the side of re-reading: a re-read that finds nothing different costs a read of
the table and adds no record.
"""

from __future__ import annotations

from cdcserver.schema.columnspec import BINARY_TYPES, CHARACTER_TYPES, ColumnSpec, canonical_type
from cdcserver.schema.definition import TableDefinition
from cdcserver.schema.statements import AddColumns, ChangeColumn, ConvertCharset, SetVersioning

_INTEGER_BYTES = {"tinyint": 1, "smallint": 2, "mediumint": 3, "int": 4, "bigint": 8}
_TEXT_BYTES = {"tinytext": 255, "text": 65535, "mediumtext": 1 << 24, "longtext": 1 << 32,
               "tinyblob": 255, "blob": 65535, "mediumblob": 1 << 24, "longblob": 1 << 32}
_STRINGS = frozenset({"char", "varchar"}) | frozenset(_TEXT_BYTES)
_WIDER_CHARSETS = {  # a column can move to these character sets without losing a character
    "ascii": {"latin1", "utf8mb3", "utf8", "utf8mb4", "utf16", "utf32", "ucs2"},
    "utf8mb3": {"utf8", "utf8mb4", "utf16", "utf32"},
    "utf8": {"utf8mb3", "utf8mb4", "utf16", "utf32"},
    "ucs2": {"utf8mb3", "utf8", "utf8mb4", "utf16", "utf32"},
    "utf16": {"utf8mb4", "utf32"},
    "utf32": {"utf8mb4", "utf16"},
    "utf8mb4": {"utf16", "utf32"},
}
_BLOB_NAMES = frozenset({"tinyblob", "blob", "mediumblob", "longblob"})
_BYTE_STRINGS = frozenset({"binary", "varbinary"}) | _BLOB_NAMES  # BINARY pads with zeros
_UNICODE = {"utf8mb4", "utf16", "utf32"}  # holds every character of every character set


# The rewrites of a statement that turns system versioning on or off (the stream's rows before
# and after it differ in their period; a repair beside the stream leaves them to the pipeline)
DROP_VERSIONING = "DROP SYSTEM VERSIONING removes the history rows"
ADD_VERSIONING = "ADD SYSTEM VERSIONING gives every row its period"
VERSIONING_REWRITES = (DROP_VERSIONING, ADD_VERSIONING)

def action_rewrites(definition: TableDefinition, action: object) -> list[str]:
    """Why ``action`` on a table of ``definition`` may have rewritten stored values (one
    reason per column), or nothing."""
    if isinstance(action, ChangeColumn) and definition.has(action.old):
        old = definition.columns[definition.index(action.old)]
        new = _with_charset(action.column, definition.default_charset)
        if not holds_every_value(old, new):
            return [f"{'MODIFY' if old.name == new.name else 'CHANGE'} {old.name} "
                    f"{_describe(old)} to {_describe(new)} rewrites its values"]
    if isinstance(action, AddColumns):
        return [f"ADD COLUMN {name} gives the rows already there a value"
                for name in dict.fromkeys(action.filled)
                if not (action.if_not_exists and definition.has(name))]
    if isinstance(action, ConvertCharset):
        return [f"CONVERT TO CHARACTER SET {action.charset} rewrites {c.name}"
                for c in definition.columns
                if c.type in CHARACTER_TYPES and not c.binary
                and not _charset_holds(c.charset, action.charset)]
    if isinstance(action, SetVersioning) and not action.on \
            and definition.period is not None:
        return [DROP_VERSIONING]
    if isinstance(action, SetVersioning) and action.on:
        return [ADD_VERSIONING]
    return []


def holds_every_value(old: ColumnSpec, new: ColumnSpec) -> bool:
    """Whether every value of ``old`` is the same value in ``new``."""
    if old.nullable and not new.nullable:
        return False
    if (old.type, old.args, old.unsigned, old.binary, old.charset, old.json_check) == (
            new.type, new.args, new.unsigned, new.binary, new.charset, new.json_check):
        return True
    if old.extended != new.extended:
        return False
    if old.type in _INTEGER_BYTES and new.type in _INTEGER_BYTES:
        return _integer_fits(old, new)
    if old.type == "decimal" and new.type == "decimal":
        (p1, s1), (p2, s2) = _precision(old), _precision(new)
        return p2 - s2 >= p1 - s1 and s2 >= s1 and (new.unsigned <= old.unsigned)
    if old.type in _STRINGS and new.type in _STRINGS:
        return _string_fits(old, new)
    if old.type in _BYTE_STRINGS and new.type in _BYTE_STRINGS - {"binary"}:
        return _bytes(new) >= _bytes(old)
    if old.type in ("enum", "set") and new.type == old.type:
        return new.args[:len(old.args)] == old.args and _charset_holds(old.charset,
                                                                       new.charset)
    if old.type in ("datetime", "time", "timestamp") and new.type == old.type:
        return _fsp(new) >= _fsp(old)
    return old.type == "double" == new.type


def _integer_fits(old: ColumnSpec, new: ColumnSpec) -> bool:
    a, b = _INTEGER_BYTES[old.type], _INTEGER_BYTES[new.type]
    if old.unsigned == new.unsigned:
        return b >= a
    return old.unsigned and not new.unsigned and b > a


def _precision(spec: ColumnSpec) -> tuple[int, int]:
    args = [int(a) for a in spec.args if a.isdigit()]
    return (args[0] if args else 10), (args[1] if len(args) > 1 else 0)


def _fsp(spec: ColumnSpec) -> int:
    return int(spec.args[0]) if spec.args and spec.args[0].isdigit() else 0


def _length(spec: ColumnSpec) -> int:
    return int(spec.args[0]) if spec.args and spec.args[0].isdigit() else 1


def _string_fits(old: ColumnSpec, new: ColumnSpec) -> bool:
    """Character data: no shorter, no stripping of trailing spaces, no lost character."""
    if old.binary != new.binary or old.type in BINARY_TYPES or new.type in BINARY_TYPES:
        return False
    if not _charset_holds(old.charset, new.charset):
        return False
    if new.type == "char" and old.type != "char":
        return False  # CHAR strips trailing spaces
    if new.type in ("char", "varchar"):
        return old.type in ("char", "varchar") and _length(new) >= _length(old)
    # to a TEXT type: its capacity is in bytes, at most four per character
    chars = _length(old) if old.type in ("char", "varchar") else _TEXT_BYTES[old.type]
    return _TEXT_BYTES[new.type] >= chars * 4 or (
        old.type in _TEXT_BYTES and _TEXT_BYTES[new.type] >= _TEXT_BYTES[old.type])


def _bytes(spec: ColumnSpec) -> int:
    if spec.type in _BLOB_NAMES:
        return _TEXT_BYTES[spec.type]
    return _length(spec)


def _charset_holds(old: str | None, new: str | None) -> bool:
    old, new = (old or "").lower(), (new or "").lower()
    if old == new:
        return True
    return new in _WIDER_CHARSETS.get(old, set()) or (bool(old) and new in _UNICODE
                                                      and old != "binary")


def _with_charset(column: ColumnSpec, charset: str | None) -> ColumnSpec:
    if column.type in CHARACTER_TYPES and column.charset is None and charset is not None:
        return ColumnSpec(column.name, column.type, column.args, column.unsigned,
                          charset == "binary", column.nullable, column.json_check, charset)
    return column


def _describe(spec: ColumnSpec) -> str:
    args = f"({','.join(spec.args)})" if spec.args and spec.type not in ("enum", "set") \
        else ""
    text = f"{canonical_type(spec.type).upper()}{args}"
    if spec.unsigned:
        text += " UNSIGNED"
    if spec.charset and spec.type in CHARACTER_TYPES:
        text += f" {spec.charset}"
    return text + ("" if spec.nullable else " NOT NULL")
