"""Stored Avro blocks straight into Arrow record batches: for the Spark source's executors,
and for any reader of ranges that wants pyarrow, pandas, Polars or DuckDB
(:func:`read_arrow`, :func:`follow_arrow`).

A batch has a target Arrow schema: a version's own (:func:`version_schema`, each column as
the type table says), or a Spark query's, which may widen a column for all the versions it
reads (``client/spark/arrow.py``).

A chunk of blocks is decoded (by cavro, or fastavro) against the version's schema stripped
of its logical types, so values come out as Avro stores them: days, microseconds, unscaled
decimals as bytes, text as UTF-8 bytes. Each Arrow column is then built from one list in one
call (dates, timestamps and TIME durations take the integers as they are; decimals are
assembled into 128-bit buffers; text is checked as UTF-8 a column at a time), and Spark takes
the batch without looking at a single row again. That is what lets a partition run at the
speed of the decoder instead of the per-row path of Python data sources.

That Python path makes a dict per record and a Python object per value, which is most of an
executor's time. Where the compiled decoder (``_avroarrow.pyx``) is built, it reads the blocks
straight into the Arrow buffers of the same arrays instead, and hands back to the Python path
any chunk (or version) where the two could differ, so both give the same batches and the same
errors. ``CDC_PURE_PYTHON`` set in the executors' environment keeps them on the Python path.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import time
from collections.abc import Callable, Iterator
from decimal import Decimal
from functools import reduce
from typing import Any, cast

import fastavro

from mariadb_cdc_client.format.extras import MissingExtra

try:
    import pyarrow as pa
    import pyarrow.compute as pc
except ModuleNotFoundError as exc:  # say which extra brings it
    raise MissingExtra("mariadb_cdc_client.arrow (read_arrow)", "arrow", "pyarrow") from exc

from mariadb_cdc_client.format.avro import (
    SYNC_SIZE,
    AvroFormatError,
    Header,
    block_at,
    container_header,
    decompress,
    write_varint,
)
from mariadb_cdc_client.format.coltypes import KINDS
from mariadb_cdc_client.format.compiled import compiled_module
from mariadb_cdc_client.format.dump import DumpHeader, DumpRows
from mariadb_cdc_client.format.names import Table, TableRef, as_table
from mariadb_cdc_client.format.schema import Field, Kind, fields_from_schema, parse_time
from mariadb_cdc_client.format.wire import Format, RangeQuery
from mariadb_cdc_client.ranges import Blocks, Position, Schema, Trim, gtid_parts, read_blocks
from mariadb_cdc_client.sync import SyncCdcClient, SyncCdcConnection

# the compiled decoder (client/spark/_avroarrow.pyx): the same batches, several times faster
_avroarrow = compiled_module("mariadb_cdc_client.spark._avroarrow")  # needs no pyspark

Records = list[dict[str, Any]]
Values = tuple[Any, ...]  # one column's values
Column = Callable[[Values], pa.Array]

_DATES = (Kind.DATE, Kind.DATETIME, Kind.TIMESTAMP)  # a string branch: zero dates


MAX_DECIMAL = 38  # the widest decimal128 (and Spark's widest decimal)


class ZeroDateError(ValueError):
    pass


def invalid_date(text: str, zero_dates: str) -> None:
    """A date Arrow (and Spark) cannot hold: None with zero_dates "null", else ZeroDateError."""
    if zero_dates == "null":
        return None
    raise ZeroDateError(f"{text!r} is not a valid date (MariaDB's zero or partial date); "
                        "Spark and Arrow cannot hold it. Set the option zeroDates=null (Spark) "
                        "or zero_dates='null' to read such values as null")


def arrow_type(field: Field) -> pa.DataType:
    """The Arrow type of a stored field's values (the type table's, with a decimal's digits:
    BIGINT UNSIGNED and BIT(64) as ``decimal128(20, 0)``, a DECIMAL over 38 digits as its
    exact text)."""
    if field.kind == Kind.DECIMAL:
        if field.precision == 0:
            return pa.decimal128(20, 0)
        if field.precision > MAX_DECIMAL:
            return pa.string()
        return pa.decimal128(field.precision, field.scale)
    return _ARROW[field.kind]


_ARROW: dict[Kind, pa.DataType] = {
    Kind.BOOLEAN: pa.bool_(), Kind.INT: pa.int32(), Kind.LONG: pa.int64(),
    Kind.FLOAT: pa.float32(), Kind.DOUBLE: pa.float64(), Kind.STRING: pa.string(),
    Kind.BYTES: pa.binary(), Kind.UUID: pa.string(), Kind.DATE: pa.date32(),
    Kind.DATETIME: pa.timestamp("us"), Kind.TIMESTAMP: pa.timestamp("us", tz="UTC"),
    Kind.TIME: pa.duration("us"), Kind.ENUM: pa.string(), Kind.NULL: pa.null(),
}
assert all(str(_ARROW[k]) == form.arrow for k, form in KINDS.items() if k != Kind.DECIMAL)

AVSC_KEY = b"cdc.avsc"  # the schema metadata of a version's batches: its .avsc document


# (a column of the table with one of these names has a _ appended in the store: no clash)
_GTID_TYPES = {"domain": pa.uint32(), "server_id": pa.uint32(), "sequence": pa.uint64()}


def version_schema(avsc: dict[str, Any]) -> pa.Schema:
    """The Arrow schema of a version's records: its fields in order (the metadata fields
    not null, the GTID's numbers unsigned as MariaDB's are), with the version's ``.avsc``
    in the schema's metadata (``cdc.avsc``)."""
    fields = [pa.field(f.name, _GTID_TYPES.get(f.name) or arrow_type(f), nullable=f.nullable)
              for f in fields_from_schema(avsc)]
    return pa.schema(fields, metadata={AVSC_KEY: json.dumps(avsc)})


