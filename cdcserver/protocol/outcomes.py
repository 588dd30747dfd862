"""What a session's state machine (``session.py``) answers a message with: the phase it is
in, and the outcomes the connection task (``server.py``) carries out, a reply, a stream or
a dump to send, or a wait before a reply. A typed query (``queries.py``) is the other
outcome: the connection runs it off the event loop."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from cdcserver.dump.files import DumpInfo
from cdcserver.protocol.queries import Query
from cdcserver.protocol.requests import StreamRequest
from mariadb_cdc_client.format.wire import Dialect, Format


class Phase(StrEnum):
    AUTH = "auth"
    REGISTER = "register"
    READY = "ready"
    STREAMING = "streaming"
    CLOSED = "closed"


@dataclass(frozen=True)
class Reply:
    data: bytes
    close: bool = False


@dataclass(frozen=True)
class StartStream:
    request: StreamRequest
    format: Format
    dialect: Dialect = Dialect.MAXSCALE  # JSON mode


@dataclass(frozen=True)
class SendDump:
    """Send a dump file; then, with ``follow``, stream the changes after it."""

    dump: DumpInfo
    follow: StreamRequest | None
    format: Format
    dialect: Dialect = Dialect.MAXSCALE  # JSON mode
    databus: bool = False  # in mysql-databus's layout (cdcserver.dump.databus)


@dataclass(frozen=True)
class Delay:
    """Wait ``seconds`` (without blocking other connections), then take ``then``'s outcome."""

    seconds: float
    then: Callable[[], Reply]


Outcome = Reply | StartStream | SendDump | Query | Delay
