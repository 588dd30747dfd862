"""An oracle that shares no code with the service: rebuild a table from its JSON stream and
compare it with ``SELECT`` on the source, value by value.

The stream is read over a raw socket (the login and the commands are written here, not taken
from ``client/``), each record is applied as a consumer would (``insert`` and ``update_after``
upsert the row, ``update_before`` and ``delete`` remove it; a version whose ``ddl`` says the
table was truncated, dropped or created empties it), and both sides are brought to one plain
form per MariaDB column type, decided from the source's own ``information_schema``:

- integers, ``YEAR``, ``BIT``: Python ``int``;
- ``DECIMAL``: the number (``12.50`` and ``12.5000`` are one value);
- ``FLOAT``: its 32-bit pattern; ``DOUBLE``: the float;
- character data, ``ENUM``, ``SET``, ``JSON``: the text;
- binary data and geometry: lowercase hex;
- temporal types, ``INET4``, ``INET6``, ``UUID``: MariaDB's text in a UTC session.

A version whose ``ddl`` names ``renamed_columns`` renames the columns of the rows held, as
an ALTER renames the table's.

A table without a primary key is compared as a multiset of rows.
"""

from __future__ import annotations

import asyncio
import decimal
import hashlib
import json
import re
import struct
from collections import Counter
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

MISSING = "<missing>"  # a column the stream never gave a value for (added later, no row since)


@dataclass
class Rebuilt:
    """A table as a consumer of the stream holds it."""

    key: tuple[str, ...]  # column names; () for a multiset of whole rows
    rows: dict[Any, dict[str, Any]] = field(default_factory=dict)
    bag: Counter[Any] = field(default_factory=Counter)
    records: list[dict[str, Any]] = field(default_factory=list)  # every record line read
    schemas: list[dict[str, Any]] = field(default_factory=list)  # every schema line read
    # What a consumer that audits before-images would find untrue, by kind: an
    # ``update_before``/``delete`` that is not the row held for its key (or of a key not
    # held), an ``insert`` of a key already held; "(repair)" when a repair record did it.
    inconsistencies: Counter[str] = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)  # the first few, for a report
    # The audit keys rows as the consumer does: by the primary key each version's schema
    # names (a system-versioned table's has ``row_end``), not by the table's key today.
    audit_key: tuple[str, ...] = ()
    audited: dict[Any, dict[str, Any]] = field(default_factory=dict)

    def keyed_by(self, key: tuple[str, ...]) -> None:
        """A version whose schema names ``key``: the rows audited are keyed anew."""
        if key and key != self.audit_key:
            self.audit_key = key
            self.audited = {tuple(_hashable(row.get(c)) for c in key): row
                            for row in self.audited.values()}

    def apply(self, columns: dict[str, str], record: dict[str, Any]) -> None:
        self.records.append(record)
        row = {column: record[name] for name, column in columns.items() if name in record}
        upsert = record["event_type"] in ("insert", "update_after")
        if self.key:
            # A key column the record's version did not have yet is NULL in a consumer's
            # table (it added the column): records of later versions find the row by it.
            key = tuple(_hashable(row.get(c)) for c in self.key)
            self._audit(record, row)
            if upsert:
                self.rows[key] = row
            else:
                self.rows.pop(key, None)
            return
        frozen = tuple(sorted((k, _hashable(v)) for k, v in row.items()))
        if upsert:
            self.bag[frozen] += 1
        elif self.bag[frozen] > 0:
            self.bag[frozen] -= 1
            if not self.bag[frozen]:
                del self.bag[frozen]

    def _audit(self, record: dict[str, Any], row: dict[str, Any]) -> None:
        event = record["event_type"]
        key: Any = tuple(_hashable(row.get(c)) for c in self.audit_key or self.key)
        held = self.audited.get(key)
        if event in ("insert", "update_after"):
            self.audited[key] = row
        else:
            self.audited.pop(key, None)
        kind = ""
        if event == "insert" and held is not None:
            kind = "insert of a held key"
        elif event in ("update_before", "delete") and held is None:
            kind = f"{event} of a key not held"
        elif event in ("update_before", "delete") and held is not None:
            changed = [c for c in row if c in held and _hashable(row[c]) != _hashable(held[c])]
            if changed:
                kind = f"{event} differs"
                key = (key, {c: (held[c], row[c]) for c in changed})
        if kind:
            kind += " (repair)" if "cdc:repair" in record else ""
            self.inconsistencies[kind] += 1
            if self.inconsistencies[kind] <= 3:  # the first few of each kind
                self.examples.append(f"{kind} at {record.get('domain')}-"
                                     f"{record.get('server_id')}-{record.get('sequence')}: "
                                     f"{key}")

    def clear(self) -> None:
        self.rows.clear()
        self.bag.clear()
        self.audited.clear()

    def rename_columns(self, renamed: dict[str, str]) -> None:
        """An ALTER renamed columns (all at once: a swap is two renames): the rows held keep
        their values under the new names, as the table's do."""
        for key, row in self.rows.items():
            self.rows[key] = {renamed.get(c, c): v for c, v in row.items()}
        for key, row in self.audited.items():
            self.audited[key] = {renamed.get(c, c): v for c, v in row.items()}
        self.audit_key = tuple(renamed.get(c, c) for c in self.audit_key)
        self.bag = Counter({tuple(sorted((renamed.get(c, c), v) for c, v in frozen)): n
                            for frozen, n in self.bag.items()})


