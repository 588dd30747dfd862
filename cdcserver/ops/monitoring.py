"""The monitoring endpoint: ``GET /metrics`` (Prometheus text format), ``GET /health``, and the
probes ``GET /live`` and ``GET /ready`` (``probes.py``).

A few routes on the service's own event loop (so reading its state needs no locks), HTTP/1.1
with ``Connection: close``. prometheus_client renders the metrics; the request handling is
small enough not to need a web framework, and it is bounded like the CDC listener: a request
head of at most 8 KiB, 5 seconds to send it, 10 seconds for the client to take the answer,
and the HTTP listeners' bounds on connections (``httpgate.py``: 64 in all, 32 from one
address). A new connection is not turned away for those waiting: when the listener is full,
the one that has waited longest for its request is closed, so that idle or slow connections
cannot keep a probe from its answer.

``/health`` answers 200 with ``{"status": "ok", ...}`` while replication is connected and
within the lag limit, and 503 with ``"status": "degraded"`` and the problems otherwise, so a
load balancer or an orchestrator's probe can act on the status code alone. ``/live`` and
``/ready`` answer the same way (200, or 503 with the reason), each for its own question.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import CollectorRegistry

from cdcserver.ops.httpgate import ConnectionGate, client_host

log = logging.getLogger(__name__)

MAX_HEAD = 8192
REQUEST_TIMEOUT = 5.0
ANSWER_TIMEOUT = 10.0  # to take the answer: a client that does not read holds no socket
_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            500: "Internal Server Error", 503: "Service Unavailable"}

Health = Callable[[], tuple[bool, dict[str, Any]]]  # (good, the JSON document)


class MonitoringServer:
    def __init__(self, registry: CollectorRegistry, documents: dict[str, Health]) -> None:
        """``documents``: path -> what answers it (``/health``, ``/live``, ``/ready``)."""
        self.registry = registry
        self.documents = documents
        self._server: asyncio.base_events.Server | None = None
        self.gate = ConnectionGate("monitoring endpoint")

    async def start(self, host: str, port: int) -> tuple[str, int]:
        self._server = await asyncio.start_server(self._handle, host, port, limit=MAX_HEAD)
        sockname = self._server.sockets[0].getsockname()
        log.info("metrics and health on http://%s:%d/metrics, %s", sockname[0],
                 sockname[1], ", ".join(self.documents))
        return sockname[0], sockname[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
                      ) -> None:
        if not self.gate.admit(writer, client_host(writer.get_extra_info("peername")),
                               _drop):
            _drop(writer)
            return
        try:
            try:
                async with asyncio.timeout(REQUEST_TIMEOUT):
                    method, path = await _request_head(reader)
            except (TimeoutError, ValueError, asyncio.LimitOverrunError,
                    asyncio.IncompleteReadError, ConnectionError):
                await _respond(writer, 400, b"bad request\n", "text/plain")
                return
            self.gate.requested(writer)
            try:
                status, body, content_type = self._route(method, path)
            except Exception:  # a bug in a collector must not take the endpoint down
                log.exception("monitoring: %s %s failed", method, path)
                status, body, content_type = 500, b"internal error; see the log\n", \
                    "text/plain"
            await _respond(writer, status, b"" if method == "HEAD" else body, content_type,
                           length=len(body))
        finally:
            self.gate.release(writer)
            writer.close()
            with contextlib.suppress(ConnectionError, OSError, RuntimeError):
                await writer.wait_closed()

    def _route(self, method: str, path: str) -> tuple[int, bytes, str]:
        if method not in ("GET", "HEAD"):
            return 405, b"only GET and HEAD\n", "text/plain"
        if path == "/metrics":
            return 200, generate_latest(self.registry), CONTENT_TYPE_LATEST
        answer = self.documents.get(path)
        if answer is not None:
            good, document = answer()
            body = json.dumps(document, indent=1).encode() + b"\n"
            return (200 if good else 503), body, "application/json"
        return 404, f"try /metrics, {', '.join(self.documents)}\n".encode(), "text/plain"


async def _request_head(reader: asyncio.StreamReader) -> tuple[str, str]:
    """The method and path of a request; its headers are read and ignored."""
    request_line = (await reader.readuntil(b"\n")).decode("latin-1").strip()
    parts = request_line.split()
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        raise ValueError(request_line)
    total = len(request_line)
    while True:
        line = await reader.readuntil(b"\n")
        total += len(line)
        if total > MAX_HEAD:
            raise ValueError("request head too long")
        if not line.strip():
            break
    return parts[0].upper(), parts[1].split("?", 1)[0]


async def _respond(writer: asyncio.StreamWriter, status: int, body: bytes, content_type: str,
                   length: int | None = None) -> None:
    """The answer, within :data:`ANSWER_TIMEOUT` (else the connection is dropped)."""
    head = (f"HTTP/1.1 {status} {_REASONS[status]}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body) if length is None else length}\r\n"
            "Connection: close\r\n\r\n")
    try:
        writer.write(head.encode() + body)
        async with asyncio.timeout(ANSWER_TIMEOUT):
            await writer.drain()
    except TimeoutError:
        _drop(writer)
    except (ConnectionError, RuntimeError):
        pass


def _drop(writer: asyncio.StreamWriter) -> None:
    """Close a connection now, whatever it has not sent."""
    writer.transport.abort()
