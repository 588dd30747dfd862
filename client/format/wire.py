"""The CDC protocol's grammar: commands, replies and error codes (``protocol.md``).

Shared by the server and the client library so the two cannot drift. No I/O here.

Replies are one line: ``OK`` or ``ERR <CODE> <message>``. A command ends at ``\\n`` (``\\r\\n``
accepted) or, for MaxScale's clients, which send one command per write without a newline, at
the end of the write.
"""

from __future__ import annotations

import binascii
import hashlib
import json
import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from mariadb_cdc_client.format.gtid import is_gtid, is_gtid_state
from mariadb_cdc_client.format.names import (
    SPACE_RULE,
    BadTableRef,
    Table,
    TableRef,
    parse_table,
    read_name,
    read_table,
    spaced_hint,
    table_ref,
)


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
    THROTTLED = "THROTTLED"  # too many new passwords tried for this user from this address
    LINE_TOO_LONG = "LINE-TOO-LONG"
    TOO_MANY_ERRORS = "TOO-MANY-ERRORS"  # the bad-command budget is spent: the server hangs up
    TIMEOUT = "TIMEOUT"  # authentication or idle timeout: the server hangs up
    TOO_MANY_CONNECTIONS = "TOO-MANY-CONNECTIONS"
    STREAMING = "STREAMING"  # a command other than CLOSE arrived during a stream
    SHUTTING_DOWN = "SHUTTING-DOWN"
    QUARANTINED = "QUARANTINED"  # the table's stream stopped here until it is resynced
    INTERNAL = "INTERNAL"  # a server fault; the log has details


# Errors a client should answer by reconnecting later, rather than giving up (a quarantined
# table's stream continues, exact, once the service has resynced it).
RETRIABLE_CODES = frozenset({Code.SHUTTING_DOWN, Code.TIMEOUT, Code.TOO_MANY_CONNECTIONS,
                             Code.THROTTLED, Code.QUARANTINED})


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
    # One line, whatever the message contains; other white space is kept, since a message
    # may quote a name (`my  db`) for the client to send back.
    clean = " ".join(message.splitlines()).strip()
    return f"ERR {code.value} {clean}\n".encode("utf-8", "replace")


OK = b"OK\n"
REPLY_MAX = 1 << 24  # bytes of a reply line (a login's answer, a query's JSON) a client takes


def json_answer(line: bytes) -> dict[str, Any]:
    """A query's JSON answer, which is an object (ValueError for anything else a server
    sends)."""
    answer = json.loads(line)
    if not isinstance(answer, dict):
        raise ValueError(f"the server's answer is not a JSON object: {line[:100]!r}")
    return answer


def objects(answer: dict[str, Any], key: str) -> list[dict[str, Any]]:
    """``answer[key]``, a list of objects (ValueError for anything else)."""
    found = answer.get(key)
    if not isinstance(found, list) or not all(isinstance(item, dict) for item in found):
        raise ValueError(f"the server's answer has no list of objects {key!r}")
    return found


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


MAX_USER_NAME = 43  # characters: the longest name a users file holds (MaxScale's limit)


def parse_auth(message: bytes) -> tuple[str, bytes]:
    """(user, SHA1(password)) from an auth message. Accepts either hex case and one trailing
    odd byte, as MaxScale does (cdc_plain_auth.cc). A name longer than any user may have is
    refused here, unchecked."""
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
        name = user.decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError(Code.BAD_AUTH, "the user name is not UTF-8") from None
    if len(name) > MAX_USER_NAME:
        raise ProtocolError(Code.BAD_AUTH, f"a user name has at most {MAX_USER_NAME} "
                            "characters")
    return name, digest


_HEX = frozenset(b"0123456789abcdefABCDEF")
_LONGEST_AUTH = 2 * (256 + 1 + 20) + 1  # hex of a generous user name, ':', the digest


def auth_incomplete(message: bytes) -> bool:
    """Whether an auth message that arrived without a newline is only the start of one: hex
    that does not yet hold ``user:`` and 20 digest bytes. A client may send the login in
    several writes; anything else (complete, or not hex at all) is judged as it is."""
    data = message.strip()
    if not data or len(data) > _LONGEST_AUTH or not _HEX.issuperset(data):
        return False
    raw = binascii.a2b_hex(data[:len(data) - len(data) % 2])
    _, sep, digest = raw.partition(b":")
    return not sep or len(digest) < 20


def password_hash(password: str) -> str:
    """The users file's form: uppercase hex of SHA1(SHA1(password)) (MaxScale's cdcusers)."""
    return digest_hash(hashlib.sha1(password.encode("utf-8")).digest())


