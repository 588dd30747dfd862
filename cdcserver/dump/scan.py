"""Reading a table's rows for a dump: the select list, and primary-key chunks.

Each column is selected in the text form the dump stores (see
:mod:`mariadb_cdc_client.format.dump`): FLOAT as ``CAST(f AS DOUBLE)`` (the text protocol
prints FLOAT with only 6 digits; the double holds its 32-bit value exactly), BIT as the
number, ENUM/SET/INET/UUID as their text.

A table with a primary key is read in chunks in key order, each chunk starting after the last
key of the one before (keyset pagination, in the expanded form MariaDB's range optimizer turns
into an index range: ``a > x OR (a = x AND b > y)``). Every chunk is a separate statement in
the same snapshot, so a crash loses at most one chunk of work, and a resumed dump continues
from the last key written. Key values are written as SQL literals: numbers as they are,
temporal values quoted, strings as hex with a character set introducer (binary-safe, compared
in the column's collation). A table whose key has a type that does not order and compare the
same way as a literal (FLOAT, ENUM, BIT, UUID...), or that has no primary key, is read in one
ordered-by-nothing scan.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from cdcserver.core.capture import HASH, value_function
from cdcserver.core.names import TableName
from cdcserver.dump import rawrows
from cdcserver.dump.snapshot import qualified, quote
from cdcserver.schema.columnspec import BINARY_TYPES
from cdcserver.schema.definition import TableDefinition
from mariadb_cdc_client.format.schema import Field, Kind

_NUMERIC_KEY = frozenset({"tinyint", "smallint", "mediumint", "int", "bigint", "decimal",
                          "year", "serial"})
_TEMPORAL_KEY = frozenset({"date", "time", "datetime", "timestamp"})
_STRING_KEY = frozenset({"char", "varchar", "binary", "varbinary", "tinytext", "text",
                         "mediumtext", "longtext", "tinyblob", "blob", "mediumblob",
                         "longblob"})
_NUMBER = re.compile(rb"^-?[0-9]+(\.[0-9]+)?$")
_TEMPORAL = re.compile(rb"^-?[0-9:. -]+$")


def select_expression(f: Field) -> str:
    name = quote(f.column)
    if f.kind == Kind.FLOAT:
        return f"CAST({name} AS DOUBLE)"
    if f.real_type == "bit":
        return f"CAST({name} AS UNSIGNED)"
    if f.real_type in ("set", "enum", "inet4", "inet6", "uuid"):
        return f"CAST({name} AS CHAR)"
    return name


@dataclass(frozen=True)
class KeyColumn:
    name: str
    position: int  # in the select list
    sql_type: str
    binary: bool

    def literal(self, raw: bytes) -> str:
        if self.sql_type in _NUMERIC_KEY:
            if not _NUMBER.match(raw):
                raise ValueError(f"key {self.name!r}: {raw!r} is not a number")
            return raw.decode("ascii")
        if self.sql_type in _TEMPORAL_KEY:
            if not _TEMPORAL.match(raw):
                raise ValueError(f"key {self.name!r}: {raw!r} is not a temporal value")
            return "'" + raw.decode("ascii") + "'"
        hexed = raw.hex()
        if self.binary:
            return f"X'{hexed}'"
        return f"_utf8mb4 X'{hexed}'"


class ScanPlan:
    """How a table is read: ``definition`` as the column rules store it
    (:func:`cdcserver.schema.masking.project_definition`), ``fields`` its Avro fields;
    ``salt`` the hash's, when a column is hashed."""

    def __init__(self, table: TableName, definition: TableDefinition,
                 fields: tuple[Field, ...], salt: bytes | None = None) -> None:
        self.table = table
        self.fields = fields
        self.columns = ", ".join(select_expression(f) for f in fields)
        self.key = _key_columns(definition, fields)
        self.stored = stored_lines(definition, salt)

    def lines(self, conn: Any, sql: str, batch_rows: int) -> Iterator[rawrows.Line]:
        """The rows ``sql`` reads as insert lines, hashed and masked columns as stored."""
        lines = rawrows.query_lines(conn, sql, batch_rows)
        return lines if self.stored is None else map(self.stored, lines)

    def into(self, conn: Any, sql: str, batch_rows: int, out: rawrows.Sink
             ) -> Iterator[tuple[int, bytes]]:
        """The rows ``sql`` reads written to ``out`` as insert lines (encoded straight into
        its room when no column is hashed or masked); yields the rows and the last row of
        each piece."""
        if self.stored is None:
            yield from rawrows.query_into(conn, sql, batch_rows, out)
            return
        for data, rows, last in self.lines(conn, sql, batch_rows):
            out.write(data)
            yield rows, last

    @property
    def chunked(self) -> bool:
        return bool(self.key)

    def chunk_sql(self, after: tuple[bytes, ...] | None, limit: int,
                  upto: tuple[bytes, ...] | None = None) -> str:
        """The next ``limit`` rows in key order after key ``after`` (None: from the first),
        up to key ``upto`` included (None: to the last)."""
        assert self.key
        sql = f"SELECT {self.columns} FROM {qualified(self.table)}"
        terms = ([f"({self._after(after)})"] if after is not None else []) + \
            ([f"({self._upto(upto)})"] if upto is not None else [])
        if terms:
            sql += " WHERE " + " AND ".join(terms)
        order = ", ".join(quote(k.name) for k in self.key)
        return f"{sql} ORDER BY {order} LIMIT {int(limit)}"

    def key_sql(self, offset: int) -> str:
        """The key of the row ``offset`` rows into the table, in key order (a boundary
        between two readers' ranges)."""
        assert self.key
        order = ", ".join(quote(k.name) for k in self.key)
        return (f"SELECT {order} FROM {qualified(self.table)} ORDER BY {order} "
                f"LIMIT 1 OFFSET {int(offset)}")

    def last_key_sql(self) -> str:
        """The key of the table's last row in key order (where its last range ends)."""
        assert self.key
        columns = ", ".join(quote(k.name) for k in self.key)
        order = ", ".join(f"{quote(k.name)} DESC" for k in self.key)
        return f"SELECT {columns} FROM {qualified(self.table)} ORDER BY {order} LIMIT 1"

    def _upto(self, values: tuple[bytes, ...]) -> str:
        """Key <= values, in the expanded form: a < x OR (a = x AND b <= y)."""
        terms = []
        last = len(self.key) - 1
        for i, column in enumerate(self.key):
            equal = [f"{quote(k.name)} = {k.literal(v)}"
                     for k, v in zip(self.key[:i], values[:i], strict=True)]
            op = "<=" if i == last else "<"
            terms.append(" AND ".join([*equal, f"{quote(column.name)} {op} "
                                                f"{column.literal(values[i])}"]))
        return " OR ".join(f"({t})" for t in terms)

    def key_text(self, row: bytes) -> tuple[bytes, ...]:
        """The key of a row as :mod:`rawrows` writes it, as the row's own JSON texts (a
        base64 text has no comma or quote, so the row splits on commas): what identifies a
        row when a dump merges changes in, without decoding it."""
        parts = row[1:-1].split(b",")
        return tuple(parts[k.position] for k in self.key)

    def full_sql(self) -> str:
        return f"SELECT {self.columns} FROM {qualified(self.table)}"

    def _after(self, values: tuple[bytes, ...]) -> str:
        terms = []
        for i, column in enumerate(self.key):
            equal = [f"{quote(k.name)} = {k.literal(v)}"
                     for k, v in zip(self.key[:i], values[:i], strict=True)]
            terms.append(" AND ".join([*equal, f"{quote(column.name)} > "
                                                f"{column.literal(values[i])}"]))
        return " OR ".join(f"({t})" for t in terms)

    def key_of(self, row: bytes) -> tuple[bytes, ...]:
        """The key values of a row as :mod:`rawrows` encodes it."""
        values = json.loads(row)
        return tuple(base64.b64decode(values[k.position]) for k in self.key)

    def read(self, conn: Any, after: tuple[bytes, ...] | None, chunk_rows: int,
             batch_rows: int) -> Iterator[rawrows.Line | ChunkEnd]:
        """The rows as insert lines (each with its row count and last row), each chunk
        followed by a :class:`ChunkEnd` with the key of its last row (an unchunked table is
        one chunk, with no key)."""
        if not self.chunked:
            yield from self.lines(conn, self.full_sql(), batch_rows)
            yield ChunkEnd(None)
            return
        while True:
            count = 0
            last: bytes | None = None
            for line in self.lines(conn, self.chunk_sql(after, chunk_rows), batch_rows):
                count += line[1]
                last = line[2]
                yield line
            if last is None:
                return
            after = self.key_of(last)
            yield ChunkEnd(after)
            if count < chunk_rows:
                return


