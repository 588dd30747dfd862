"""Stored records as the JSON lines clients receive: one compiled renderer per schema, and
whole blocks rendered in C where the extension is built (``_jsonlines.pyx``)."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from functools import lru_cache
from json.encoder import encode_basestring
from typing import Any, Protocol

from cdcserver.protocol.dialect import (
    JsonStyle,
    maxscale_safe,
    maxscale_text,
    maxscale_type,
    unsigned_64,
)
from cdcserver.store.avrofile import Block
from cdcserver.store.catalog import VersionInfo
from cdcserver.store.records import Record, decode_records, read_block, record_slices
from cdcserver.store.schema import TableSchema
from mariadb_cdc_client.format.compiled import compiled_module
from mariadb_cdc_client.format.schema import Field, Kind, to_json_text
from mariadb_cdc_client.format.wire import Dialect

# compile_block_renderer asks CDC_PURE_PYTHON on each use (through transcoder.available)
_jsonlines = compiled_module("cdcserver.protocol._jsonlines", unless_pure_python=False)

Renderer = Callable[[Record], bytes]
EXACT = JsonStyle()  # the exact dialect, TIMESTAMPs in UTC


REPAIR_KEY = b"cdc:repair"  # no field is named so: field names are [A-Za-z0-9_]


def repair_suffix(info: VersionInfo, block: Block, dialect: Dialect) -> bytes | None:
    """For a block of a repair's records (``cdcserver/reread``): the key each of its JSON
    records ends with, saying why it is there; None for any other block."""
    note = info.notes.get(block.offset)
    if note is None:
        return None
    if dialect == Dialect.MAXSCALE:
        note = maxscale_safe(note)
    return b', "' + REPAIR_KEY + b'": ' + note.encode() + b"}\n"


def with_suffix(line: bytes, suffix: bytes | None) -> bytes:
    """A rendered record line (``{...}\n``) with the repair key added at its end."""
    return line if suffix is None else line[:-2] + suffix


def json_block(info: VersionInfo, block: Block, style: JsonStyle) -> bytes:
    """A whole block as JSON lines: by the C renderer where it takes the block, record by
    record otherwise (and for a repair's block, whose records carry the repair key)."""
    suffix = repair_suffix(info, block, style.dialect)
    if suffix is None:
        lines = rendered_block(info, block, style)
        if lines is not None:
            return lines
    render = compile_renderer(info.schema_json, style)
    return b"".join(with_suffix(render(record), suffix)
                    for record in decode_records(info, block))


def rendered_block(info: VersionInfo, block: Block, style: JsonStyle) -> bytes | None:
    """A whole block as JSON lines by the C renderer; None when it does not take the block
    (then render its records one by one with ``compile_renderer``)."""
    renderer = compile_block_renderer(info.schema_json, style)
    if renderer is None:
        return None
    return renderer.render(read_block(info.path, info.header, block), block.count)


_SIMPLE_META = ("domain", "server_id", "sequence", "event_number", "timestamp")
_METADATA = (*_SIMPLE_META, "event_type")


def metadata_slices(info: VersionInfo, block: Block) -> list[tuple[Record, bytes]]:
    """Each record of a block as its metadata fields and its bytes as stored (what a GTID
    filter needs, ``records.record_slices``): by the C walker, which skips the columns,
    where it takes the block."""
    renderer = compile_block_renderer(info.schema_json)
    symbols = _event_types(info.schema_json)
    if renderer is not None and symbols is not None:
        data = read_block(info.path, info.header, block)
        ends = renderer.slices(data, block.count, _METADATA, symbols)
        if ends is not None:
            starts = [0, *(end for _, end in ends)]
            return [(metadata, data[start:end])
                    for (metadata, end), start in zip(ends, starts, strict=False)]
    return record_slices(info, block)


@lru_cache(maxsize=1024)
def _event_types(schema_json: str) -> tuple[str, ...] | None:
    """The symbols of a version's event_type enum, when its first fields are the store's
    metadata fields in the store's order (else None: the Python path reads its records)."""
    fields = json.loads(schema_json)["fields"][:len(_METADATA)]
    if tuple(f["name"] for f in fields) != _METADATA:
        return None
    enum = fields[-1]["type"]
    return tuple(enum["symbols"]) if isinstance(enum, dict) else None


# Kinds whose values are always of one Python type, rendered without to_json_text's dispatch
# (the same text: ``esc`` is what json.dumps(ensure_ascii=False) calls for a str).
_DIRECT = {Kind.INT: "str", Kind.LONG: "str", Kind.DOUBLE: "repr", Kind.STRING: "esc"}


@lru_cache(maxsize=1024)
def compile_renderer(schema_json: str, style: JsonStyle = EXACT) -> Renderer:
    """``record -> b'{"domain": 0, ...}\\n'``: one JSON object per line, keys in schema order,
    jansson's default separators (what MaxScale sends), values in ``style``'s dialect."""
    schema = TableSchema.from_avsc(json.loads(schema_json))
    maxscale = style.dialect == Dialect.MAXSCALE
    ns: dict[str, Any] = {"tj": to_json_text, "mt": maxscale_text, "zone": style.zone,
                          "str": str, "Kind": Kind, "esc": encode_basestring, "repr": repr}
    pieces = []
    for i, field in enumerate(schema.fields):
        key = json.dumps(field.name, ensure_ascii=False)
        if maxscale:
            key = maxscale_safe(key)
        sep = "{" if i == 0 else ", "
        if field.name in _SIMPLE_META and i < 6:
            value = f"str(r[{field.name!r}])"
        elif field.name == "event_type" and i < 6:
            value = "'\"' + r['event_type'] + '\"'"
        elif (maxscale and field.kind not in (Kind.INT, Kind.LONG, Kind.DOUBLE)) or \
                (maxscale and field.real_type == "year"):
            ns[f"f{i}"] = field
            value = f"mt(f{i}, r[{field.name!r}], zone)"
        elif field.kind in _DIRECT:
            value = f"('null' if (v{i} := r[{field.name!r}]) is None else " \
                    f"{_DIRECT[field.kind]}(v{i}))"
        else:
            ns[f"k{i}"] = field.kind
            value = f"tj(k{i}, r[{field.name!r}], {field.fsp}, zone)"
        pieces.append(f"{(sep + key + ': ')!r} + {value}")
    src = "def render(r):\n    return (" + " + ".join(pieces) + " + '}\\n').encode()\n"
    exec(compile(src, "<json-renderer>", "exec"), ns)
    renderer: Renderer = ns["render"]
    return renderer


class BlockRenderer(Protocol):
    def render(self, data: bytes, count: int) -> bytes | None: ...

    def slices(self, data: bytes, count: int, names: tuple[str, ...],
               symbols: tuple[str, ...]) -> list[tuple[Record, int]] | None: ...


# Value operations of _jsonlines.pyx (its enum), by kind.
_BLOCK_OPS = {Kind.INT: 1, Kind.LONG: 1, Kind.BOOLEAN: 3, Kind.FLOAT: 4, Kind.DOUBLE: 5,
              Kind.DECIMAL: 6, Kind.STRING: 7, Kind.BYTES: 8, Kind.UUID: 9, Kind.DATE: 10,
              Kind.DATETIME: 11, Kind.TIMESTAMP: 12, Kind.TIME: 13, Kind.NULL: 14}
_OP_DATETIME, _OP_U64, _OP_DECIMAL_TEXT, _OP_YEAR = 11, 15, 16, 17
_R_LONG, _R_ENUM, _R_UINT32, _R_UINT64 = 1, 2, 18, 19
# the GTID's numbers are MariaDB's unsigned ones, stored as their bit patterns
_META_OPS = {"domain": _R_UINT32, "server_id": _R_UINT32, "sequence": _R_UINT64}
_PLAIN, _NULLABLE, _WITH_TEXT = 0, 1, 2


@lru_cache(maxsize=1024)
def compile_block_renderer(schema_json: str, style: JsonStyle = EXACT
                           ) -> BlockRenderer | None:
    """The C renderer of whole blocks (``_jsonlines.pyx``) for a version's schema: the lines
    ``compile_renderer`` writes, several times faster. None without the extension, with
    ``CDC_PURE_PYTHON`` set, or for a schema it does not take (a TIMESTAMP shown in a zone
    other than UTC, a union of another shape)."""
    from cdcserver.store.transcoder import available

    if _jsonlines is None or not available():
        return None
    avsc = json.loads(schema_json)
    fields = TableSchema.from_avsc(avsc).fields
    program: list[tuple[int, int, int, bytes, tuple[bytes, ...] | None]] = []
    for i, (field, spec) in enumerate(zip(fields, avsc["fields"], strict=True)):
        key = json.dumps(field.name, ensure_ascii=False)
        if style.dialect == Dialect.MAXSCALE:
            key = maxscale_safe(key)
        prefix = (("{" if i == 0 else ", ") + key + ": ").encode("utf-8")
        if i < 6 and field.name in _SIMPLE_META:
            program.append((_META_OPS.get(field.name, _R_LONG), _PLAIN, 0, prefix, None))
            continue
        if i < 6 and field.name == "event_type":
            symbols = tuple(f'"{s}"'.encode() for s in spec["type"]["symbols"])
            program.append((_R_ENUM, _PLAIN, 0, prefix, symbols))
            continue
        union = _union_shape(spec["type"])
        if union is None or field.kind not in _BLOCK_OPS:
            return None
        if field.kind == Kind.TIMESTAMP and style.zone.utcoffset(None) != dt.timedelta(0):
            return None
        arg = field.scale if field.kind == Kind.DECIMAL else field.fsp
        op = _BLOCK_OPS[field.kind]
        if style.dialect == Dialect.MAXSCALE:
            op, arg = _maxscale_op(field, op, arg)
        program.append((op, union, arg, prefix, None))
    renderer: BlockRenderer = _jsonlines.BlockRenderer(
        program, style.dialect == Dialect.MAXSCALE)
    return renderer


def _maxscale_op(field: Field, op: int, arg: int) -> tuple[int, int]:
    """The C renderer's operation for a column in the MaxScale dialect (``maxscale_text``)."""
    if field.kind == Kind.DECIMAL:
        if unsigned_64(field):
            return _OP_U64, 0
        return (op, arg) if maxscale_type(field) == "double" else (_OP_DECIMAL_TEXT, arg)
    if field.real_type == "year":
        return _OP_YEAR, 0
    if field.kind == Kind.TIMESTAMP:  # in UTC, without the offset
        return _OP_DATETIME, arg
    return op, arg


def _union_shape(avro_type: Any) -> int | None:
    """The shapes the store writes: ["null"], ["null", T] and ["null", T, "string"]."""
    if not isinstance(avro_type, list) or not avro_type or avro_type[0] != "null":
        return None
    if len(avro_type) <= 2:
        return _NULLABLE
    if len(avro_type) == 3 and avro_type[2] == "string":
        return _WITH_TEXT
    return None
