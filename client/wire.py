"""The CDC protocol's grammar: commands, replies and error codes (``protocol.md``).

Shared by the server and the client library so the two cannot drift. No I/O here.

Replies are one line: ``OK`` or ``ERR <CODE> <message>``. A command ends at ``\\n`` (``\\r\\n``
accepted) or, for MaxScale's clients, which send one command per write without a newline, at
the end of the write.
"""

from __future__ import annotations

import binascii
import hashlib
import re
from dataclasses import dataclass
from enum import StrEnum


class Code(StrEnum):
    """Every error code the server sends, and what it means."""

    AUTH_FAILED = "AUTH-FAILED"  # unknown user or wrong password
    BAD_AUTH = "BAD-AUTH"  # the auth message is not hex(user:SHA1(password))
    REGISTRATION_FAILED = "REGISTRATION-FAILED"  # REGISTER is malformed
    NOT_REGISTERED = "NOT-REGISTERED"  # a command that needs REGISTER first
    UNKNOWN_COMMAND = "UNKNOWN-COMMAND"
    BAD_SYNTAX = "BAD-SYNTAX"  # a known command with malformed arguments
    NO_FILE = "NO-FILE"  # no such table, version or dump (MaxScale's code)
    NO_TRANSACTION = "NO-TRANSACTION"  # QUERY-TRANSACTION for a GTID the service has not seen
    FORBIDDEN = "FORBIDDEN"  # the user may not read that table
    THROTTLED = "THROTTLED"  # too many failed logins from this address: the server hangs up
    LINE_TOO_LONG = "LINE-TOO-LONG"
    TOO_MANY_ERRORS = "TOO-MANY-ERRORS"  # the bad-command budget is spent: the server hangs up
    TIMEOUT = "TIMEOUT"  # authentication or idle timeout: the server hangs up
    TOO_MANY_CONNECTIONS = "TOO-MANY-CONNECTIONS"
    STREAMING = "STREAMING"  # a command other than CLOSE arrived during a stream
    SHUTTING_DOWN = "SHUTTING-DOWN"
    INTERNAL = "INTERNAL"  # a server fault; the log has details


# Errors a client should answer by reconnecting later, rather than giving up.
RETRIABLE_CODES = frozenset({Code.SHUTTING_DOWN, Code.TIMEOUT, Code.TOO_MANY_CONNECTIONS,
                             Code.THROTTLED})


class ProtocolError(Exception):
    """An error reply. ``fatal`` errors close the connection after the reply."""

    def __init__(self, code: Code, message: str, *, fatal: bool = False) -> None:
        super().__init__(f"{code.value} {message}")
        self.code = code
        self.message = message
        self.fatal = fatal

    @property
    def retriable(self) -> bool:
        return self.code in RETRIABLE_CODES

    def reply(self) -> bytes:
        return error_line(self.code, self.message)


def error_line(code: Code, message: str) -> bytes:
    # One line, whatever the message contains.
    clean = " ".join(message.split())
    return f"ERR {code.value} {clean}\n".encode("utf-8", "replace")


OK = b"OK\n"


def parse_reply(line: bytes | str) -> tuple[bool, Code | None, str]:
    """(ok, code, message) of a reply line."""
    text = line.decode("utf-8", "replace") if isinstance(line, bytes) else line
    text = text.strip()
    if text == "OK" or text.startswith("OK "):
        return True, None, text[3:]
    if text.startswith("ERR"):
        parts = text.split(" ", 2)
        if len(parts) >= 2:
            try:
                return False, Code(parts[1]), parts[2] if len(parts) > 2 else ""
            except ValueError:
                pass
        return False, None, text
    raise ValueError(f"not a reply: {text[:80]!r}")


# -- authentication --------------------------------------------------------------------

def auth_message(user: str, password: str) -> bytes:
    """What a client sends: hex(user + ':') + hex(SHA1(password)) (MaxScale's cdc.py)."""
    return binascii.b2a_hex(user.encode("utf-8") + b":") + \
        hashlib.sha1(password.encode("utf-8")).hexdigest().encode("ascii")