def stored_lines(definition: TableDefinition, salt: bytes | None
                 ) -> Callable[[rawrows.Line], rawrows.Line] | None:
    """What turns insert lines read from the source into lines holding each hashed or
    masked column as stored (None: no column is); the same values the stream stores
    (:func:`cdcserver.core.capture.value_function` on the text protocol's bytes, which are
    the value's UTF-8 or, for binary data, the value)."""
    functions = [(i, _text_function(spec.rule, spec.type in BINARY_TYPES, salt))
                 for i, spec in enumerate(definition.columns) if spec.rule]
    if not functions:
        return None

    def stored(line: rawrows.Line) -> rawrows.Line:
        doc = json.loads(line[0])
        rows = doc["rows"]
        for row in rows:
            for i, function in functions:
                if row[i] is not None:
                    row[i] = base64.b64encode(function(base64.b64decode(row[i]))).decode()
        return (json.dumps(doc, separators=(",", ":")).encode() + b"\n", line[1],
                json.dumps(rows[-1], separators=(",", ":")).encode())
    return stored


def _text_function(rule: str, binary: bool, salt: bytes | None) -> Callable[[bytes], bytes]:
    function = value_function(rule, salt)
    if rule == HASH or binary:
        def of_bytes(raw: bytes) -> bytes:
            value = function(raw)
            return value.encode("ascii") if isinstance(value, str) else bytes(value)
        return of_bytes

    def of_text(raw: bytes) -> bytes:
        return str(function(raw.decode("utf-8", "surrogateescape"))).encode(
            "utf-8", "surrogateescape")
    return of_text


@dataclass(frozen=True)
class ChunkEnd:
    key: tuple[bytes, ...] | None


def _key_columns(definition: TableDefinition, fields: tuple[Field, ...]
                 ) -> tuple[KeyColumn, ...]:
    names = [f.column for f in fields]
    key = []
    for name in definition.primary_key:
        spec = definition.columns[definition.index(name)]
        kind = spec.type
        if kind not in _NUMERIC_KEY | _TEMPORAL_KEY | _STRING_KEY or spec.extended:
            return ()
        key.append(KeyColumn(spec.name, names.index(spec.name), kind,
                             spec.binary or kind in BINARY_TYPES))
    return tuple(key)