def digest_hash(sha1_of_password: bytes) -> str:
    return hashlib.sha1(sha1_of_password).hexdigest().upper()


# -- commands --------------------------------------------------------------------------

class Format(StrEnum):
    JSON = "JSON"
    AVRO = "AVRO"


class Dialect(StrEnum):
    """How JSON mode renders schemas and values (protocol.md, "JSON dialects")."""

    MAXSCALE = "maxscale"  # what MaxScale's clients parse: primitive types only
    EXACT = "exact"  # logical types, every value exact in its own type


_REGISTER = re.compile(r"^REGISTER\s+UUID=([^,\s]*)\s*,\s*TYPE=([^,\s]+)"
                       r"(?:\s*,\s*DIALECT=(\S+))?\s*$", re.I)


@dataclass(frozen=True)
class Command:
    verb: str
    argument: str  # the rest of the line, stripped


def split_command(line: str) -> Command:
    verb, _, rest = line.strip().partition(" ")
    return Command(verb.upper(), rest.strip())


@dataclass(frozen=True)
class Registration:
    uuid: str
    format: Format
    dialect: Dialect | None = None  # None: the server's choice for this user


def parse_register(line: str) -> Registration:
    """``REGISTER UUID=id, TYPE=JSON|AVRO`` and the extension ``, DIALECT=EXACT|MAXSCALE``
    (MaxScale reads only the four bytes after ``TYPE=``, so it ignores the extension)."""
    m = _REGISTER.match(line.strip())
    if m is None:
        raise ProtocolError(Code.REGISTRATION_FAILED,
                            "expected REGISTER UUID=<id>, TYPE=JSON|AVRO[, DIALECT=EXACT|MAXSCALE]")
    try:
        fmt = Format(m[2].upper())
    except ValueError:
        raise ProtocolError(Code.REGISTRATION_FAILED,
                            f"TYPE must be JSON or AVRO, not {m[2]!r}") from None
    try:
        dialect = Dialect(m[3].lower()) if m[3] else None
    except ValueError:
        raise ProtocolError(Code.REGISTRATION_FAILED,
                            f"DIALECT must be EXACT or MAXSCALE, not {m[3]!r}") from None
    return Registration(m[1], fmt, dialect)


# What the project's own clients ask for: the exact dialect, so nothing they return depends on
# the server's default (AVRO mode has no dialect).
CLIENT_DIALECT = {Format.JSON: Dialect.EXACT, Format.AVRO: None}


def register_line(uuid: str, fmt: Format, dialect: Dialect | None = None) -> str:
    line = f"REGISTER UUID={uuid}, TYPE={fmt.value}"
    return line if dialect is None else f"{line}, DIALECT={dialect.value.upper()}"


@dataclass(frozen=True)
class DataRequest:
    database: str
    table: str
    version: int | None
    gtid: str | None  # inclusive: from this transaction's first record (MaxScale's form)
    after: str | None = None  # exclusive: every transaction this GTID state does not cover
    until: str | None = None  # bounded: only transactions this GTID state covers, then end

    def line(self) -> str:
        target = str(TableRef(self.database, self.table, self.version))
        if self.after:
            line = f"REQUEST-DATA {target} AFTER {self.after}"
        else:
            line = f"REQUEST-DATA {target}" + (f" {self.gtid}" if self.gtid else "")
        return line + (f" UNTIL {self.until}" if self.until else "")


_REQUEST_DATA = "REQUEST-DATA db.table[.version] [gtid | AFTER gtid-state] [UNTIL gtid-state]"


def parse_request_data(argument: str) -> DataRequest:
    # A bare reference that names no table is MaxScale's NO-FILE (cdc.py prints it).
    ref, words = _table(argument, _REQUEST_DATA, Code.NO_FILE, {"AFTER", "UNTIL"},
                        version=True)
    until = after = gtid = None
    if len(words) >= 2 and words[-2].upper() == "UNTIL":
        until, words = _gtid_state(words[-1]), words[:-2]
    if ref.version == 0:
        raise ProtocolError(Code.NO_FILE, "versions start at 000001")
    if len(words) == 2 and words[0].upper() == "AFTER":
        after = _gtid_state(words[1])
    elif len(words) == 1 and is_gtid(words[0]):
        gtid = words[0]
    elif words:
        hint = _spaced(argument, ref, {"AFTER", "UNTIL"}, version=True)
        if len(words) == 1 and (_positional(words[0]) or _gtid_like(words[0])):
            raise _not_a_gtid(words[0], hint)
        raise _misplaced(hint, _REQUEST_DATA)
    return DataRequest(ref.database, ref.table, ref.version, gtid, after, until)