ZERO_DATES = ("error", "null")


def _check_zero_dates(zero_dates: str) -> None:
    if zero_dates not in ZERO_DATES:
        raise ValueError(f"zero_dates: {zero_dates!r} (expected 'error' or 'null')")


def read_arrow(client: SyncCdcClient, table: Table, *, after: str | None = None,
               until: str | None = None, zero_dates: str = "error") -> ArrowRange:
    """The changes of ``table`` in the transactions after the GTID state ``after`` (from
    the first stored without it) up to ``until`` (what the service has stored now, without
    it), as pyarrow record batches: a bounded read in AVRO mode on a connection of
    ``client``'s, decoded into Arrow buffers in C. Iterate the result for its batches; its
    ``end`` is where to read on from. ``zero_dates``: ``error`` (a MariaDB zero date
    raises) or ``null``."""
    if until is None:
        conn = client.connect()
        try:
            until = str(conn.query("QUERY-STATE")["gtid_state"])
        finally:
            conn.close()
    return ArrowRange(_avro_connection(client), as_table(table), after or "", until,
                      zero_dates)


def follow_arrow(client: SyncCdcClient, table: Table, *, after: str | None = None,
                 poll: float = 1.0, idle_timeout: float | None = None,
                 zero_dates: str = "error") -> Iterator[ArrowRange]:
    """The changes of ``table`` after the GTID state ``after`` (from the first stored
    without it) as they are stored, in ranges: each holds at least one record of the table,
    and starts where the one before ended. Save a range's ``end`` once its batches are
    used: following again from it continues exactly after them. Asks the service what is
    new every ``poll`` seconds; with ``idle_timeout``, ends once nothing new came for that
    long. A failure (the service gone, a refused table) ends it with the error."""
    ref = as_table(table)
    position = after or ""
    new_at = time.monotonic()
    conn = client.connect()
    try:
        while True:
            reply = conn.query(RangeQuery(ref.database, ref.table, position, _NO_LIMIT).line())
            end = str(reply["end"])
            if reply["events"]:
                yield ArrowRange(_avro_connection(client), ref, position, end, zero_dates)
                new_at = time.monotonic()
            elif idle_timeout is not None and time.monotonic() - new_at >= idle_timeout:
                return
            position = end or position  # past the other tables' transactions, too
            time.sleep(poll)
    finally:
        conn.close()


