"""Table references in commands: ``db.table``, a name quoted when it has to be.

MaxScale's clients send ``db.table`` as it is, so a bare name holds no dot and no white space.
MariaDB allows any character but NUL in a quoted identifier (a space, a dot, a backquote, even
a line break: https://mariadb.com/kb/en/identifier-names/), so every other name is quoted:

- as MariaDB quotes it, in backquotes with a backquote inside written twice:
  ```my db`.`odd``name` `` is the table ``odd`name`` of the database ``my db``;
- or as a JSON string (RFC 8259), for a name holding a control character: a line break cannot
  travel inside a one-line command, and ``"a\\nb".t`` carries it escaped.

:func:`table_ref` quotes only the names that need it, so requests for ordinary names stay
byte-identical to MaxScale's; :func:`read_table` reads a reference back, and for every pair of
names ``parse_table(table_ref(db, t))`` gives them back. No I/O here.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

# Invisible characters: a name holding one is written as a JSON string, where they show as
# escapes (json.dumps escapes U+0000-U+001F; the others are escaped below).
# What a name may not show as it is: control characters, line separators, and the marks and
# overrides that reorder the text around them (U+202E would show "gpj.exe" as "exe.jpg")
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")
_BARE = re.compile(r"[^.\s]+")  # \s is str.isspace(), what str.split() splits commands at
_VERSION = re.compile(r"[0-9]{6}(?=\s|$)")
_WORD = re.compile(r"\S*")
_SURROGATE = re.compile("[\ud800-\udfff]")
_DECODER = json.JSONDecoder()  # strict: a control character in a JSON string is escaped
_QUOTES = "`\""
USAGE = "db.table, each name bare or quoted: `my db`.`my.table`"
SPACE_RULE = "a name containing a space must be quoted"


class BadTableRef(ValueError):
    """Text that is not a table reference; ``quoted``: a quoted name was involved, so the
    text cannot be a bare name of something else (a file name, a MaxScale-style request)."""

    def __init__(self, message: str, *, quoted: bool) -> None:
        super().__init__(message)
        self.quoted = quoted


@dataclass(frozen=True)
class TableRef:
    database: str
    table: str
    version: int | None = None  # ``db.table.NNNNNN``, where a command takes one
    quoted: bool = False  # written with a quoted name (else MaxScale's bare form)

    def __str__(self) -> str:
        ref = table_ref(self.database, self.table)
        return ref if self.version is None else f"{ref}.{self.version:06d}"


Table = str | tuple[str, str]  # what the client library takes: a reference, or two names


def as_table(table: Table, *, version: bool = False) -> TableRef:
    """The reference ``table`` is (a string as commands write it), or the pair of names."""
    if isinstance(table, tuple):
        database, name = table
        return TableRef(database, name)
    return parse_table(table, version=version)


def needs_quoting(name: str) -> bool:
    """Whether a name cannot be written bare. A comma or a quote inside a name would do no
    harm to a command, but lists of tables (the Spark source's ``tables``) split at commas,
    and one written form serves both; a table named ``*`` bare would be every table
    (``db.*``)."""
    return not name or name == "*" or _CONTROL.search(name) is not None or any(
        c in ".,`\"" or c.isspace() for c in name)


def quote_name(name: str) -> str:
    """A name as a command carries it: bare when it can be, else quoted."""
    if not needs_quoting(name):
        return name
    if _CONTROL.search(name) is None:
        return "`" + name.replace("`", "``") + "`"
    return _CONTROL.sub(lambda m: f"\\u{ord(m[0]):04x}", json.dumps(name, ensure_ascii=False))


def table_ref(database: str, table: str) -> str:
    """``db.table``, quoting only the names that need it."""
    return f"{quote_name(database)}.{quote_name(table)}"


def read_table(text: str, *, version: bool = False) -> tuple[TableRef, str]:
    """The reference at the start of ``text`` (with ``version``, ``db.table.NNNNNN`` too)
    and the rest of the text, stripped. Raises BadTableRef."""
    text = text.lstrip()
    database, pos, quoted = read_name(text, 0)
    if not text.startswith(".", pos) or (not database and not quoted):
        shown = text[:pos] or _word(text, 0)
        raise BadTableRef(f"{shown!r} is not db.table: expected {USAGE}", quoted=quoted)
    table, pos, quoted_table = read_name(text, pos + 1)
    quoted = quoted or quoted_table
    if not table and not quoted_table:
        raise BadTableRef(f"{_word(text, 0)!r} is not db.table: the table name is missing",
                          quoted=quoted)
    number = None
    if text.startswith(".", pos):
        m = _VERSION.match(text, pos + 1) if version else None
        if m is None:
            raise _bad_tail(text, database, table, pos, quoted, version)
        number, pos = int(m[0]), m.end()
    if pos < len(text) and not text[pos].isspace():
        raise BadTableRef(f"expected a space after {text[:pos]}, not {_word(text, pos)!r}",
                          quoted=quoted)
    return TableRef(database, table, number, quoted), text[pos:].strip()


def parse_table(text: str, *, version: bool = False) -> TableRef:
    """The reference ``text`` is, whole (a client's ``db.table`` argument)."""
    try:
        ref, rest = read_table(text, version=version)
    except BadTableRef:
        hint = spaced_hint(text, version=version)
        if hint is None:
            raise
        raise BadTableRef(f"{SPACE_RULE}: {hint}", quoted=False) from None
    if rest:
        hint = spaced_hint(text, version=version)
        raise BadTableRef(f"{SPACE_RULE}: {hint}" if hint else
                          f"{text.strip()!r} is not one table: {rest!r} follows {ref}",
                          quoted=ref.quoted)
    return ref


def spaced_hint(text: str, *, version: bool = False) -> str | None:
    """``text``, a reference whose names were sent bare though one holds a space (``my
    db.t``), quoted as it should have been (```my db`.t``); the first dot is taken to end the
    database name. None when it cannot be one (no space, no dot, or a quote in it)."""
    text = text.strip()
    m = re.search(r"\.([0-9]{6})$", text) if version else None
    if m is not None:
        text = text[:m.start()]
    database, dot, table = text.partition(".")
    if not dot or not database or not table or not any(c.isspace() for c in text) \
            or any(q in text for q in _QUOTES):
        return None
    return table_ref(database, table) + (f".{m[1]}" if m else "")


def split_list(text: str) -> list[str]:
    """A comma-separated list of references (or patterns), keeping commas inside quotes."""
    return [item.strip() for item in split_outside_quotes(text, ",") if item.strip()]


def split_outside_quotes(text: str, separator: str, limit: int = -1) -> list[str]:
    """``text`` split at ``separator`` (one character) wherever it is not inside a quoted
    name, at most ``limit`` times (all: -1)."""
    items: list[str] = []
    start = pos = 0
    while pos < len(text) and limit != len(items):
        ch = text[pos]
        if ch in _QUOTES and (pos == 0 or text[pos - 1] in f".,{separator}"
                              or text[pos - 1].isspace()):
            end = _quoted_end(text, pos)
            pos = len(text) if end < 0 else end
            continue
        if ch == separator:
            items.append(text[start:pos])
            start = pos + 1
        pos += 1
    items.append(text[start:])
    return items


# -- one name ------------------------------------------------------------------------------

def read_name(text: str, pos: int) -> tuple[str, int, bool]:
    """(name, end, quoted) of the name at ``pos``; a bare name may be empty."""
    if text.startswith("`", pos):
        end = _quoted_end(text, pos)
        if end < 0:
            raise BadTableRef(f"unbalanced backquote in {text[pos:]!r}: a quoted name ends "
                              "with ` and a backquote inside it is written twice (``)",
                              quoted=True)
        return text[pos + 1:end - 1].replace("``", "`"), end, True
    if text.startswith('"', pos):
        try:
            name, end = _DECODER.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            raise BadTableRef(f"bad JSON string in {text[pos:]!r}: {exc.msg} at character "
                              f"{exc.pos - pos + 1}", quoted=True) from None
        if _SURROGATE.search(name):  # MariaDB's names are Unicode text (utf8mb3)
            raise BadTableRef(f"{text[pos:end]} holds a lone UTF-16 surrogate: no name does",
                              quoted=True)
        return name, end, True
    m = _BARE.match(text, pos)
    return (m[0], m.end(), False) if m else ("", pos, False)


def _quoted_end(text: str, pos: int) -> int:
    """Where the quoted name at ``pos`` ends (after its closing quote); -1: it does not."""
    if text[pos] == '"':
        try:
            return int(_DECODER.raw_decode(text, pos)[1])
        except json.JSONDecodeError:
            return -1
    i = pos + 1
    while True:
        i = text.find("`", i)
        if i < 0 or not text.startswith("``", i):
            return i if i < 0 else i + 1
        i += 2


def _bad_tail(text: str, database: str, table: str, pos: int, quoted: bool,
              version: bool) -> BadTableRef:
    """A dot after ``db.table`` that does not start a version."""
    written = text[:pos] + _word(text, pos)
    tail = _word(text, pos + 1)
    ref = table_ref(database, table)
    if re.fullmatch("[0-9]+", tail):
        number = tail.lstrip("0") or "0"  # (int() refuses a text of 4,300 digits or more)
        advice = ("this command takes no version" if not version else
                  f"a version has six digits ({ref}.{int(number):06d})" if len(number) <= 6
                  else "a version has six digits, 000001 to 999999")
    else:
        advice = f"a name containing a dot must be quoted, as in " \
                 f"{table_ref(database, f'{table}.{tail}')}"
    return BadTableRef(f"{written!r} is not db.table{'[.NNNNNN]' if version else ''}: "
                       f"{advice}", quoted=quoted)


def _word(text: str, pos: int) -> str:
    """The word (up to white space) at ``pos``."""
    m = _WORD.match(text, pos)
    return m[0] if m else ""