def parse_auth(message: bytes) -> tuple[str, bytes]:
    """(user, SHA1(password)) from an auth message. Accepts either hex case and one trailing
    odd byte, as MaxScale does (cdc_plain_auth.cc)."""
    data = message.strip()
    if len(data) % 2:
        data = data[:-1]
    try:
        raw = binascii.a2b_hex(data)
    except (binascii.Error, ValueError):
        raise ProtocolError(Code.BAD_AUTH, "expected hex(user:SHA1(password))") from None
    user, sep, digest = raw.partition(b":")
    if not sep or len(digest) != 20 or not user:
        raise ProtocolError(Code.BAD_AUTH, "expected hex(user:SHA1(password))")
    try:
        return user.decode("utf-8"), digest
    except UnicodeDecodeError:
        raise ProtocolError(Code.BAD_AUTH, "the user name is not UTF-8") from None


def password_hash(password: str) -> str:
    """The users file's form: uppercase hex of SHA1(SHA1(password)) (MaxScale's cdcusers)."""
    return digest_hash(hashlib.sha1(password.encode("utf-8")).digest())


def digest_hash(sha1_of_password: bytes) -> str:
    return hashlib.sha1(sha1_of_password).hexdigest().upper()


# -- commands --------------------------------------------------------------------------

class Format(StrEnum):
    JSON = "JSON"
    AVRO = "AVRO"


_REGISTER = re.compile(r"^REGISTER\s+UUID=([^,\s]*)\s*,\s*TYPE=(\S+)\s*$", re.I)
_GTID = re.compile(r"^(\d+)-(\d+)-(\d+)$|^[0-9a-fA-F-]{36}:\d+$")
_GTID_STATE_ITEM = re.compile(r"^\d+-\d+-\d+$|^[0-9a-fA-F-]{36}:(?:\d+-)?\d+$")
_TABLE = re.compile(r"^(?P<db>[^.\s]+)\.(?P<table>[^.\s]+)(?:\.(?P<version>\d{6}))?$")


@dataclass(frozen=True)
class Command:
    verb: str
    argument: str  # the rest of the line, stripped


def split_command(line: str) -> Command:
    verb, _, rest = line.strip().partition(" ")
    return Command(verb.upper(), rest.strip())


def parse_register(line: str) -> tuple[str, Format]:
    m = _REGISTER.match(line.strip())
    if m is None:
        raise ProtocolError(Code.REGISTRATION_FAILED,
                            "expected REGISTER UUID=<id>, TYPE=JSON|AVRO")
    try:
        return m[1], Format(m[2].upper())
    except ValueError:
        raise ProtocolError(Code.REGISTRATION_FAILED,
                            f"TYPE must be JSON or AVRO, not {m[2]!r}") from None


@dataclass(frozen=True)
class DataRequest:
    database: str
    table: str
    version: int | None
    gtid: str | None  # inclusive: from this transaction's first record (MaxScale's form)
    after: str | None = None  # exclusive: every transaction this GTID state does not cover
    until: str | None = None  # bounded: only transactions this GTID state covers, then end

    def line(self) -> str:
        target = f"{self.database}.{self.table}"
        if self.version is not None:
            target += f".{self.version:06d}"
        if self.after:
            line = f"REQUEST-DATA {target} AFTER {self.after}"
        else:
            line = f"REQUEST-DATA {target}" + (f" {self.gtid}" if self.gtid else "")
        return line + (f" UNTIL {self.until}" if self.until else "")


def parse_request_data(argument: str) -> DataRequest:
    parts = argument.split()
    if not parts:
        raise ProtocolError(Code.BAD_SYNTAX, "expected REQUEST-DATA db.table[.version] "
                            "[gtid | AFTER gtid-state] [UNTIL gtid-state]")
    until = None
    if len(parts) >= 3 and parts[-2].upper() == "UNTIL":
        until, parts = parts[-1], parts[:-2]
        if not is_gtid_state(until):
            raise ProtocolError(Code.BAD_SYNTAX, f"not a GTID state: {until!r} (expected "
                                "domain-server-seq[,domain-server-seq...])")
    m = _TABLE.match(parts[0])
    if m is None:
        raise ProtocolError(Code.NO_FILE, f"File '{parts[0]}' not found: expected "
                            "db.table or db.table.NNNNNN")
    version = int(m["version"]) if m["version"] else None
    if version == 0:
        raise ProtocolError(Code.NO_FILE, "versions start at 000001")
    gtid = after = None
    if len(parts) == 3 and parts[1].upper() == "AFTER":
        after = parts[2]
        if not is_gtid_state(after):
            raise ProtocolError(Code.BAD_SYNTAX, f"not a GTID state: {after!r} (expected "
                                "domain-server-seq[,domain-server-seq...])")
    elif len(parts) == 2:
        gtid = parts[1]
        if not _GTID.match(gtid):
            raise ProtocolError(Code.BAD_SYNTAX,
                                f"not a GTID: {gtid!r} (expected domain-server-seq)")
    elif len(parts) > 1:
        raise ProtocolError(Code.BAD_SYNTAX, "expected REQUEST-DATA db.table[.version] "
                            "[gtid | AFTER gtid-state]")
    return DataRequest(m["db"], m["table"], version, gtid, after, until)


