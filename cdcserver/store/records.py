"""Reading committed records back out of a version file (and writing a block of them)."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from functools import lru_cache
from typing import Any

import fastavro

from cdcserver.store.avrofile import Block, Header, compress, decompress
from cdcserver.store.catalog import VersionInfo
from cdcserver.store.encoder import varint

Record = dict[str, Any]


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
    schema = _parsed(info.header.schema_json)
    out = io.BytesIO()
    for record in records:
        fastavro.schemaless_writer(out, schema, record)
    data = compress(info.header.codec, out.getvalue())
    return varint(len(records)) + varint(len(data)) + data + info.header.sync
