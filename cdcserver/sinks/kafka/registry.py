"""Avro values in Confluent's wire format, their schemas in a schema registry.

A message value is a magic ``0`` byte, the schema's registry id (4 bytes, big-endian) and
the record in Avro's binary encoding: what Confluent's ``KafkaAvroSerializer`` and Kafka
Connect's ``AvroConverter`` write, and their deserializers (and Apicurio's, with its
Confluent-compatible id handling) read.

:class:`Registry` speaks Confluent's REST API (Confluent Schema Registry, Karapace, Apicurio
Registry's ``/apis/ccompat/v7``): before a subject's first schema it sets the subject's
compatibility (``schema_compatibility``), then registers each schema (``POST
/subjects/<subject>/versions``, which answers the id of a schema already there). Ids are kept
per schema text, so a schema is registered once per process, and the sink keeps each table
shape's id and parsed schema with the shape: no request per message.

While the registry cannot be reached, answers an error, or rejects a schema (409: not
compatible with the subject's earlier versions under its compatibility), :meth:`Registry.id`
keeps trying, with the reason in :attr:`Registry.waiting` (``/health`` shows it) and in the
log: replication waits, nothing is lost or sent without its schema, and it goes on once the
registry takes the schema (after an operator changed the subject's compatibility, say).
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import time
from typing import Any
from urllib.parse import quote

import aiohttp
import fastavro

from cdcserver.core.kafkaconfig import KafkaConfig
from cdcserver.core.retry import Backoff

log = logging.getLogger("cdcserver.sinks.kafka.sink")

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
MAGIC = b"\x00"


class RegistryError(Exception):
    """The registry answered a request with an error: ``status`` and its message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def subject(strategy: str, topic: str, record: str, key: bool = False) -> str:
    """The subject of a topic's value (or key) schema named ``record``: Confluent's
    ``TopicNameStrategy`` (``topic``), ``RecordNameStrategy`` (``record``) or
    ``TopicRecordNameStrategy`` (``topic-record``)."""
    if strategy == "record":
        return record
    if strategy == "topic-record":
        return f"{topic}-{record}"
    return f"{topic}-{'key' if key else 'value'}"


def record_name(schema: dict[str, Any]) -> str:
    namespace = schema.get("namespace")
    return f"{namespace}.{schema['name']}" if namespace else str(schema["name"])


class AvroEncoder:
    """One schema's values in the wire format (the schema parsed once)."""

    __slots__ = ("parsed", "prefix")

    def __init__(self, schema_id: int, schema: dict[str, Any]) -> None:
        self.prefix = MAGIC + schema_id.to_bytes(4, "big")
        self.parsed = fastavro.parse_schema(schema)

    def encode(self, record: dict[str, Any]) -> bytes:
        out = io.BytesIO()
        out.write(self.prefix)
        fastavro.schemaless_writer(out, self.parsed, record)
        return out.getvalue()


def decode(value: bytes, schemas: dict[int, Any]) -> tuple[int, Any]:
    """A wire-format value's schema id and record, the id's parsed schema from ``schemas``."""
    if len(value) < 5 or value[:1] != MAGIC:
        raise ValueError("not a value in Confluent's wire format (no magic byte 0)")
    schema_id = int.from_bytes(value[1:5], "big")
    return schema_id, fastavro.schemaless_reader(io.BytesIO(value[5:]), schemas[schema_id],
                                                 None)


class Registry:
    def __init__(self, config: KafkaConfig) -> None:
        self.config = config
        self.url = config.schema_registry_url.rstrip("/")
        self.waiting = ""  # why a schema is not registered yet; "" when none waits
        self._ids: dict[tuple[str, str], int] = {}  # (subject, schema text) -> id
        self._configured: set[str] = set()  # subjects whose compatibility is set
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            user = self.config.schema_registry_user
            auth = aiohttp.BasicAuth(user, self.config.schema_registry_password()) \
                if user else None
            self._session = aiohttp.ClientSession(
                auth=auth, timeout=aiohttp.ClientTimeout(total=self.config.request_timeout),
                headers={"Accept": CONTENT_TYPE})
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _request(self, method: str, path: str, body: dict[str, Any]) -> Any:
        async with self._client().request(method, self.url + path, data=json.dumps(body),
                                          headers={"Content-Type": CONTENT_TYPE}) as response:
            text = await response.text()
            if response.status >= 400:
                try:
                    message = json.loads(text).get("message") or text
                except (ValueError, AttributeError):
                    message = text
                raise RegistryError(response.status, f"{response.status} {message}".strip())
            return json.loads(text) if text else None

    async def register(self, subject_name: str, schema: dict[str, Any]) -> int:
        """One attempt: the subject's compatibility set (the first time), the schema
        registered; its id."""
        text = json.dumps(schema, separators=(",", ":"))
        known = self._ids.get((subject_name, text))
        if known is not None:
            return known
        path = "/subjects/" + quote(subject_name, safe="")
        config = "/config/" + quote(subject_name, safe="")
        compatibility = {"compatibility": self.config.schema_compatibility}
        after = False  # set the compatibility once the subject exists
        if subject_name not in self._configured and self.config.schema_compatibility:
            try:
                await self._request("PUT", config, compatibility)
            except RegistryError as exc:
                # Apicurio Registry 3.0 keeps no config for a subject it does not have when
                # the name is long (a 404): its first schema, which nothing is checked
                # against, goes in first
                if exc.status != 404:
                    raise
                after = True
        answer = await self._request("POST", path + "/versions", {"schema": text})
        if after:
            await self._request("PUT", config, compatibility)
        self._configured.add(subject_name)
        schema_id = int(answer["id"])
        self._ids[(subject_name, text)] = schema_id
        return schema_id

    async def id(self, subject_name: str, schema: dict[str, Any], what: str) -> int:
        """``schema``'s id under ``subject_name``, trying until the registry takes it
        (``what``: the table, for the reason given meanwhile)."""
        backoff = Backoff(first=0.5, maximum=30.0)
        logged, logged_at = "", 0.0
        while True:
            try:
                schema_id = await self.register(subject_name, schema)
            except RegistryError as exc:
                if exc.status == 409:
                    reason = (f"the schema registry rejects the new schema of {what} under "
                              f"subject {subject_name!r} as incompatible with its earlier "
                              f"versions (compatibility "
                              f"{self.config.schema_compatibility or 'as the registry has it'}"
                              f"): {exc}; replication waits until the subject's compatibility "
                              f"lets it in (PUT {self.url}/config/{subject_name})")
                else:
                    reason = (f"the schema registry at {self.url} refuses the schema of "
                              f"{what} (subject {subject_name!r}): {exc}")
            except (TimeoutError, aiohttp.ClientError, OSError, ValueError, KeyError,
                    TypeError) as exc:
                reason = (f"waiting for the schema registry at {self.url} (schema of {what}, "
                          f"subject {subject_name!r}): {type(exc).__name__}: {exc}")
            else:
                if self.waiting:
                    log.warning("kafka: the schema registry took the schema of %s", what)
                self.waiting = ""
                return schema_id
            self.waiting = reason
            delay = backoff.failed()
            if reason != logged or time.monotonic() - logged_at >= 60:
                log.warning("kafka: %s; retrying in %.1fs", reason, delay)
                logged, logged_at = reason, time.monotonic()
            await asyncio.sleep(delay)