_NO_LIMIT = 1 << 62  # a range of every record stored: a transaction is never cut


class ArrowDump:
    """A table's dump (its newest, or one by name) as Arrow record batches of its version's
    schema (:func:`version_schema`): ``insert`` records, and for a resumed dump the
    ``update_before``/``update_after``/``delete`` records after them, stamped with the dump's
    GTID (its first domain's) and creation time, numbered in the dump's order. ``header`` is
    the dump's (its ``gtid``: read the changes after it with ``read_arrow(client, table,
    after=dump.header.gtid)``). Iterate once."""

    def __init__(self, client: SyncCdcClient, target: Table, zero_dates: str = "error",
                 batch_rows: int = 65_536) -> None:
        _check_zero_dates(zero_dates)
        self._items = client.dump(target, follow=False)
        header = next(self._items)
        assert isinstance(header, DumpHeader), "a dump starts with its header"
        self.header = header
        self.schema = version_schema(header.schema)
        self.zero_dates, self.batch_rows = zero_dates, batch_rows
        self._stamp = dump_stamp(header)
        self._columns = header.columns  # after the metadata fields
        self._numbered = 0  # the records made into batches so far

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        records: list[tuple[dict[str, Any], str]] = []
        for item in self._items:
            if isinstance(item, DumpRows):
                records += _dump_records(item)
                while len(records) >= self.batch_rows:
                    yield self._batch(records[:self.batch_rows])
                    records = records[self.batch_rows:]
        if records:
            yield self._batch(records)

    def _batch(self, records: list[tuple[dict[str, Any], str]]) -> pa.RecordBatch:
        count, first = len(records), self._numbered + 1
        self._numbered += count
        domain, server_id, sequence, created = self._stamp
        types = self.schema.types
        arrays = [pa.repeat(pa.scalar(domain, types[0]), count),
                  pa.repeat(pa.scalar(server_id, types[1]), count),
                  pa.repeat(pa.scalar(sequence, types[2]), count),
                  pa.array(range(first, first + count), types[3]),
                  pa.repeat(pa.scalar(created, types[4]), count),
                  pa.array([event_type for _, event_type in records], types[5])]
        for field, arrow_type in zip(self._columns, types[6:], strict=True):
            arrays.append(pa.array([_dump_value(row.get(field.column), field, self.zero_dates)
                                    for row, _ in records], arrow_type))
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)


def read_dump_arrow(client: SyncCdcClient, target: Table, *, zero_dates: str = "error",
                    batch_rows: int = 65_536) -> ArrowDump:
    """A table's newest dump (or the dump ``target`` names) as Arrow record batches: see
    :class:`ArrowDump`. The dump's header is read here; its rows as the result is
    iterated."""
    return ArrowDump(client, target, zero_dates, batch_rows)


def dump_stamp(header: DumpHeader) -> tuple[int, int, int, int]:
    """(domain, server_id, sequence, timestamp) of a dump's records: its GTID (the first
    domain's) and its creation time."""
    domain, server_id, sequence = gtid_parts(header.gtid.split(",")[0])
    return domain, server_id, sequence, int(dt.datetime.fromisoformat(header.created).timestamp())


