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
from cdcserver.store.schema import METADATA_AVRO
from mariadb_cdc_client.format.gtid import unsigned_metadata

Record = dict[str, Any]


@lru_cache(maxsize=1024)
def _parsed(schema_json: str) -> Any:
    return fastavro.parse_schema(json.loads(schema_json))


def read_block(path: str, header: Header, block: Block) -> bytes:
    with open(path, "rb") as f:
        f.seek(block.data_start)
        return decompress(header.codec, f.read(block.data_size))


def decode_records(info: VersionInfo, block: Block) -> Iterator[Record]:
    schema = _parsed(info.schema_json)
    data = io.BytesIO(read_block(info.path, info.header, block))
    reader = fastavro.schemaless_reader
    for _ in range(block.count):
        record: Record = reader(data, schema, None)  # type: ignore[assignment]
        yield unsigned_metadata(record)


def record_slices(info: VersionInfo, block: Block) -> list[tuple[Record, bytes]]:
    """Each record of a block as its metadata fields (the GTID, event number, time and type:
    what a GTID filter looks at) and its bytes as stored. The columns are skipped, not
    decoded: no Decimal or datetime is made for a record that is only filtered."""
    writer, reader = _metadata_schemas(info.schema_json)
    data = read_block(info.path, info.header, block)
    stream = io.BytesIO(data)
    out: list[tuple[Record, bytes]] = []
    start = 0
    for _ in range(block.count):
        metadata: Record = fastavro.schemaless_reader(stream, writer, reader)  # type: ignore[assignment]
        end = stream.tell()
        out.append((unsigned_metadata(metadata), data[start:end]))
        start = end
    return out


@lru_cache(maxsize=1024)
def _metadata_schemas(schema_json: str) -> tuple[Any, Any]:
    """A version's schema, and the same record with only its metadata fields (to read with
    Avro's schema resolution, which skips the other fields)."""
    avsc = json.loads(schema_json)
    metadata = {**avsc, "fields": avsc["fields"][:len(METADATA_AVRO)]}
    return _parsed(schema_json), fastavro.parse_schema(metadata)


def block_of(info: VersionInfo, records: list[bytes]) -> bytes:
    """A new block of encoded ``records`` for ``info``'s file (used to drop the records
    before a GTID seek point, or past the end of a range, without sending a partial block)."""
    data = compress(info.header.codec, b"".join(records))
    return varint(len(records)) + varint(len(data)) + data + info.header.sync
