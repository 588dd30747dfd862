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
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cdcserver.core.names import TableName
from mariadb_cdc_client.format.names import BadTableRef, read_name, split_list

if TYPE_CHECKING:
    from cdcserver.core.config import CaptureConfig

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


class CaptureFilter:
    def __init__(self, system_tables: Iterable[TableName] = (),
                 include: Iterable[TablePattern] = (),
                 exclude: Iterable[TablePattern] = ()) -> None:
        self.system_tables = frozenset(
            t for t in system_tables if (t.database.lower(), t.table.lower()) not in NEVER)
        self.selection = TableSelection(tuple(include), tuple(exclude))

    @classmethod
    def parse(cls, system_tables: str, include: str = "", exclude: str = "") -> CaptureFilter:
        """As ``[capture]`` holds them: ``system_tables`` names ``db.table,db.table``,
        ``include`` and ``exclude`` hold patterns."""
        named = (TableName.parse(item.strip()) for item in system_tables.split(",")
                 if item.strip())
        return cls(named, parse_patterns(include), parse_patterns(exclude))

    @classmethod
    def of(cls, capture: CaptureConfig) -> CaptureFilter:
        """The filter a configuration's ``[capture]`` section declares."""
        return cls.parse(capture.system_tables, capture.include, capture.exclude)

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