def dump_event_types(action: str, count: int) -> list[str]:
    """The event types of a dump operation's ``count`` rows (an update's rows are pairs)."""
    if action == "update":
        return ["update_before", "update_after"] * (count // 2)
    return [action] * count


def _dump_records(item: DumpRows) -> list[tuple[dict[str, Any], str]]:
    """A dump operation's rows with the event type of each."""
    return list(zip(item.rows, dump_event_types(item.action, len(item.rows)), strict=True))


def _dump_value(value: Any, field: Field, zero_dates: str) -> Any:
    """A dump row's typed value as Arrow takes it for the field's type."""
    if value is None:
        return None
    if field.kind == Kind.UUID:
        return str(value)
    if field.kind in _DATES and isinstance(value, str):
        return invalid_date(value, zero_dates)
    if field.kind == Kind.DECIMAL and field.precision > MAX_DECIMAL:
        return format(value, "f")  # exact text: Arrow has no decimal this wide
    return value


def _avro_connection(client: SyncCdcClient) -> Callable[[], SyncCdcConnection]:
    """Opens a ``TYPE=AVRO`` connection to ``client``'s service, as ``client`` logs in."""
    def connect() -> SyncCdcConnection:
        return SyncCdcConnection.open(client.host, client.port, client.user, client.password,
                                      format=Format.AVRO, ssl=client.ssl,
                                      timeout=client.timeout, auth=client.auth)
    return connect


class ArrowRange:
    """The records of one table's transactions after ``after`` up to ``end`` (GTID states),
    as Arrow record batches of each version's schema (:func:`version_schema`), in commit
    order. Iterating reads the range (a bounded read over one connection); every iteration
    gives the same batches while retention keeps the versions. ``end`` is where the next
    range starts: ``read_arrow(client, table, after=previous.end)``."""

    def __init__(self, connect: Callable[[], SyncCdcConnection], table: TableRef, after: str,
                 end: str, zero_dates: str = "error") -> None:
        _check_zero_dates(zero_dates)
        self.table, self.after, self.end = table, after, end
        self.zero_dates = zero_dates
        self._connect = connect

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        def maker(avsc: dict[str, Any], header: Header) -> BatchMaker:
            return BatchMaker(version_schema(avsc), avsc, header, self.zero_dates)

        conn = self._connect()
        try:
            yield from read_batches(conn, (self.table.database, self.table.table),
                                    Position(self.after), Position(self.end), maker)
        finally:
            conn.close()

    def read_all(self) -> list[pa.Table]:
        """The range as one table per schema version it holds (a schema change starts a
        new one), in order."""
        tables: list[pa.Table] = []
        batches: list[pa.RecordBatch] = []
        for batch in self:
            if batches and not batch.schema.equals(batches[0].schema, check_metadata=True):
                tables.append(pa.Table.from_batches(batches))
                batches = []
            batches.append(batch)
        if batches:
            tables.append(pa.Table.from_batches(batches))
        return tables


def read_batches(conn: SyncCdcConnection, table: tuple[str, str], start: Position,
                 end: Position, maker: Callable[[dict[str, Any], Header], BatchMaker]
                 ) -> Iterator[pa.RecordBatch]:
    """The record batches of a range's records (:func:`mariadb_cdc_client.ranges.read_blocks`
    on a ``TYPE=AVRO`` connection, the records of its two cut transactions that lie outside
    it dropped), each version's made by the maker ``maker(avsc, header)`` gives."""
    trim = Trim.of(start, end)
    makers: dict[int, BatchMaker] = {}
    make: BatchMaker | None = None
    for item in read_blocks(conn, table, start, end):
        if isinstance(item, Schema):
            version = int(item.avsc["version"])
            if version not in makers:
                makers[version] = maker(item.avsc, item.header)
            make = makers[version]
            continue
        assert make is not None, "blocks arrived before their schema"
        batch = make(item, trim)
        if batch is not None:
            yield batch


def plain_reader_schema(schema: Any) -> Any:
    """An Avro type with every ``logicalType`` removed and ``string`` read as ``bytes``: the
    same binary encoding, decoded to the plain values underneath and without building a
    Python string per value (Arrow checks the UTF-8 of a whole column at once)."""
    if schema == "string":
        return "bytes"
    if isinstance(schema, list):
        return [plain_reader_schema(branch) for branch in schema]
    if not isinstance(schema, dict):
        return schema
    plain = {k: v for k, v in schema.items() if k != "logicalType"}
    if plain.get("type") == "record":
        plain["fields"] = [{**f, "type": plain_reader_schema(f["type"])}
                           for f in plain["fields"]]
    elif plain.get("type") not in ("enum", "fixed"):
        plain["type"] = plain_reader_schema(plain["type"])
    return plain


class BatchMaker:
    """Turns chunks of one version's blocks into record batches of ``arrow_schema``: its
    columns by name from the stored fields, ``constants`` (by column name) repeated, any
    other column null."""

    def __init__(self, arrow_schema: pa.Schema, avsc: dict[str, Any], header: Header,
                 zero_dates: str, constants: dict[str, Any] | None = None) -> None:
        self.arrow_schema = arrow_schema
        # decoders differ in the codecs they know: blocks are decompressed here instead
        self._header = container_header(json.dumps(plain_reader_schema(avsc)), "null",
                                        header.sync)
        self._codec, self._sync = header.codec, header.sync
        by_name = {f.name: f for f in fields_from_schema(avsc)}
        self._read = [f.name for f in by_name.values()]  # the stored fields, in order
        self._columns: list[tuple[int | None, Column]] = []  # (stored field, builder)
        self._fixes: list[tuple[int, Callable[[pa.Array], pa.Array]]] = []  # (column, fix)
        decoded: dict[str, pa.DataType] = {}  # each stored field's type as decoded
        for n, target in enumerate(arrow_schema):
            field = by_name.get(target.name)
            if constants and target.name in constants:
                self._columns.append((None, _constant(constants[target.name], target.type)))
            elif field is None:
                self._columns.append((None, _nulls(target.type)))
            else:
                decoded[field.name] = _SIGNED.get(target.type, target.type)
                self._columns.append((self._read.index(field.name),
                                      _column(field, decoded[field.name], zero_dates)))
                fix = _unsigned_fix(field, target.type)
                if fix is not None:
                    self._fixes.append((n, fix))
        self._compiled = compiled_decoder(avsc, decoded, zero_dates)

    def __call__(self, blocks: Blocks, trim: Trim) -> pa.RecordBatch | None:
        data = self._plain(blocks.data)
        stored = None if self._compiled is None else self._compiled.decode(data, self._sync)
        if stored is None:  # no compiled decoder, or it leaves this chunk to the Python path
            return self._python_batch(data, trim)
        return self._compiled_batch(stored, trim)

    def _python_batch(self, data: bytes | memoryview, trim: Trim) -> pa.RecordBatch | None:
        """The batch of the records cavro (or fastavro) decodes, a column per pa.array."""
        records = decode(self._header + data)
        if trim:
            records = [r for r in records if trim.keeps(r)]
        if not records:
            return None
        # one C-level pass turns the records into one tuple of values per stored field
        stored = list(zip(*map(dict.values, records), strict=True))
        empty: Values = (None,) * len(records)
        return self._batch(
            [build(empty if i is None else stored[i]) for i, build in self._columns])

    def _compiled_batch(self, stored: list[pa.Array], trim: Trim) -> pa.RecordBatch | None:
        """The batch of the stored fields' arrays the compiled decoder made."""
        if trim:
            stored = _trimmed(stored, self._read, trim)
        if not len(stored[0]):
            return None
        empty: Values = (None,) * len(stored[0])  # the rows of the constant and null columns
        return self._batch(
            [build(empty) if i is None else stored[i] for i, build in self._columns])

    def _batch(self, arrays: list[pa.Array]) -> pa.RecordBatch:
        for n, fix in self._fixes:
            arrays[n] = fix(arrays[n])
        return pa.RecordBatch.from_arrays(arrays, schema=self.arrow_schema)

    def _plain(self, data: bytes | memoryview) -> bytes | memoryview:
        """Blocks as the null codec frames them."""
        if self._codec == "null":
            return data
        out, pos = bytearray(), 0
        while pos < len(data):
            block = block_at(data, pos, self._sync)
            if block is None:
                raise AvroFormatError("a chunk of blocks ends inside a block")
            count, start, pos = block
            plain = decompress(self._codec, bytes(data[start:pos - SYNC_SIZE]))
            out += write_varint(count) + write_varint(len(plain)) + plain + self._sync
        return bytes(out)


# MariaDB's GTID numbers are unsigned (domain and server_id 32 bits, sequence 64); the store
# keeps them in Avro's signed int and long, so values past the signed range read negative.
# An unsigned target is decoded as the signed type of its width and viewed as unsigned (the
# same bits); a server_id or domain widened to int64 (Spark's server_id) is masked.
_SIGNED = {pa.uint32(): pa.int32(), pa.uint64(): pa.int64()}
_GTID_NUMBERS_32 = ("domain", "server_id")
_MASK_32 = pa.scalar(0xFFFFFFFF, pa.int64())


def _unsigned_fix(field: Field, target: pa.DataType) -> Callable[[pa.Array], pa.Array] | None:
    """How a column of GTID numbers becomes unsigned, when its target type can hold it."""
    if target in _SIGNED:
        return lambda array: array.view(target)
    if field.name in _GTID_NUMBERS_32 and field.kind == Kind.INT and target == pa.int64():
        return lambda array: pc.bit_wise_and(array, _MASK_32)
    return None


def _decode_cavro(container: bytes) -> Records:
    import cavro

    options = cavro.Options(record_decodes_to_dict=True)
    return cast(Records, list(cavro.ContainerReader(io.BytesIO(container), options=options)))


def _decode_fastavro(container: bytes) -> Records:
    return cast(Records, list(fastavro.reader(io.BytesIO(container))))


def _decoder() -> Callable[[bytes], Records]:
    """cavro when installed (the spark extra has it): it decodes these records about twice
    as fast as fastavro, which remains the fallback (same values, same dicts)."""
    try:
        import cavro  # noqa: F401
    except ImportError:
        return _decode_fastavro
    return _decode_cavro


decode = _decoder()


def decoder_path() -> str:
    """Which decoder turns blocks into batches in this interpreter (the benchmark says which
    it measured)."""
    if _avroarrow is not None:
        return "compiled (Avro blocks to Arrow buffers in C)"
    python = "cavro" if decode is _decode_cavro else "fastavro"
    return f"Python ({python}, then pa.array per column)"


def _trimmed(stored: list[pa.Array], names: list[str], trim: Trim) -> list[pa.Array]:
    """The arrays without the records ``trim`` drops: :meth:`Trim.keeps`, a column at a time."""
    meta = {name: stored[names.index(name)]
            for name in ("domain", "server_id", "sequence", "event_number")}
    dropped = []
    for cut, outside in ((trim.skip, pc.less_equal), (trim.stop, pc.greater)):
        if cut is None:
            continue
        tests = [pc.equal(meta["domain"], cut[0]), pc.equal(meta["sequence"], cut[2]),
                 outside(meta["event_number"], cut[3])]
        if cut[1] is not None:
            tests.append(pc.equal(meta["server_id"], cut[1]))
        dropped.append(reduce(pc.and_, tests))
    keep = pc.invert(reduce(pc.or_, dropped))
    if pc.all(keep).as_py():
        return stored
    return [array.filter(keep) for array in stored]


# -- the compiled decoder's program ------------------------------------------------------

# Operations, union shapes and string-branch rules of _avroarrow.pyx (its enums; keep in step).
_C_INT32, _C_INT64, _C_FLOAT32, _C_FLOAT64_OF_FLOAT, _C_FLOAT64 = 1, 2, 3, 4, 5
_C_BOOLEAN, _C_BINARY, _C_UTF8, _C_ENUM = 6, 7, 8, 9
_C_DECIMAL, _C_INT_DECIMAL, _C_NULL, _C_VALUES = 10, 11, 12, 13
_PLAIN, _NULLABLE, _WITH_TEXT = 0, 1, 2
_TEXT_REFUSED, _TEXT_NULL, _TEXT_TIME = 0, 1, 2
_MAX_POWER = 38  # the widest rescaling of a decimal: 10 ** 38 still fits an int128

Step = tuple[int, int, int, int, pa.DataType, Any]  # op, shape, text, power, type, extra

# The operation building a kind's values as the Arrow type the query reads them as.
_C_OPS: dict[tuple[Kind, pa.DataType], int] = {
    (Kind.INT, pa.int32()): _C_INT32, (Kind.INT, pa.int64()): _C_INT64,
    (Kind.LONG, pa.int64()): _C_INT64, (Kind.DATE, pa.date32()): _C_INT32,
    (Kind.DATETIME, pa.timestamp("us")): _C_INT64,
    (Kind.TIMESTAMP, pa.timestamp("us", tz="UTC")): _C_INT64,
    (Kind.TIME, pa.duration("us")): _C_INT64,
    (Kind.FLOAT, pa.float32()): _C_FLOAT32, (Kind.FLOAT, pa.float64()): _C_FLOAT64_OF_FLOAT,
    (Kind.DOUBLE, pa.float64()): _C_FLOAT64, (Kind.BOOLEAN, pa.bool_()): _C_BOOLEAN,
    (Kind.BYTES, pa.binary()): _C_BINARY, (Kind.STRING, pa.string()): _C_UTF8,
    (Kind.UUID, pa.string()): _C_UTF8,
}
# Logical types whose Avro type the kind alone does not fix (decimal may annotate fixed,
# uuid fixed(16)): the compiled decoder reads the store's.
_PHYSICAL = {Kind.DECIMAL: "bytes", Kind.UUID: "string"}


def compiled_decoder(avsc: dict[str, Any], targets: dict[str, pa.DataType],
                     zero_dates: str) -> Any:
    """The compiled decoder of this version's blocks into the arrays of the target types
    (``targets``: Arrow type by field name). None without the extension, with
    ``CDC_PURE_PYTHON`` set, or when a field is one it does not take."""
    if _avroarrow is None:
        return None
    program: list[Step] = []
    for field, spec in zip(fields_from_schema(avsc), avsc["fields"], strict=True):
        if field.name not in targets:
            return None
        step = _compiled_step(field, spec["type"], targets[field.name], zero_dates)
        if step is None:
            return None
        program.append(step)
    return _avroarrow.BlockDecoder(program)


def _compiled_step(field: Field, avro_type: Any, arrow_type: pa.DataType, zero_dates: str
                   ) -> Step | None:
    shape = _union_shape(avro_type, field.kind)
    value_type = _value_type(avro_type)
    physical = _PHYSICAL.get(field.kind)
    if shape is None or (physical is not None and _physical_type(value_type) != physical):
        return None
    op = _compiled_op(field, value_type, arrow_type)
    if op is None:
        return None
    text = _text_rule(field, zero_dates) if shape == _WITH_TEXT else _TEXT_REFUSED
    return op[0], shape, text, op[1], arrow_type, op[2]


def _union_shape(avro_type: Any, kind: Kind) -> int | None:
    """The shapes the store writes: a plain type (the metadata), ["null", T] (["null"] for a
    NULL column) and ["null", T, "string"] (temporal columns); None for any other."""
    if not isinstance(avro_type, list):
        return None if kind == Kind.NULL else _PLAIN
    if not avro_type or avro_type[0] != "null" or len(avro_type) > 3:
        return None
    if len(avro_type) <= 2:
        return _NULLABLE
    return _WITH_TEXT if avro_type[2] == "string" else None


def _value_type(avro_type: Any) -> Any:
    """The type of a field's values: its union's first branch that is not null."""
    branches = avro_type if isinstance(avro_type, list) else [avro_type]
    return next((b for b in branches if b != "null"), "null")


def _physical_type(value_type: Any) -> Any:
    return value_type.get("type") if isinstance(value_type, dict) else value_type


def _compiled_op(field: Field, value_type: Any, arrow_type: pa.DataType
                 ) -> tuple[int, int, Any] | None:
    """(operation, power of ten, extra) of a field the compiled decoder takes, else None."""
    if field.kind == Kind.NULL:
        return _C_NULL, 0, None
    if pa.types.is_decimal128(arrow_type):
        if field.kind not in (Kind.DECIMAL, Kind.INT, Kind.LONG):
            return None
        power = arrow_type.scale - (field.scale if field.kind == Kind.DECIMAL else 0)
        if not 0 <= power <= _MAX_POWER:
            return None
        return (_C_DECIMAL if field.kind == Kind.DECIMAL else _C_INT_DECIMAL), power, None
    if arrow_type == pa.string() and field.kind == Kind.DECIMAL:
        return _C_VALUES, 0, _decimal_text_column(field)  # Python makes the exact text
    if field.kind == Kind.ENUM and arrow_type == pa.string():
        return _C_ENUM, 0, tuple(symbol.encode() for symbol in value_type["symbols"])
    op = _C_OPS.get((field.kind, arrow_type))
    return None if op is None else (op, 0, None)


def _text_rule(field: Field, zero_dates: str) -> int:
    """What the compiled decoder makes of a temporal column's string branch (the rest it
    leaves to the Python path: ZeroDateError)."""
    if field.kind == Kind.TIME:
        return _TEXT_TIME
    if field.kind in _DATES and zero_dates == "null":
        return _TEXT_NULL
    return _TEXT_REFUSED


def _constant(value: Any, arrow_type: pa.DataType) -> Column:
    scalar = pa.scalar(value, arrow_type)
    return lambda values: pa.repeat(scalar, len(values))


def _nulls(arrow_type: pa.DataType) -> Column:
    return lambda values: pa.nulls(len(values), arrow_type)


def _plain(arrow_type: pa.DataType) -> Column:
    return lambda values: pa.array(values, arrow_type)


def _column(field: Field, arrow_type: pa.DataType, zero_dates: str) -> Column:
    if pa.types.is_decimal128(arrow_type):
        return _decimal_column(field, arrow_type)
    if arrow_type == pa.string() and field.kind == Kind.DECIMAL:
        return _decimal_text_column(field)
    if field.kind in _DATES:
        return _temporal_column(arrow_type, lambda text: invalid_date(text, zero_dates))
    if field.kind == Kind.TIME:
        return _temporal_column(arrow_type, parse_time)
    if field.kind in (Kind.STRING, Kind.UUID):
        return _text_column(arrow_type)
    return _plain(arrow_type)


def _text_column(arrow_type: pa.DataType) -> Column:
    return lambda values: pa.array(values, pa.binary()).cast(arrow_type)


def _temporal_column(arrow_type: pa.DataType, from_text: Callable[[str], Any]) -> Column:
    """Days or microseconds, except the values stored as text (a temporal column's union
    has a string branch: MariaDB's zero and partial dates)."""
    def build(values: Values) -> pa.Array:
        try:
            return pa.array(values, arrow_type)
        except pa.ArrowTypeError:
            return pa.array([from_text(v.decode()) if isinstance(v, bytes) else v
                             for v in values], arrow_type)
    return build


def _unscaled(field: Field) -> Callable[[Any], int]:
    """The unscaled integer of a stored value: a decimal's big-endian two's complement
    bytes, or an integer column's value (widened into a decimal)."""
    if field.kind == Kind.DECIMAL:
        return lambda b: int.from_bytes(b, "big", signed=True)
    return int


def _decimal_column(field: Field, arrow_type: pa.Decimal128Type) -> Column:
    """A decimal128 column assembled from its unscaled values (rescaled when the query's
    type is wider than the version's)."""
    unscaled = _unscaled(field)
    source_scale = field.scale if field.kind == Kind.DECIMAL else 0
    factor = 10 ** (arrow_type.scale - source_scale)

    def build(values: Values) -> pa.Array:
        ints = [0 if v is None else unscaled(v) * factor for v in values]
        data = pa.py_buffer(b"".join(i.to_bytes(16, "little", signed=True) for i in ints))
        nulls = values.count(None)
        valid = pa.array([v is not None for v in values]).buffers()[1] if nulls else None
        return pa.Array.from_buffers(arrow_type, len(values), [valid, data], nulls)
    return build


def _decimal_text_column(field: Field) -> Column:
    """A decimal wider than 38 digits (decimal128's and Spark's), as its exact text."""
    scale = field.scale

    def text(value: bytes) -> str:
        unscaled = int.from_bytes(value, "big", signed=True)
        return format(Decimal(f"{unscaled}E-{scale}"), "f")  # exact: no context rounding
    return lambda values: pa.array([None if v is None else text(v) for v in values],
                                   pa.string())