def _hashable(value: Any) -> Any:
    return json.dumps(value, sort_keys=True, default=str) if isinstance(value, (dict, list)) \
        else value


def auth_message(user: str, password: str) -> bytes:
    return (user + ":").encode().hex().encode() + hashlib.sha1(password.encode()).hexdigest(
    ).encode()


async def read_stream(port: int, table: str, *, user: str, password: str,
                      quiet: float = 1.0, first_line_timeout: float = 30.0,
                      request: str | None = None, until: str | None = None,
                      host: str = "127.0.0.1") -> list[dict[str, Any]]:
    """Every JSON line of ``REQUEST-DATA table`` until the server has been quiet for
    ``quiet`` seconds (call it once the service has stored what the test wrote).

    With ``until`` (a GTID state the service has stored), the read is bounded instead
    (``REQUEST-DATA table UNTIL state``): every line up to the server's end line, however
    long the server pauses (a busy machine paused one soak's stream for longer than its
    quiet time, and the chain of renames it walked lost a table's past); a stream that ends
    without its end line was cut, and fails. The end line is not returned."""
    reader, writer = await asyncio.open_connection(host, port, limit=1 << 26)
    try:
        writer.write(auth_message(user, password))
        answer = await reader.readline()
        assert answer == b"OK\n", f"{table}: the login was answered {answer!r}"
        writer.write(b"REGISTER UUID=oracle, TYPE=JSON, DIALECT=EXACT\n")
        answer = await reader.readline()
        assert answer == b"OK\n", f"{table}: REGISTER was answered {answer!r}"
        if until is not None:
            request = f"REQUEST-DATA {table} UNTIL {until}"
        writer.write(f"{request or 'REQUEST-DATA ' + table}\n".encode())
        lines = []
        timeout = first_line_timeout
        while True:
            try:
                line = await asyncio.wait_for(reader.readline(), timeout)
            except TimeoutError:
                if until is not None:
                    raise AssertionError(f"{table}: no line for {timeout} s before the end "
                                         f"of a bounded read") from None
                return lines
            if not line:
                if until is not None:
                    if not lines or "end" not in lines[-1]:
                        raise AssertionError(f"{table}: the bounded read ended without its "
                                             f"end line (cut)")
                    lines.pop()
                return lines
            if line.startswith(b"ERR"):
                raise AssertionError(f"the server answered {line!r}")
            lines.append(json.loads(line, parse_float=decimal.Decimal))
            timeout = quiet if until is None else first_line_timeout
    finally:
        writer.close()


