"""Row images decoded by a function compiled once per table layout.

python-mysql-replication decodes one value per method call, which caps it near 20,000 rows/s
here. Instead, for each table layout we generate one straight-line Python function: a run of
fixed-width columns becomes a single ``struct.unpack_from``, a VARCHAR becomes a slice and a
``decode``, and only values that need arithmetic (temporal types, DECIMAL) call a helper from
:mod:`cdcserver.replication.values`. A row without NULLs takes a path with no NULL checks.

Row image format (MySQL ``sql/rpl_record.cc``, ``unpack_row``): a NULL bitmap over the present
columns (LSB first), then each non-NULL value in its ``Field::pack`` format.
"""

from __future__ import annotations

import functools
import re
import struct
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, overload

from cdcserver.core.changes import ColumnDef, RowImages
from cdcserver.core.errors import UndecodableEvent
from cdcserver.mariadb.constants import ColumnType as T
from cdcserver.replication import values
from mariadb_cdc_client.format.compiled import compiled_module

RowsDecoder = Callable[[bytes, int, int], list[tuple[Any, ...]]]

_INT_FORMATS = {T.TINY: "b", T.SHORT: "h", T.LONG: "i", T.LONGLONG: "q"}
# MariaDB types logged as BINARY(n), turned into their text form (protocol.md type mapping).
_EXTENDED_TEXT = {"inet4": "inet4_text", "inet6": "inet6_text", "uuid": "uuid_text"}


@dataclass(frozen=True)
class _Piece:
    """How one column is read. ``fmt`` pieces are fixed-width little-endian struct fields that
    can be merged with their neighbours; ``block`` pieces are statements that assign ``OUT`` and
    advance ``pos``."""

    fmt: str | None = None
    post: str = "v"
    block: tuple[str, ...] = ()


def _length_prefixed(size: int, convert: str) -> tuple[str, ...]:
    """A value stored as a little-endian length of ``size`` bytes followed by the data."""
    read_len = "n = buf[pos]" if size == 1 else (
        f"n = int.from_bytes(buf[pos:pos+{size}], 'little')")
    return (read_len, f"pos += {size}", f"OUT = {convert.format(data='buf[pos:pos+n]')}",
            "pos += n")


def _text(col: ColumnDef, size: int) -> tuple[str, ...]:
    if col.charset is None:
        return _length_prefixed(size, "{data}")
    return _length_prefixed(size, "{data}.decode(" + repr(col.charset) + ")")


def _fixed_bytes(size: int, convert: str) -> tuple[str, ...]:
    return (f"OUT = {convert.format(data=f'buf[pos:pos+{size}]')}", f"pos += {size}")


def _piece(col: ColumnDef, ns: dict[str, Any], index: int) -> _Piece:
    t, meta = T(col.binlog_type), col.meta
    if t in _INT_FORMATS:
        fmt = _INT_FORMATS[t]
        return _Piece(fmt=fmt.upper() if col.unsigned else fmt)
    if t == T.INT24:
        post = "v" if col.unsigned else "(v - 0x1000000 if v & 0x800000 else v)"
        return _Piece(block=("v = int.from_bytes(buf[pos:pos+3], 'little')", f"OUT = {post}",
                             "pos += 3"))
    if t == T.FLOAT:
        return _Piece(fmt="f")
    if t == T.DOUBLE:
        return _Piece(fmt="d")
    if t == T.YEAR:
        return _Piece(fmt="B", post="(v + 1900 if v else 0)")
    if t == T.NEWDECIMAL:
        fmt_obj = values.DecimalFormat(meta >> 8, meta & 0xFF)
        ns[f"dec{index}"] = values.decimal_decoder(meta >> 8, meta & 0xFF)
        return _Piece(block=_fixed_bytes(fmt_obj.size, f"dec{index}({{data}})"))
    if t in (T.VARCHAR, T.VAR_STRING):
        return _Piece(block=_text(col, 1 if meta < 256 else 2))
    if t == T.STRING:
        return _string(col, meta)
    if t in (T.BLOB, T.TINY_BLOB, T.MEDIUM_BLOB, T.LONG_BLOB):
        return _Piece(block=_text(col, meta))
    if t == T.GEOMETRY:
        return _Piece(block=_length_prefixed(meta, "{data}"))
    if t == T.JSON:
        ns["mysql_json"] = _mysql_json
        return _Piece(block=_length_prefixed(meta, "mysql_json({data})"))
    if t == T.ENUM:
        ns[f"labels{index}"] = col.enum_values
        return _Piece(fmt="B" if meta == 1 else "H", post=f"enum_label(v, labels{index})")
    if t == T.SET:
        ns[f"labels{index}"] = col.set_values
        return _Piece(block=_fixed_bytes(
            meta, f"set_labels(int.from_bytes({{data}}, 'little'), labels{index})"))
    if t == T.BIT:
        nbytes = (meta >> 8) + (1 if meta & 0xFF else 0)
        return _Piece(block=_fixed_bytes(nbytes, "int.from_bytes({data}, 'big')"))
    if t == T.DATE:
        return _Piece(block=_fixed_bytes(3, "date_from_int(int.from_bytes({data}, 'little'))"))
    if t == T.TIME2:
        return _Piece(block=_fixed_bytes(3 + values.frac_bytes(meta), f"time2({{data}}, {meta})"))
    if t == T.DATETIME2:
        size = 5 + values.frac_bytes(meta)
        return _Piece(block=_fixed_bytes(size, f"datetime2({{data}}, {meta})"))
    if t == T.TIMESTAMP2:
        size = 4 + values.frac_bytes(meta)
        return _Piece(block=_fixed_bytes(size, f"timestamp2({{data}}, {meta})"))
    if t == T.TIME and meta:
        return _Piece(block=_fixed_bytes(values.TIME_HIRES_BYTES[meta],
                                         f"time_hires({{data}}, {meta})"))
    if t == T.TIME:
        return _Piece(block=_fixed_bytes(
            3, "time_v1(int.from_bytes({data}, 'little', signed=True))"))
    if t == T.DATETIME and meta:
        return _Piece(block=_fixed_bytes(values.DATETIME_HIRES_BYTES[meta],
                                         f"datetime_hires({{data}}, {meta})"))
    if t == T.DATETIME:
        return _Piece(fmt="Q", post="datetime_v1(v)")
    if t == T.TIMESTAMP and meta:
        return _Piece(block=_fixed_bytes(4 + values.SEC_PART_BYTES[meta],
                                         f"timestamp_hires({{data}}, {meta})"))
    if t == T.TIMESTAMP:
        return _Piece(fmt="I", post="timestamp_v1(v)")
    if t == T.NULL:
        return _Piece(block=("OUT = None",))
    raise UndecodableEvent(f"column {col.name!r}: binlog type {t.name} cannot be decoded")


