"""Which tables the service captures: what ``[capture] include`` and ``exclude`` select, never
the system schemas' tables unless named, never the password tables.

``include`` and ``exclude`` are comma-separated ``db.table`` patterns (``shop.*``,
``crm.customers``, ``*.audit_*``): ``*`` in a bare name stands for any characters, a name in
backquotes or JSON quotes is exact (protocol.md, "Table names": ```my.db`.t``). A table is
captured when ``include`` is empty or one of its patterns matches it, and no pattern of
``exclude`` does. Names compare as MariaDB compares them on Linux: exactly, case included.

``mysql``, ``information_schema``, ``performance_schema`` and ``sys`` hold the server's own
data; ``mysql.global_priv`` (and the view ``mysql.user`` before it) hold every account's
password hash. A replication user with ``SELECT ON *.*`` (what dumps need) could otherwise
dump them, and the service would stream their changes to any client allowed every table.
Their tables are captured, streamed and dumped only when ``[capture] system_tables`` names
them one by one (``include`` does not reach them); the password tables never are.

The filter is applied where a table enters the service: the decoder drops an excluded table's
row events after reading its table map (and its schema statements from the stream), dumps
refuse it, and the listener serves none of it, even what an earlier configuration stored.

Column rules (``columns_exclude``, ``columns_hash``, ``columns_mask``: ``db.table.column``
patterns; a column name compares as MariaDB compares it, without case) say what becomes of a
captured table's columns: left out, stored as the hex SHA-256 of the salt and the value, or
masked (the first N characters kept, then ``***``). :class:`ColumnRules` says which rule a
column has; :mod:`cdcserver.schema.masking` applies them to layouts and definitions, and
:func:`value_function` to values.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from cdcserver.core.errors import ConfigError
from cdcserver.core.names import TableName
from mariadb_cdc_client.format.names import BadTableRef, read_name, split_list


class CaptureSettings(Protocol):
    """What the rules read of ``[capture]`` (``cdcserver.core.config``'s section)."""

    @property
    def system_tables(self) -> str: ...

    @property
    def include(self) -> str: ...

    @property
    def exclude(self) -> str: ...

    @property
    def columns_exclude(self) -> str: ...

    @property
    def columns_hash(self) -> str: ...

    @property
    def columns_mask(self) -> str: ...

    def hash_salt(self) -> bytes | None: ...

SYSTEM_SCHEMAS = frozenset({"mysql", "information_schema", "performance_schema", "sys"})
NEVER = frozenset({("mysql", "global_priv"), ("mysql", "user")})  # password hashes
_BARE_PATTERN = re.compile(r"[^\s.,`\"]+")  # a bare name, `*` allowed


@dataclass(frozen=True)
class TablePattern:
    """``db.table`` where each part is an exact name or a bare name with ``*`` wildcards."""

    text: str
    database: re.Pattern[str]
    table: re.Pattern[str]

    @classmethod
    def parse(cls, text: str) -> TablePattern:
        """One pattern; ValueError says what is wrong with it."""
        text = text.strip()
        if text == "*":
            text = "*.*"
        database, pos = _part(text, 0)
        if not text.startswith(".", pos):
            raise ValueError(f"{text!r} is not a db.table pattern (e.g. shop.*, crm.customers)")
        table, end = _part(text, pos + 1)
        if end != len(text):
            raise ValueError(f"{text!r} is not one db.table pattern: {text[end:]!r} follows")
        return cls(text, database, table)

    def matches(self, table: TableName) -> bool:
        return bool(self.database.fullmatch(table.database) and
                    self.table.fullmatch(table.table))


def _part(text: str, pos: int) -> tuple[re.Pattern[str], int]:
    """The name at ``pos`` as a pattern: quoted, exact; bare, with ``*`` for any characters."""
    if text.startswith(("`", '"'), pos):
        try:
            name, end, _ = read_name(text, pos)
        except BadTableRef as exc:
            raise ValueError(str(exc)) from None
        return re.compile(re.escape(name), re.DOTALL), end
    m = _BARE_PATTERN.match(text, pos)
    if m is None:
        raise ValueError(f"{text!r}: a name is missing at character {pos + 1}")
    return re.compile(".*".join(re.escape(p) for p in m[0].split("*")), re.DOTALL), m.end()


def parse_patterns(text: str) -> tuple[TablePattern, ...]:
    """``[capture] include``/``exclude``: comma-separated patterns (commas in quotes kept)."""
    return tuple(TablePattern.parse(item) for item in split_list(text))


@dataclass(frozen=True)
class TableSelection:
    """Include and exclude patterns: what ``[capture]`` captures of the user tables, and what
    a sink publishes of what is captured (``[kafka] include``/``exclude``); ``section``
    names the settings in the reasons."""

    include: tuple[TablePattern, ...] = ()
    exclude: tuple[TablePattern, ...] = ()
    section: str = "capture"

    @classmethod
    def parse(cls, include: str, exclude: str, section: str = "capture") -> TableSelection:
        return cls(parse_patterns(include), parse_patterns(exclude), section)

    @property
    def everything(self) -> bool:
        return not self.include and not self.exclude

    def selects(self, table: TableName) -> bool:
        return self.why_not(table) is None

    def why_not(self, table: TableName) -> str | None:
        """Why the patterns leave the table out (None: they select it)."""
        if self.include and not any(p.matches(table) for p in self.include):
            return f"[{self.section}] include does not select it"
        excluded = next((p for p in self.exclude if p.matches(table)), None)
        if excluded is not None:
            return f"[{self.section}] exclude leaves it out ({excluded.text})"
        return None





# -- column rules ---------------------------------------------------------------------------

EXCLUDE, HASH, MASK = "exclude", "hash", "mask"
MASK_TAIL = "***"


@dataclass(frozen=True)
class ColumnPattern:
    """``db.table.column``, each part an exact name or a bare name with ``*``; a mask's may
    end ``:N``, the characters it keeps."""

    text: str
    table: TablePattern
    column: re.Pattern[str]
    keep: int = 0

    @classmethod
    def parse(cls, text: str, keep: bool = False) -> ColumnPattern:
        text = text.strip()
        kept = 0
        if keep:
            m = re.fullmatch(r"(.*):([0-9]+)", text, re.DOTALL)  # a quoted name ends in
            if m is not None:  # its quote, so ":N" at the end is never inside one
                text, kept = m[1], int(m[2])
        database, pos = _part(text, 0)
        table, pos = _after_dot(text, pos, "db.table.column")
        column, end = _after_dot(text, pos, "db.table.column")
        if end != len(text):
            raise ValueError(f"{text!r} is not one db.table.column pattern: {text[end:]!r} "
                             "follows")
        whole = TablePattern(text, database, table)
        return cls(text, whole, re.compile(column.pattern, re.DOTALL | re.IGNORECASE), kept)

    def matches(self, table: TableName, column: str) -> bool:
        return self.table.matches(table) and bool(self.column.fullmatch(column))


def _after_dot(text: str, pos: int, shape: str) -> tuple[re.Pattern[str], int]:
    if not text.startswith(".", pos):
        raise ValueError(f"{text!r} is not a {shape} pattern (e.g. shop.users.email)")
    return _part(text, pos + 1)


def parse_column_patterns(text: str, keep: bool = False) -> tuple[ColumnPattern, ...]:
    return tuple(ColumnPattern.parse(item, keep) for item in split_list(text))


class ColumnRules:
    """Which rule each column of a captured table has: ``exclude`` before ``hash`` before
    ``mask``, the first pattern that matches. ``salt`` is the hash's (required when any
    column is hashed)."""

    def __init__(self, exclude: Iterable[ColumnPattern] = (), hash: Iterable[ColumnPattern] = (),
                 mask: Iterable[ColumnPattern] = (), salt: bytes | None = None) -> None:
        self.exclude = tuple(exclude)
        self.hash = tuple(hash)
        self.mask = tuple(mask)
        self.salt = salt
        if self.hash and not salt:
            raise ValueError("[capture] columns_hash needs a salt: set capture.hash_salt_file "
                             "(--hash-salt-file) or the environment variable "
                             "CDCSERVER_HASH_SALT")

    @classmethod
    def of(cls, capture: CaptureSettings) -> ColumnRules:
        """The rules ``[capture]`` declares (ConfigError when a hash has no salt)."""
        hashes = parse_column_patterns(capture.columns_hash)
        try:
            return cls(parse_column_patterns(capture.columns_exclude), hashes,
                       parse_column_patterns(capture.columns_mask, keep=True),
                       capture.hash_salt() if hashes else None)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None

    def __bool__(self) -> bool:
        return bool(self.exclude or self.hash or self.mask)

    def rule(self, table: TableName, column: str) -> str | None:
        """``exclude``, ``hash``, ``mask:N`` or None (the clear value)."""
        if any(p.matches(table, column) for p in self.exclude):
            return EXCLUDE
        if any(p.matches(table, column) for p in self.hash):
            return HASH
        mask = next((p for p in self.mask if p.matches(table, column)), None)
        return None if mask is None else f"{MASK}:{mask.keep}"

    def touches(self, table: TableName) -> bool:
        """Whether any pattern could name a column of ``table``."""
        return any(p.table.matches(table) for p in (*self.exclude, *self.hash, *self.mask))

    def describe(self) -> list[str]:
        """The rules in words, for ``cdcserver check`` (the salt never)."""
        return ([f"exclude {p.text}" for p in self.exclude] +
                [f"hash {p.text}" for p in self.hash] +
                [f"mask {p.text}" + (f" keeping {p.keep}" if p.keep else "")
                 for p in self.mask])


NO_COLUMN_RULES = ColumnRules()

# What a schema statement of a table under column rules is shown as (in the schema's ``ddl``
# key, in Kafka's DDL events): its text may name an excluded column or hold a value in clear
RULED_STATEMENT = "(not shown: [capture] column rules apply to this table)"
# why a repair re-reads such a table after a schema change (the column-by-column reasons
# name columns, an excluded one's too, and their types)
RULED_REWRITES = f"a schema change may have rewritten stored values {RULED_STATEMENT}"


def salt_id(salt: bytes) -> str:
    """What names a salt in a hashed column's field (protocol.md, "Masked columns"): hashes
    made with two salts never share a version. A one-way digest, under a label of its
    own, so that it is not the hash of any value."""
    return hashlib.sha256(b"cdcserver salt id\0" + salt).hexdigest()[:16]


def hash_value(salt: bytes, value: str | bytes) -> str:
    """The hex SHA-256 of the salt and the value (a string's UTF-8): what MariaDB's
    ``SHA2(CONCAT(salt, value), 256)`` gives for a utf8mb4 value."""
    data = value.encode("utf-8", "surrogateescape") if isinstance(value, str) else value
    return hashlib.sha256(salt + data).hexdigest()


def mask_value(keep: int, value: str | bytes) -> str | bytes:
    """The first ``keep`` characters (bytes, for binary data), then ``***``: MariaDB's
    ``CONCAT(LEFT(value, keep), '***')``."""
    if isinstance(value, str):
        return value[:keep] + MASK_TAIL
    return bytes(value[:keep]) + MASK_TAIL.encode()


def value_function(rule: str, salt: bytes | None) -> Callable[[Any], Any]:
    """What a hashed or masked column's value becomes (NULL stays NULL)."""
    if rule == HASH:
        if not salt:
            raise ValueError("a hashed column without a salt")
        digest = salt

        def hashed(value: Any) -> Any:
            return None if value is None else hash_value(digest, value)
        return hashed
    kind, _, keep = rule.partition(":")
    if kind != MASK:
        raise ValueError(f"no value function for the column rule {rule!r}")
    kept = int(keep or 0)

    def masked(value: Any) -> Any:
        return None if value is None else mask_value(kept, value)
    return masked


class CaptureFilter:
    def __init__(self, system_tables: Iterable[TableName] = (),
                 include: Iterable[TablePattern] = (),
                 exclude: Iterable[TablePattern] = (),
                 columns: ColumnRules = NO_COLUMN_RULES) -> None:
        self.system_tables = frozenset(
            t for t in system_tables if (t.database.lower(), t.table.lower()) not in NEVER)
        self.selection = TableSelection(tuple(include), tuple(exclude))
        self.columns = columns  # what becomes of the captured tables' columns

    @classmethod
    def parse(cls, system_tables: str, include: str = "", exclude: str = "") -> CaptureFilter:
        """As ``[capture]`` holds them: ``system_tables`` names ``db.table,db.table``,
        ``include`` and ``exclude`` hold patterns."""
        named = (TableName.from_ref(item) for item in split_list(system_tables))
        return cls(named, parse_patterns(include), parse_patterns(exclude))

    @classmethod
    def of(cls, capture: CaptureSettings) -> CaptureFilter:
        """The filter a configuration's ``[capture]`` section declares."""
        tables = cls.parse(capture.system_tables, capture.include, capture.exclude)
        tables.columns = ColumnRules.of(capture)
        return tables

    def captures(self, database: str, table: str) -> bool:
        return self.why_not(TableName(database, table)) is None

    def captures_table(self, table: TableName) -> bool:
        return self.why_not(table) is None

    def why_not(self, table: TableName) -> str | None:
        """Why the table is not captured (None: it is), in words for an error reply."""
        if (table.database.lower(), table.table.lower()) in NEVER:
            return "the password tables (mysql.global_priv, mysql.user) are never captured"
        if table.database.lower() in SYSTEM_SCHEMAS:
            if table in self.system_tables:
                return None
            return ("the system schemas' tables are captured only when [capture] "
                    "system_tables names them")
        return self.selection.why_not(table)


EVERY_USER_TABLE = CaptureFilter()