def rebuild(lines: list[dict[str, Any]], key: tuple[str, ...],
            others: dict[str, list[dict[str, Any]]] | None = None,
            until: tuple[str, str] | None = None,
            _done: dict[tuple[str, str, str], Rebuilt] | None = None) -> Rebuilt:
    """Apply a table's stream. A version created by a rename starts from the renamed table's
    rows as they were then: its stream, from ``others`` (by ``db.table``), up to the version
    ``until`` (the new name and the rename's GTID) that says it was renamed away. Each such
    origin is rebuilt once (tables swapped back and forth name each other's pasts again and
    again: without that, the work would double with every swap), and the chain of origins is
    walked with a stack of its own, not Python's (a soak swaps a table thousands of times)."""
    done = {} if _done is None else _done
    stack = [_rebuilding(lines, key, others, until, done)]
    result: Rebuilt | None = None
    while stack:
        try:
            wanted = stack[-1].send(result) if result is not None else next(stack[-1])
        except StopIteration as finished:
            stack.pop()
            result = finished.value
            continue
        result = None
        stack.append(_rebuilding(*wanted, done))
    assert result is not None
    return result


_Wanted = tuple[list[dict[str, Any]], tuple[str, ...], "dict[str, list[dict[str, Any]]] | None",
                tuple[str, str]]


def _rebuilding(lines: list[dict[str, Any]], key: tuple[str, ...],
                others: dict[str, list[dict[str, Any]]] | None,
                until: tuple[str, str] | None,
                done: dict[tuple[str, str, str], Rebuilt]
                ) -> Generator[_Wanted, Rebuilt, Rebuilt]:
    """:func:`rebuild` of one table, yielding each origin it needs rebuilt (and given)."""
    table = Rebuilt(key)
    columns: dict[str, str] = {}
    for line in lines:
        if "fields" in line:
            ddl = line.get("ddl") or {}
            if until is not None and ddl.get("renamed_to") == until[0] and \
                    line.get("gtid") == until[1]:
                return table
            table.schemas.append(line)
            columns = {f["name"]: f.get("column", f["name"]) for f in line["fields"][6:]}
            if ddl.get("kind") in ("truncate", "drop", "create"):
                table.clear()
            table.rename_columns(ddl.get("renamed_columns") or {})
            table.keyed_by(tuple(line.get("primary_key") or ()))
            origin = ddl.get("renamed_from") if ddl.get("kind") == "create" else None
            if origin and others is not None and origin in others:
                name = f"{line['database']}.{line['table']}"
                mark = (origin, name, str(line.get("gtid")))
                before = done.get(mark)
                if before is None:
                    before = done[mark] = yield (others[origin], key, others,
                                                 (name, line.get("gtid")))
                table.rows.update(before.rows)
                table.bag.update(before.bag)
                table.audited.update({tuple(_hashable(r.get(c)) for c in table.audit_key): r
                                      for r in before.audited.values()})
            continue
        table.apply(columns, line)
    return table


READS_AT_ONCE = 16  # the streams :func:`read_renamed` reads at once


def _quoted(name: str) -> str:
    """A name as the protocol takes any name: a JSON string (every character not ASCII
    escaped), so that a dot, a backquote or a line break in it is the name's."""
    return json.dumps(name)