def _gtid_state(text: str) -> str:
    if not is_gtid_state(text):
        raise ProtocolError(Code.BAD_SYNTAX, f"not a GTID state: {text!r} (expected "
                            "domain-server-seq[,domain-server-seq...])")
    return text


def _table(argument: str, usage: str, code: Code, keywords: set[str], *,
           version: bool = False) -> tuple[TableRef, list[str]]:
    """The table a command's argument names first, and the words after it. A bare reference
    that names no table is ``code``; a quoting mistake, or a name with a space sent bare,
    is BAD-SYNTAX, saying how to quote it."""
    if not argument.strip():
        raise ProtocolError(Code.BAD_SYNTAX, f"expected {usage}")
    try:
        ref, rest = read_table(argument, version=version)
    except BadTableRef as exc:
        hint = _spaced(argument, None, keywords, version=version)
        if hint is not None:
            raise _misplaced(hint, usage) from None
        raise ProtocolError(Code.BAD_SYNTAX if exc.quoted else code, str(exc)) from None
    return ref, rest.split()


def _spaced(argument: str, ref: TableRef | None, keywords: set[str], *,
            version: bool = False) -> str | None:
    """The reference a bare request most likely meant when it sent a name holding a space
    bare (``REQUEST-DATA db.my table``): its words up to the first that a command takes
    after a table (a keyword, a GTID, a number), quoted. None if there is no such name."""
    if ref is not None and ref.quoted:
        return None
    end = 0
    for m in re.finditer(r"\S+", argument):
        if m[0].upper() in keywords or _positional(m[0]):
            break
        end = m.end()
    return spaced_hint(argument[:end], version=version)


def _positional(word: str) -> bool:
    """A GTID, a GTID state or a number (what follows a table in a command), even a
    malformed one: digits with dashes, colons and commas, or a MySQL source UUID's."""
    return _POSITIONAL.fullmatch(word) is not None


_POSITIONAL = re.compile(r"[0-9][0-9:,-]*|[0-9a-fA-F-]{36}:[0-9:,-]*")


def _gtid_like(word: str) -> bool:
    """A word a client meant as a GTID, however malformed: MaxScale's grammar has a GTID
    after the table, and GTIDs hold dashes (``0-1-5``) or a colon (``uuid:5``)."""
    return "-" in word or ":" in word


def _not_a_gtid(word: str, hint: str | None) -> ProtocolError:
    """The one word after the table is not a GTID; it might still be the end of a name
    with a space, sent bare: say how to quote it too."""
    message = f"not a GTID: {word!r} (expected domain-server-seq)"
    if hint is not None:
        message += f"; if it is part of the table's name, {SPACE_RULE}: {hint}"
    return ProtocolError(Code.BAD_SYNTAX, message)


def _misplaced(hint: str | None, usage: str) -> ProtocolError:
    """Words where none belong: most often the rest of a name with a space, sent bare."""
    if hint is not None:
        return ProtocolError(Code.BAD_SYNTAX, f"{SPACE_RULE}: {hint}")
    return ProtocolError(Code.BAD_SYNTAX, f"expected {usage}")


@dataclass(frozen=True)
class DumpRequest:
    """``REQUEST-DUMP <name | db.table> [DATABUS | FOLLOW]``: a dump by file name, or a
    table's newest (``target`` as the command carries it: :meth:`of` quotes a table's
    names); ``databus``: in mysql-databus's layout (one RowsEvent per line) instead of
    ``cdc-dump/1``."""

    target: str
    follow: bool = False
    databus: bool = False

    @classmethod
    def of(cls, target: Table, follow: bool = False, databus: bool = False) -> DumpRequest:
        """A request for a dump name or a reference as commands write it, or for the newest
        dump of the table the two names name."""
        return cls(table_ref(*target) if isinstance(target, tuple) else target, follow,
                   databus)

    def line(self) -> str:
        return f"REQUEST-DUMP {self.target}" + (" FOLLOW" if self.follow else "") + (
            " DATABUS" if self.databus else "")

    @property
    def table(self) -> tuple[str, str] | None:
        """(database, table) when the target names a table rather than a file."""
        if _DUMP_NAME.match(self.target):
            return None
        try:
            ref = parse_table(self.target)
        except BadTableRef:
            return None
        return ref.database, ref.table


# Dump files are named as version files are, their names escaped: no dot, space or slash.
_DUMP_NAME = re.compile(r"^[^.\s/`\"]+\.[^.\s/]+\.\d{8}T\d{6}-\d{6}Z\.dump$")
_REQUEST_DUMP = "REQUEST-DUMP <dump name | db.table> [DATABUS | FOLLOW]"