def _string(col: ColumnDef, meta: int) -> _Piece:
    """CHAR/BINARY (and MariaDB's INET6/UUID, stored as BINARY). The server strips the pad
    character before logging (Field_string::pack); BINARY(n) pads with NUL, so put it back."""
    max_length = (((meta >> 4) & 0x300) ^ 0x300) + (meta & 0xFF)
    size = 1 if max_length < 256 else 2
    if col.extended in _EXTENDED_TEXT:
        convert = _EXTENDED_TEXT[col.extended]
        return _Piece(block=_length_prefixed(
            size, convert + "({data}.ljust(" + str(max_length) + ", b'\\0'))"))
    if col.charset is None:
        return _Piece(block=_length_prefixed(size, "{data}.ljust(" + str(max_length) + ", b'\\0')"))
    return _Piece(block=_text(col, size))


def _mysql_json(data: bytes) -> str:
    """MySQL's binary JSON (type 245) as JSON text."""
    from cdcserver.replication.mysqljson import binary_json_to_text  # MySQL sources only

    return binary_json_to_text(data)


class _Emitter:
    def __init__(self, columns: tuple[ColumnDef, ...], ns: dict[str, Any]) -> None:
        self.columns = columns
        self.pieces = [_piece(c, ns, i) for i, c in enumerate(columns)]
        self.ns = ns
        self.structs = 0

    def _struct(self, fmt: str) -> str:
        name = f"st{self.structs}"
        self.structs += 1
        self.ns[name] = struct.Struct("<" + fmt).unpack_from
        return name

    def _assign(self, i: int, piece: _Piece, indent: str) -> list[str]:
        if piece.fmt is not None:
            size = struct.calcsize("<" + piece.fmt)
            post = _rename(piece.post, f"c{i}") if piece.post != "v" else ""
            lines = [f"{indent}c{i} = {self._struct(piece.fmt)}(buf, pos)[0]",
                     f"{indent}pos += {size}"]
            if post:
                lines.append(f"{indent}c{i} = {post}")
            return lines
        return [indent + line.replace("OUT", f"c{i}") for line in piece.block]

    def fast_path(self, indent: str) -> list[str]:
        """No NULLs: merge runs of fixed-width columns into one unpack."""
        lines: list[str] = []
        run: list[int] = []

        def flush() -> None:
            if not run:
                return
            fmt = "".join(self.pieces[i].fmt or "" for i in run)
            names = ", ".join(f"c{i}" for i in run) + ("," if len(run) == 1 else "")
            lines.append(f"{indent}{names} = {self._struct(fmt)}(buf, pos)")
            lines.append(f"{indent}pos += {struct.calcsize('<' + fmt)}")
            for i in run:
                post = self.pieces[i].post
                if post != "v":
                    lines.append(f"{indent}c{i} = {_rename(post, f'c{i}')}")
            run.clear()

        for i, piece in enumerate(self.pieces):
            if piece.fmt is not None:
                run.append(i)
                continue
            flush()
            lines += self._assign(i, piece, indent)
        flush()
        return lines

    def checked_path(self, indent: str) -> list[str]:
        lines: list[str] = []
        for i, (col, piece) in enumerate(zip(self.columns, self.pieces, strict=True)):
            if not col.nullable:
                lines += self._assign(i, piece, indent)
                continue
            lines.append(f"{indent}if nulls & {1 << i}:")
            lines.append(f"{indent}    c{i} = None")
            lines.append(f"{indent}else:")
            lines += self._assign(i, piece, indent + "    ")
        return lines