async def read_renamed(port: int, database: str, table: str, *, user: str, password: str,
                       quiet: float = 1.0, cache: dict[str, list[dict[str, Any]]] | None = None,
                       until: str | None = None
                       ) -> tuple[list[dict[str, Any]], dict[str, list[dict[str, Any]]]]:
    """The table's stream, and the streams of every table its rows came from by renames.
    The tables of one step back along the renames are read at once; ``cache`` keeps streams
    between calls (tables of one database share their history: give one dict to each).
    ``until``: each read bounded by that GTID state (:func:`read_stream`)."""
    name = f"{_quoted(database)}.{_quoted(table)}"
    streams = {} if cache is None else cache
    # A few at a time: a table renamed hundreds of times (the soak's migrations) had as many
    # connections logging in at once, and the listener rightly refused one address's 33rd
    # (``ERR TOO-MANY-CONNECTIONS``) while more than half its connections were in use
    at_once = asyncio.Semaphore(READS_AT_ONCE)

    async def read(current: str) -> list[dict[str, Any]]:
        try:
            async with at_once:
                return await read_stream(port, current, user=user, password=password,
                                         quiet=quiet, until=until,
                                         first_line_timeout=120.0 if until else 30.0)
        except AssertionError as exc:
            if current == name or not re.search(r"ERR NO-FILE File '.*' not found", str(exc)):
                raise  # (a cut stream, a name refused, any other refusal: never no table)
            return []  # a table the service never stored

    wanted = {name}
    while wanted := {t for t in wanted if t not in streams}:
        batch = sorted(wanted)
        for current, lines in zip(batch, await asyncio.gather(*map(read, batch)), strict=True):
            streams[current] = lines
        wanted = {line["ddl"]["renamed_from"] for current in batch for line in streams[current]
                  if "fields" in line and (line.get("ddl") or {}).get("renamed_from")}
    return streams[name], streams


# -- the source side ---------------------------------------------------------------------

_INTEGERS = {"tinyint", "smallint", "mediumint", "int", "bigint", "year"}
_TEXT = {"char", "varchar", "tinytext", "text", "mediumtext", "longtext", "enum", "set", "json"}
_BINARY = {"binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob", "geometry",
           "point", "linestring", "polygon", "multipoint", "multilinestring", "multipolygon",
           "geometrycollection", "geomcollection"}


def _select_expression(column: str, data_type: str) -> str:
    quoted = "`" + column.replace("`", "``") + "`"
    if data_type in _INTEGERS or data_type == "double":
        return quoted
    if data_type == "bit":
        return f"CAST({quoted} AS UNSIGNED)"
    if data_type == "float":
        return f"CAST({quoted} AS DOUBLE)"
    if data_type in _TEXT:
        return f"CONVERT({quoted} USING utf8mb4)"
    if data_type in _BINARY:
        return f"LOWER(HEX({quoted}))"
    return f"CAST({quoted} AS CHAR)"  # decimal, temporal, inet4, inet6, uuid


def canonical(data_type: str, value: Any) -> Any:
    """One value in the plain form both sides are compared in."""
    if value is None or value == MISSING:
        return value
    if data_type in _INTEGERS or data_type == "bit":
        return int(value)
    if data_type == "float":
        return struct.pack("<f", float(value))
    if data_type == "double":
        return float(value)
    if data_type == "decimal":
        # the number: a row sent before a widening (DECIMAL(5,2) to (10,4)) has fewer
        # digits after the point than the table shows now, and the same value
        return decimal.Decimal(str(value)).normalize()
    if data_type == "timestamp" and isinstance(value, str) and value.endswith("+00:00"):
        return value[: -len("+00:00")]
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8")
    return value


def _canonical_or_as_is(data_type: str, value: Any) -> Any:
    """A stream's value in canonical form; one that cannot be of the column's type (text in
    an INT column: a row the stream kept in a column's old type) as it is, so that the
    comparison reports that row as different instead of the oracle failing on it."""
    try:
        return canonical(data_type, value)
    except (ValueError, TypeError, ArithmeticError, struct.error):
        return ("not a", data_type, value)


def column_types(conn: Any, database: str, table: str) -> dict[str, str]:
    with conn.cursor() as cur:
        cur.execute("SELECT COLUMN_NAME, DATA_TYPE FROM information_schema.COLUMNS "
                    "WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s ORDER BY ORDINAL_POSITION",
                    (database, table))
        return {str(name): str(kind).lower() for name, kind in cur.fetchall()}