def is_gtid_state(text: str) -> bool:
    items = text.split(",")
    return bool(text) and all(_GTID_STATE_ITEM.match(i) for i in items)


@dataclass(frozen=True)
class DumpRequest:
    """``REQUEST-DUMP <name | db.table> [FOLLOW]``: a dump by file name, or a table's newest."""

    target: str
    follow: bool = False

    def line(self) -> str:
        return f"REQUEST-DUMP {self.target}" + (" FOLLOW" if self.follow else "")

    @property
    def table(self) -> tuple[str, str] | None:
        """(database, table) when the target names a table rather than a file."""
        m = _TABLE.match(self.target)
        return (m["db"], m["table"]) if m and not m["version"] else None


_DUMP_NAME = re.compile(r"^[^.\s/]+\.[^.\s/]+\.\d{8}T\d{6}-\d{6}Z\.dump$")


def parse_request_dump(argument: str) -> DumpRequest:
    parts = argument.split()
    usage = "expected REQUEST-DUMP <dump name | db.table> [FOLLOW]"
    if not parts or len(parts) > 2 or (len(parts) == 2 and parts[1].upper() != "FOLLOW"):
        raise ProtocolError(Code.BAD_SYNTAX, usage)
    request = DumpRequest(parts[0], len(parts) == 2)
    if request.table is None and not _DUMP_NAME.match(parts[0]):
        raise ProtocolError(Code.NO_FILE, f"'{parts[0]}' is neither db.table nor a dump name")
    return request


def parse_list_dumps(argument: str) -> tuple[str, str] | None:
    if not argument:
        return None
    m = _TABLE.match(argument)
    if m is None or m["version"]:
        raise ProtocolError(Code.BAD_SYNTAX, "expected LIST-DUMPS [db.table]")
    return m["db"], m["table"]


@dataclass(frozen=True)
class RangeQuery:
    """``QUERY-RANGE db.table [AFTER gtid-state] [UNTIL gtid-state] LIMIT n``: where a
    bounded read of the table that starts after the first state and holds at most ``n``
    records can end (no further than the second state)."""

    database: str
    table: str
    after: str
    limit: int
    until: str = ""

    def line(self) -> str:
        after = f" AFTER {self.after}" if self.after else ""
        until = f" UNTIL {self.until}" if self.until else ""
        return f"QUERY-RANGE {self.database}.{self.table}{after}{until} LIMIT {self.limit}"


def parse_query_range(argument: str) -> RangeQuery:
    usage = "expected QUERY-RANGE db.table [AFTER gtid-state] [UNTIL gtid-state] LIMIT n"
    parts = argument.split()
    if len(parts) < 3 or len(parts) % 2 == 0 or parts[-2].upper() != "LIMIT" \
            or not parts[-1].isdigit() or int(parts[-1]) < 1:
        raise ProtocolError(Code.BAD_SYNTAX, usage)
    m = _TABLE.match(parts[0])
    if m is None or m["version"]:
        raise ProtocolError(Code.BAD_SYNTAX, usage)
    states: dict[str, str] = {}
    for word, state in zip(parts[1:-2:2], parts[2:-2:2], strict=True):
        if word.upper() not in ("AFTER", "UNTIL") or word.upper() in states \
                or not is_gtid_state(state):
            raise ProtocolError(Code.BAD_SYNTAX, usage)
        states[word.upper()] = state
    return RangeQuery(m["db"], m["table"], states.get("AFTER", ""), int(parts[-1]),
                      states.get("UNTIL", ""))


def is_gtid(text: str) -> bool:
    return bool(_GTID.match(text))