def _rename(post: str, name: str) -> str:
    """Substitute the raw value ``v`` in a post-conversion expression."""
    return re.sub(r"\bv\b", name, post)


def compile_rows_decoder(columns: tuple[ColumnDef, ...]) -> RowsDecoder:
    """Build the function that decodes every row image of a rows event body: the compiled
    decoder where it is built and takes every column, else a generated Python function."""
    return _c_decoder(columns) or _compile(columns)


# -- the compiled decoder (cdcserver/replication/_rowdecode.pyx) ---------------------------

_rowdecode = compiled_module("cdcserver.replication._rowdecode")

# _rowdecode.pyx's operations (keep in step)
R_INT, R_FLOAT, R_DOUBLE, R_YEAR, R_FIXED_CALL, R_TEXT, R_LEN_CALL, R_CHAR, R_ENUM = range(1, 10)
R_DATE, R_DATETIME2, R_TIMESTAMP2, R_NONE = range(10, 14)
_INT_SIZES = {T.TINY: 1, T.SHORT: 2, T.INT24: 3, T.LONG: 4, T.LONGLONG: 8}

COp = tuple[int, int, Any]  # operation, size, argument


@lru_cache(maxsize=4096)
def _c_decoder(columns: tuple[ColumnDef, ...]) -> RowsDecoder | None:
    """The compiled decoder of this layout; None where it is not built or a column has no
    operation in it (the generated Python then decodes the layout)."""
    if _rowdecode is None:
        return None
    ops = []
    for col in columns:
        op = _c_op(col)
        if op is None:
            return None
        ops.append((*op, col.nullable))
    decoder: RowsDecoder = _rowdecode.RowsDecoder(tuple(ops), values.UTC)
    return decoder


def _c_op(col: ColumnDef) -> COp | None:
    """The compiled decoder's operation for a column: what ``_piece`` generates, with the
    Python functions it calls handed over for what C leaves to them."""
    t, meta = col.binlog_type, col.meta
    if t in _INT_SIZES:
        return R_INT, _INT_SIZES[T(t)], col.unsigned
    if t in (T.FLOAT, T.DOUBLE, T.YEAR):
        return {T.FLOAT: (R_FLOAT, 4, None), T.DOUBLE: (R_DOUBLE, 8, None),
                T.YEAR: (R_YEAR, 1, None)}[T(t)]
    if t == T.NEWDECIMAL:
        size = values.DecimalFormat(meta >> 8, meta & 0xFF).size
        return R_FIXED_CALL, size, values.decimal_decoder(meta >> 8, meta & 0xFF)
    if t in (T.VARCHAR, T.VAR_STRING):
        return R_TEXT, 1 if meta < 256 else 2, col.charset
    if t in (T.BLOB, T.TINY_BLOB, T.MEDIUM_BLOB, T.LONG_BLOB):
        return R_TEXT, meta, col.charset
    if t == T.GEOMETRY:
        return R_TEXT, meta, None
    if t == T.STRING:
        max_length = (((meta >> 4) & 0x300) ^ 0x300) + (meta & 0xFF)
        size = 1 if max_length < 256 else 2
        if col.extended in _EXTENDED_TEXT:
            return R_CHAR, size, (max_length, getattr(values, _EXTENDED_TEXT[col.extended]))
        if col.charset is None:
            return R_CHAR, size, (max_length, None)
        return R_TEXT, size, col.charset
    if t == T.JSON:
        return R_LEN_CALL, meta, _mysql_json
    if t == T.ENUM:
        return R_ENUM, 1 if meta == 1 else 2, col.enum_values
    if t == T.DATE:
        return R_DATE, 3, _date
    if t == T.DATETIME2:
        return (R_DATETIME2, 5 + values.frac_bytes(meta),
                (meta, functools.partial(_with_fsp, values.datetime2, meta)))
    if t == T.TIMESTAMP2:
        return (R_TIMESTAMP2, 4 + values.frac_bytes(meta),
                (meta, values.UTC, functools.partial(_with_fsp, values.timestamp2, meta)))
    if t == T.NULL:
        return R_NONE, 0, None
    return _c_call(col)