def null_by_default(conn: Any, database: str, table: str) -> set[str]:
    """The columns a consumer holds NULL in for a row the stream gave before the column was
    added: nullable, with no default (any other default is a value the stream never sent)."""
    with conn.cursor() as cur:
        cur.execute("SELECT COLUMN_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = %s"
                    " AND TABLE_NAME = %s AND IS_NULLABLE = 'YES' AND (COLUMN_DEFAULT IS NULL"
                    " OR COLUMN_DEFAULT = 'NULL')", (database, table))
        return {str(row[0]) for row in cur.fetchall()}


def primary_key(conn: Any, database: str, table: str) -> tuple[str, ...]:
    with conn.cursor() as cur:
        cur.execute("SELECT COLUMN_NAME FROM information_schema.STATISTICS WHERE "
                    "TABLE_SCHEMA = %s AND TABLE_NAME = %s AND INDEX_NAME = 'PRIMARY' "
                    "ORDER BY SEQ_IN_INDEX", (database, table))
        return tuple(str(row[0]) for row in cur.fetchall())


def source_rows(conn: Any, database: str, table: str, types: dict[str, str], *,
                from_clause: str | None = None,
                expressions: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """The table's rows on the source, each value in its canonical form; ``expressions``
    selects a column as an SQL expression of the row instead (a mask, in SQL)."""
    given = expressions or {}
    exprs = ", ".join(given.get(c) or _select_expression(c, t) for c, t in types.items())
    source = from_clause or f"`{database}`.`{table}`"
    with conn.cursor() as cur:
        cur.execute("SET time_zone = '+00:00'")
        cur.execute(f"SELECT {exprs} FROM {source}")
        return [{c: canonical(t, v) for (c, t), v in zip(types.items(), row, strict=True)}
                for row in cur.fetchall()]


# -- the comparison ----------------------------------------------------------------------

@dataclass
class Comparison:
    missing: list[Any] = field(default_factory=list)  # in the table, not the stream
    extra: list[Any] = field(default_factory=list)  # in the stream, not the table
    different: list[tuple[Any, dict[str, Any], dict[str, Any]]] = field(default_factory=list)

    @property
    def equal(self) -> bool:
        return not (self.missing or self.extra or self.different)

    def __str__(self) -> str:
        parts = []
        if self.missing:
            parts.append(f"{len(self.missing)} rows missing from the stream: {self.missing[:5]}")
        if self.extra:
            parts.append(f"{len(self.extra)} rows only in the stream: {self.extra[:5]}")
        for key, table_row, stream_row in self.different[:5]:
            diff = {c: (table_row[c], stream_row.get(c, MISSING)) for c in table_row
                    if table_row[c] != stream_row.get(c, MISSING)}
            parts.append(f"key {key}: (table, stream) {diff}")
        return "; ".join(parts) or "equal"


def compare(stream: Rebuilt, table_rows: list[dict[str, Any]], types: dict[str, str],
            null_when_absent: set[str] | frozenset[str] = frozenset()) -> Comparison:
    result = Comparison()

    def from_stream(row: dict[str, Any]) -> dict[str, Any]:
        return {c: _canonical_or_as_is(t, row.get(c, None if c in null_when_absent else
                                                  MISSING))
                for c, t in types.items()}

    if stream.key:
        ours = {}
        for row in stream.rows.values():
            canon = from_stream(row)
            ours[tuple(_hashable(canon[c]) for c in stream.key)] = canon
        theirs = {tuple(_hashable(r[c]) for c in stream.key): r for r in table_rows}
        for key, row in theirs.items():
            mine = ours.get(key)
            if mine is None:
                result.missing.append(key)
            elif mine != row:
                result.different.append((key, row, mine))
        result.extra = [key for key in ours if key not in theirs]
        return result
    mine_bag = Counter(tuple(sorted((c, _hashable(v)) for c, v in from_stream(dict(r)).items()))
                       for r, n in stream.bag.items() for _ in range(n))
    theirs = Counter(tuple(sorted((c, _hashable(v)) for c, v in row.items()))
                     for row in table_rows)
    result.missing = list((theirs - mine_bag).elements())
    result.extra = list((mine_bag - theirs).elements())
    return result


async def assert_stream_equals_table(port: int, conn: Any, database: str, table: str, *,
                                     user: str, password: str, key: tuple[str, ...] | None = None,
                                     extra_columns: dict[str, str] | None = None,
                                     from_clause: str | None = None,
                                     quiet: float = 1.0,
                                     masked: dict[str, str] | None = None,
                                     excluded: tuple[str, ...] = (),
                                     bounded: bool = True) -> Rebuilt:
    """Rebuild ``database.table`` from its JSON stream and assert it equals the table.
    ``extra_columns`` adds columns ``information_schema`` does not list (a system-versioned
    table's ``row_start``/``row_end``), ``from_clause`` reads another row set (``FOR
    SYSTEM_TIME ALL``). ``masked`` compares columns with an SQL expression of the source's
    row (``SHA2(CONCAT('salt', email), 256)``), as text; ``excluded`` columns are not
    compared, and the stream must not hold them.

    The stream is read up to what ``conn``'s server has logged (``UNTIL`` its
    ``@@gtid_binlog_pos``: the service waits until it has stored it, then ends the read),
    not until it has been quiet for ``quiet`` seconds: a loaded machine pauses a stream for
    longer than that, and a read that took the pause for its end saw a table short of its
    last changes. ``bounded=False`` reads until quiet (a service that does not read
    ``conn``'s server, or a test of the unbounded read)."""
    types = column_types(conn, database, table)
    types.update(extra_columns or {})
    for column in excluded:
        del types[column]
    for column, expression in (masked or {}).items():
        types[column] = "text"
        masked = {**(masked or {}), column: f"CONVERT({expression} USING utf8mb4)"}
    names = primary_key(conn, database, table) if key is None else key
    until = logged_state(conn) if bounded else None
    lines, others = await read_renamed(port, database, table, user=user, password=password,
                                       quiet=quiet, until=until)
    rebuilt = rebuild(lines, names, others)
    table_rows = await asyncio.to_thread(source_rows, conn, database, table, types,
                                         from_clause=from_clause, expressions=masked)
    leaked = [c for c in excluded for record in rebuilt.records if c in record]
    assert not leaked, f"{database}.{table}: excluded columns in the stream: {leaked[:5]}"
    comparison = compare(rebuilt, table_rows, types,
                         await asyncio.to_thread(null_by_default, conn, database, table))
    assert comparison.equal, f"{database}.{table}: {comparison}"
    return rebuilt


def logged_state(conn: Any) -> str | None:
    """The GTID state ``conn``'s server has logged (None: none yet)."""
    with conn.cursor() as cur:
        cur.execute("SELECT @@GLOBAL.gtid_binlog_pos")
        (state,) = cur.fetchone()
    return str(state) or None


async def assert_each_change_once(port: int, conn: Any, database: str, table: str, *,
                                  user: str, password: str, label: str = "") -> Rebuilt:
    """:func:`assert_stream_equals_table`, and no change streamed twice (by its GTID and
    event number) and no before-image untrue: what a fault test asks after the fault."""
    rebuilt = await assert_stream_equals_table(port, conn, database, table, user=user,
                                               password=password)
    seen = Counter((r["domain"], r["server_id"], r["sequence"], r["event_number"])
                   for r in rebuilt.records)
    twice = [k for k, n in seen.items() if n > 1]
    assert not twice, f"{label}{database}.{table}: changes streamed twice: {twice[:5]}"
    assert not rebuilt.inconsistencies, f"{label}{database}.{table}: {rebuilt.examples}"
    return rebuilt
