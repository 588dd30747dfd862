"""Reading committed records back out of a version file, and rendering them as JSON lines."""

from __future__ import annotations

import datetime as dt
import io
import json
from collections.abc import Callable, Iterator
from functools import lru_cache
from json.encoder import encode_basestring
from typing import Any

import fastavro

from cdcserver.store.avrofile import Block, Header, decompress
from cdcserver.store.catalog import VersionInfo
from cdcserver.store.schema import TableSchema
from client.schema import Kind, to_json_text

Record = dict[str, Any]
Renderer = Callable[[Record], bytes]


@lru_cache(maxsize=1024)
def _parsed(schema_json: str) -> Any:
    return fastavro.parse_schema(json.loads(schema_json))


def read_block(path: str, header: Header, block: Block) -> bytes:
    with open(path, "rb") as f:
        f.seek(block.data_start)
        return decompress(header.codec, f.read(block.data_size))


def decode_records(info: VersionInfo, block: Block) -> Iterator[Record]:
    schema = _parsed(info.header.schema_json)
    data = io.BytesIO(read_block(info.path, info.header, block))
    reader = fastavro.schemaless_reader
    for _ in range(block.count):
        record: Record = reader(data, schema, None)  # type: ignore[assignment]
        yield record


def encode_block(info: VersionInfo, records: list[Record]) -> bytes:
    """A new block of ``records`` for ``info``'s file (used to drop the records before a GTID
    seek point in AVRO mode without sending a partial block)."""
    from cdcserver.store.avrofile import compress
    from cdcserver.store.encoder import varint

    schema = _parsed(info.header.schema_json)
    out = io.BytesIO()
    for record in records:
        fastavro.schemaless_writer(out, schema, record)
    data = compress(info.header.codec, out.getvalue())
    return varint(len(records)) + varint(len(data)) + data + info.header.sync


_SIMPLE_META = ("domain", "server_id", "sequence", "event_number", "timestamp")


# Kinds whose values are always of one Python type, rendered without to_json_text's dispatch
# (the same text: ``esc`` is what json.dumps(ensure_ascii=False) calls for a str).
_DIRECT = {Kind.INT: "str", Kind.LONG: "str", Kind.DOUBLE: "repr", Kind.STRING: "esc"}


@lru_cache(maxsize=1024)
def compile_renderer(schema_json: str, zone: dt.tzinfo = dt.UTC) -> Renderer:
    """``record -> b'{"domain": 0, ...}\\n'``: one JSON object per line, keys in schema order,
    jansson's default separators (what MaxScale sends)."""
    schema = TableSchema.from_avsc(json.loads(schema_json))
    ns: dict[str, Any] = {"tj": to_json_text, "zone": zone, "str": str, "Kind": Kind,
                          "esc": encode_basestring, "repr": repr}
    pieces = []
    for i, field in enumerate(schema.fields):
        key = json.dumps(field.name, ensure_ascii=False)
        sep = "{" if i == 0 else ", "
        if field.name in _SIMPLE_META and i < 6:
            value = f"str(r[{field.name!r}])"
        elif field.name == "event_type" and i < 6:
            value = "'\"' + r['event_type'] + '\"'"
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