def parse_request_dump(argument: str) -> DumpRequest:
    words = argument.split()
    if words and _DUMP_NAME.match(words[0]):
        target, words = words[0], words[1:]
        ref = None
    else:
        try:
            ref, words = _table(argument, _REQUEST_DUMP, Code.NO_FILE, _DUMP_WORDS)
        except ProtocolError as exc:
            if exc.code != Code.NO_FILE:
                raise
            if words[1:] and [w.upper() for w in words[1:]] not in _DUMP_OPTIONS:
                raise ProtocolError(Code.BAD_SYNTAX, f"expected {_REQUEST_DUMP}") from None
            raise ProtocolError(Code.NO_FILE, f"not a dump name, and {exc.message}") from None
        target = table_ref(ref.database, ref.table)
    upper = [w.upper() for w in words]
    if upper and upper not in _DUMP_OPTIONS:
        if set(upper) == _DUMP_WORDS:
            raise ProtocolError(Code.BAD_SYNTAX, "DATABUS and FOLLOW cannot be combined: a "
                                "databus consumer follows a dump from Kafka")
        raise _misplaced(_spaced(argument, ref, _DUMP_WORDS) if ref else None, _REQUEST_DUMP)
    return DumpRequest(target, upper == ["FOLLOW"], upper == ["DATABUS"])


_DUMP_WORDS = {"FOLLOW", "DATABUS"}
_DUMP_OPTIONS = (["FOLLOW"], ["DATABUS"])


_START_DUMP = "START-DUMP db.table|db.* [db.table|db.* ...]"


def parse_start_dump(argument: str) -> list[tuple[str, str | None]]:
    """``START-DUMP`` (extension): the tables to dump now, each ``db.table`` or ``db.*``
    (every table of ``db``; the table part is then None, so that a table named ``*``,
    quoted, is itself), separated by spaces (a bare name may hold a comma, as everywhere in
    this protocol)."""
    rest = argument.strip()
    if not rest:
        raise ProtocolError(Code.BAD_SYNTAX, f"expected {_START_DUMP}")
    refs: list[tuple[str, str | None]] = []
    while rest:
        try:
            database, pos, quoted = read_name(rest, 0)
            if (database or quoted) and rest.startswith(".*", pos) and \
                    rest[pos + 2:pos + 3] in ("", " ", "\t"):
                refs.append((database, None))
                rest = rest[pos + 2:]
            else:
                ref, rest = read_table(rest)
                refs.append((ref.database, ref.table))
        except BadTableRef as exc:
            raise ProtocolError(Code.BAD_SYNTAX, f"{exc}; expected {_START_DUMP}") from None
        rest = rest.lstrip(" \t")
    return refs


def parse_list_dumps(argument: str) -> tuple[str, str] | None:
    if not argument.strip():
        return None
    ref, words = _table(argument, "LIST-DUMPS [db.table]", Code.BAD_SYNTAX, set())
    if words:
        raise _misplaced(_spaced(argument, ref, set()), "LIST-DUMPS [db.table]")
    return ref.database, ref.table


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
        return f"QUERY-RANGE {table_ref(self.database, self.table)}{after}{until} " \
               f"LIMIT {self.limit}"


_QUERY_RANGE = "QUERY-RANGE db.table [AFTER gtid-state] [UNTIL gtid-state] LIMIT n"
MAX_LIMIT = 10 ** 18  # a LIMIT above it is taken as it
_RANGE_WORDS = {"AFTER", "UNTIL", "LIMIT"}


def parse_query_range(argument: str) -> RangeQuery:
    ref, words = _table(argument, _QUERY_RANGE, Code.BAD_SYNTAX, _RANGE_WORDS)
    if len(words) < 2 or len(words) % 2 or words[-2].upper() != "LIMIT":
        raise _misplaced(_spaced(argument, ref, _RANGE_WORDS), _QUERY_RANGE)
    limit = words[-1].lstrip("0")
    if not re.fullmatch("[1-9][0-9]*", limit):
        raise ProtocolError(Code.BAD_SYNTAX, f"LIMIT is a positive number, not {words[-1]!r}")
    # (int() refuses a text of 4,300 digits or more; a range never holds 10^18 events)
    limit = limit if len(limit) <= 18 else str(MAX_LIMIT)
    states: dict[str, str] = {}
    for word, state in zip(words[:-2:2], words[1:-2:2], strict=True):
        if word.upper() not in ("AFTER", "UNTIL") or word.upper() in states:
            raise _misplaced(_spaced(argument, ref, _RANGE_WORDS), _QUERY_RANGE)
        states[word.upper()] = _gtid_state(state)
    return RangeQuery(ref.database, ref.table, states.get("AFTER", ""), int(limit),
                      states.get("UNTIL", ""))