def _c_call(col: ColumnDef) -> COp | None:
    """The types C reads as bytes and hands to their Python function."""
    t, meta = col.binlog_type, col.meta
    if t == T.SET:
        return R_FIXED_CALL, meta, functools.partial(_set, col.set_values)
    if t == T.BIT:
        return R_FIXED_CALL, (meta >> 8) + (1 if meta & 0xFF else 0), _big_endian
    if t == T.TIME2:
        return (R_FIXED_CALL, 3 + values.frac_bytes(meta),
                functools.partial(_with_fsp, values.time2, meta))
    return None  # the old temporal formats: the Python decoder


def _with_fsp(function: Callable[[bytes, int], Any], fsp: int, raw: bytes) -> Any:
    return function(raw, fsp)


def _date(raw: bytes) -> Any:
    return values.date_from_int(int.from_bytes(raw, "little"))


def _set(labels: tuple[str, ...], raw: bytes) -> str:
    return values.set_labels(int.from_bytes(raw, "little"), labels)


def _big_endian(raw: bytes) -> int:
    return int.from_bytes(raw, "big")


@lru_cache(maxsize=4096)
def _compile(columns: tuple[ColumnDef, ...]) -> RowsDecoder:
    ns: dict[str, Any] = {
        "date_from_int": values.date_from_int, "datetime2": values.datetime2,
        "timestamp2": values.timestamp2, "time2": values.time2, "time_v1": values.time_v1,
        "datetime_v1": values.datetime_v1, "timestamp_v1": values.timestamp_v1,
        "enum_label": values.enum_label, "set_labels": values.set_labels,
        "datetime_hires": values.datetime_hires, "time_hires": values.time_hires,
        "timestamp_hires": values.timestamp_hires,
        "inet4_text": values.inet4_text, "inet6_text": values.inet6_text,
        "uuid_text": values.uuid_text,
    }
    emitter = _Emitter(columns, ns)
    nbytes = (len(columns) + 7) // 8
    read_nulls = "nulls = buf[pos]" if nbytes == 1 else (
        f"nulls = int.from_bytes(buf[pos:pos+{nbytes}], 'little')")
    row = "(" + "".join(f"c{i}, " for i in range(len(columns))) + ")"
    src = [
        "def decode_rows(buf, pos, end):",
        "    rows = []",
        "    append = rows.append",
        "    while pos < end:",
        f"        {read_nulls}",
        f"        pos += {nbytes}",
        "        if not nulls:",
        *emitter.fast_path(" " * 12),
        "        else:",
        *emitter.checked_path(" " * 12),
        f"        append({row})",
        "    if pos != end:",
        "        raise ValueError(f'row data ends at {pos}, event at {end}')",
        "    return rows",
    ]
    exec(compile("\n".join(src), "<rowcodec>", "exec"), ns)
    decoder: RowsDecoder = ns["decode_rows"]
    return decoder


class DeferredRows(Sequence[tuple[Any, ...]]):
    """Row images decoded the first time they are read. The replicator hands these over for
    layouts whose images a sink writes directly (the Avro store's compiled path,
    ``store/transcoder.py``): the tuples are made only for the sinks that read values. Images
    that do not decode raise :class:`UndecodableEvent` naming the event, wherever they are
    first read; the transaction's ``Commit`` is then never applied."""

    __slots__ = ("_args", "_decode", "_rows", "_where")

    def __init__(self, decode: RowsDecoder, images: RowImages, table: str, file: str,
                 pos: int) -> None:
        self._decode = decode
        self._args: RowImages | None = images
        self._where = (table, file, pos)
        self._rows: list[tuple[Any, ...]] = []

    def _decoded(self) -> list[tuple[Any, ...]]:
        if self._args is not None:
            buf, pos, end = self._args
            try:
                self._rows = self._decode(buf, pos, end)
            except (ValueError, IndexError, struct.error, UnicodeDecodeError) as exc:
                table, file, at = self._where
                raise UndecodableEvent(f"rows of {table} do not match its table map: {exc}",
                                       file=file, pos=at) from exc
            self._args = None
        return self._rows

    def __len__(self) -> int:
        return len(self._decoded())

    @overload
    def __getitem__(self, index: int) -> tuple[Any, ...]: ...
    @overload
    def __getitem__(self, index: slice) -> list[tuple[Any, ...]]: ...
    def __getitem__(self, index: int | slice) -> tuple[Any, ...] | list[tuple[Any, ...]]:
        return self._decoded()[index]

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        return iter(self._decoded())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence):
            return self._decoded() == list(other)
        return NotImplemented

    def __hash__(self) -> int:
        raise TypeError("DeferredRows is unhashable")

    def __repr__(self) -> str:
        return f"DeferredRows({self._decoded()!r})"
