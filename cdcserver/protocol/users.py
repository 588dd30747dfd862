"""The users file, in MaxScale's ``cdcusers`` format, so an existing one works unchanged.

One user per line: ``name:HASH`` where HASH is the hex of SHA1(SHA1(password)) (uppercase is
what MaxScale's ``cdc_users.py`` prints and ``maxctrl call command cdc add_user`` appends;
lowercase is accepted too). Blank lines and lines starting with ``#`` are ignored. A malformed
line is skipped with a warning naming it, at start and on every reload: the other users keep
working (``cdcserver users check`` lists the problems). Passwords are never stored or printed;
the server checks SHA1(the client's SHA1(password)) against HASH in constant time.

Extension: ``name:HASH:TABLES`` limits the user to the tables listed, comma-separated, each
``db.table``, ``db.*`` or ``*``. A line without the third field (every MaxScale line) may read
every table. Further fields are options: ``json=exact`` (or ``json=maxscale``) sets the user's
JSON dialect when its clients do not ask for one; ``scram=ITERATIONS$SALT$STOREDKEY$SERVERKEY``
is the user's SCRAM-SHA-256 verifier (``cdcserver users add`` writes one), and HASH ``-``
refuses MaxScale's replayable login to the user: ``name:-:*:scram=...``.
"""

from __future__ import annotations

import hmac
import logging
import os
import re
import stat
import threading
from dataclasses import dataclass

from cdcserver.core.durable import write_atomically
from cdcserver.core.errors import ConfigError
from cdcserver.core.names import TableName
from cdcserver.protocol.scram import Verifier
from mariadb_cdc_client.format.names import (
    BadTableRef,
    needs_quoting,
    quote_name,
    read_name,
    split_list,
    split_outside_quotes,
)
from mariadb_cdc_client.format.wire import Dialect, digest_hash, password_hash

log = logging.getLogger(__name__)

_HASH = re.compile(r"^[0-9A-Fa-f]{40}$")
NO_LEGACY = "-"  # the hash field of a user who may log in with SCRAM only
_NAME = re.compile(r"^[^:\s]{1,43}$")  # MaxScale's auth message allows 43-byte names


ANY = "*"  # a pattern's bare * (a name * is quoted: `*`)
Pattern = tuple[str | None, str | None]  # (database, table), None: any


@dataclass(frozen=True)
class TableGrant:
    """The tables a user may read: (database, table) pairs, None for any."""

    patterns: tuple[Pattern, ...]

    @classmethod
    def parse(cls, text: str) -> TableGrant:
        """``db.table``, ``db.*`` or ``*``, comma-separated; a name with a dot, a comma, a
        colon or a space quoted as MariaDB quotes it (```my db`.`v1.2```)."""
        items = split_list(text)
        try:
            patterns = tuple(_pattern(item) for item in items)
        except (BadTableRef, ValueError) as exc:
            raise ConfigError(f"invalid table list {text!r}: {exc}; expected comma-separated "
                              "db.table, db.* or *, a name with a dot, comma, colon or space "
                              "quoted: `my db`.`v1.2`") from None
        if not patterns:
            raise ConfigError(f"invalid table list {text!r}: comma-separated db.table, db.* "
                              "or *")
        return cls(patterns)

    def everything(self) -> bool:
        return (None, None) in self.patterns

    def allows(self, table: TableName) -> bool:
        return any(database in (None, table.database) and name in (None, table.table)
                   for database, name in self.patterns)

    def text(self) -> str:
        return ",".join(ANY if database is None else
                        f"{_grant_name(database)}.{ANY if name is None else _grant_name(name)}"
                        for database, name in self.patterns)


def _grant_name(name: str) -> str:
    """A name as the users file writes it: quoted as in commands, and also when it holds
    the file's field separator ``:`` or a ``*``."""
    if not needs_quoting(name) and (":" in name or ANY in name):
        return "`" + name.replace("`", "``") + "`"
    return quote_name(name)


def _pattern(item: str) -> Pattern:
    """One pattern of a table list: ``*`` is (None, None), ``db.*`` (db, None)."""
    if item == ANY:
        return None, None
    database, pos, quoted = read_name(item, 0)
    if not database or (ANY in database and not quoted) or not item.startswith(".", pos):
        raise ValueError(f"{item!r} is not db.table or db.*")
    if item[pos + 1:] == ANY:
        return database, None
    name, end, quoted = read_name(item, pos + 1)
    if not name or end != len(item) or (ANY in name and not quoted):
        raise ValueError(f"{item!r} is not db.table or db.* (a name with * is quoted)")
    return database, name


@dataclass(frozen=True)
class Account:
    hash: str | None  # None ("-" in the file): no MaxScale login, SCRAM only
    tables: TableGrant | None = None  # None: every table
    dialect: Dialect | None = None  # None: the listener's
    scram: Verifier | None = None  # None: no SCRAM login

    def line(self, name: str) -> str:
        fields = [name, self.hash or NO_LEGACY]
        options = [f"json={self.dialect.value}"] if self.dialect else []
        if self.scram:
            options.append(f"scram={self.scram.text()}")
        if self.tables or options:
            fields.append(self.tables.text() if self.tables else "*")
        return ":".join(fields + options)


class UsersFile:
    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._users: dict[str, Account] = {}
        self._signature: tuple[int, int, int] | None = None
        self.generation = 0  # reloads so far

    def load(self) -> dict[str, Account]:
        """The users the file holds now; a malformed line is skipped with a warning."""
        users, problems = self.check()
        for problem in problems:
            log.warning("%s (line skipped; the other users are loaded)", problem)
        return users

    def check(self) -> tuple[dict[str, Account], list[str]]:
        """The users, and each malformed line's problem as ``path:line: what``."""
        users: dict[str, Account] = {}
        problems: list[str] = []
        try:
            with open(self.path, encoding="utf-8", errors="replace") as f:
                lines = f.read().splitlines()
        except FileNotFoundError:
            return users, problems
        for number, line in enumerate(lines, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            try:
                name, account = _parse_line(line)
            except ConfigError as exc:
                problems.append(f"{self.path}:{number}: {exc}")
                continue
            if name in users:
                problems.append(f"{self.path}:{number}: user {name} again (this line wins)")
            users[name] = account
        return users, problems

    def _current(self) -> dict[str, Account]:
        """The users, reloaded when the file changed (MaxScale reloads after a failed check).
        The file is replaced by rename, so its inode tells a change that happened within the
        same mtime tick."""
        try:
            st = os.stat(self.path)
            signature: tuple[int, int, int] | None = (st.st_ino, st.st_mtime_ns, st.st_size)
        except FileNotFoundError:
            signature = None
        with self._lock:
            if signature != self._signature:
                self._users = self.load()
                self._signature = signature
                self.generation += 1
            return self._users

    def reload(self) -> int:
        """Read the file again now, changed or not; the number of users it holds."""
        with self._lock:
            self._signature = None
        return len(self._current())

    def refresh(self) -> int:
        """Reload the file if it changed; the generation of what is loaded (it grows with
        each reload)."""
        self._current()
        return self.generation

    def verify(self, user: str, password_sha1: bytes) -> bool:
        """MaxScale's login: never for a user whose file line has no hash (SCRAM only)."""
        account = self._current().get(user)
        candidate = digest_hash(password_sha1)
        # Compare even for unknown users so timing does not reveal who exists.
        expected = account.hash if account is not None and account.hash else "0" * 40
        return hmac.compare_digest(candidate, expected) and account is not None and \
            account.hash is not None

    def legacy_refused(self, user: str) -> bool:
        """Whether the user may log in with SCRAM only."""
        account = self._current().get(user)
        return account is not None and account.hash is None

    def verifier(self, user: str) -> Verifier | None:
        """The user's SCRAM verifier (None: no such user, or none for it)."""
        account = self._current().get(user)
        return account.scram if account is not None else None

    def exists(self, user: str) -> bool:
        return user in self._current()

    def dialect(self, user: str) -> Dialect | None:
        """The JSON dialect the file sets for ``user`` (None: the listener's default)."""
        account = self._current().get(user)
        return account.dialect if account is not None else None

    def may_read(self, user: str, table: TableName) -> bool:
        """Whether ``user`` may read ``table`` (as the file says now: a grant removed from
        the file applies to the user's next request)."""
        account = self._current().get(user)
        if account is None:
            return False
        return account.tables is None or account.tables.allows(table)

    def add(self, name: str, password: str, tables: str | None = None,
            dialect: Dialect | None = None, legacy: bool | None = None) -> bool:
        """Add or replace a user, with both logins' forms of the password (MaxScale's hash
        and a SCRAM verifier); True if it replaced an existing one. ``tables`` limits the
        user (``*``: every table); None keeps a replaced user's list (every table for a new
        one), so changing a password never widens what a user may read. ``dialect``: the
        user's JSON dialect (None keeps a replaced user's). ``legacy``: whether MaxScale's
        login is allowed (None keeps a replaced user's choice; allowed for a new one)."""
        if not _NAME.match(name):
            raise ConfigError(f"invalid user name {name!r}: 1-43 characters, no ':' or spaces")
        if not password:
            raise ConfigError("the password must not be empty")
        grant = TableGrant.parse(tables) if tables is not None else None
        users = self._editable()
        previous = users.get(name)
        if tables is None and previous is not None:
            grant = previous.tables
        if grant is not None and grant.everything():
            grant = None
        if dialect is None and previous is not None:
            dialect = previous.dialect
        if legacy is None:
            legacy = previous is None or previous.hash is not None
        try:
            verifier: Verifier | None = Verifier.make(password)
        except ValueError as exc:
            if not legacy:
                raise ConfigError(f"user {name}: {exc}; choose another password") from None
            log.warning("user %s: %s; it logs in with MaxScale's login only", name, exc)
            verifier = None
        users[name] = Account(password_hash(password) if legacy else None, grant, dialect,
                              verifier)
        self._save(users)
        return previous is not None

    def remove(self, name: str) -> bool:
        users = self._editable()
        if name not in users:
            return False
        del users[name]
        self._save(users)
        return True

    def _editable(self) -> dict[str, Account]:
        """The users, for a change that rewrites the file: refused while a line is malformed,
        which the rewrite would drop."""
        users, problems = self.check()
        if problems:
            raise ConfigError("fix the users file first (a rewrite would drop these lines): "
                              + "; ".join(problems))
        return users

    def _save(self, users: dict[str, Account]) -> None:
        directory = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(directory, exist_ok=True)
        text = "".join(a.line(n) + "\n" for n, a in sorted(users.items()))
        write_atomically(self.path, text.encode("utf-8"), mode=stat.S_IRUSR | stat.S_IWUSR)


def _parse_line(line: str) -> tuple[str, Account]:
    name, sep, rest = line.partition(":")
    hashed, _, rest = rest.partition(":")
    tables, options = (*split_outside_quotes(rest, ":", 1), "")[:2]
    hashed = hashed.strip()
    if not sep or not _NAME.match(name):
        raise ConfigError("expected name:HASH[:TABLES[:OPTION...]], a name of 1-43 "
                          "characters without ':' or spaces")
    if hashed != NO_LEGACY and not _HASH.match(hashed):
        raise ConfigError(f"user {name}: the hash must be 40 hex digits of "
                          f"SHA1(SHA1(password)), or {NO_LEGACY} for a SCRAM-only user")
    grant = TableGrant.parse(tables) if tables.strip() else None
    if grant is not None and grant.everything():
        grant = None
    dialect, verifier = _parse_options(name, options)
    if hashed == NO_LEGACY and verifier is None:
        raise ConfigError(f"user {name}: no hash and no scram= verifier: no login is possible")
    return name, Account(None if hashed == NO_LEGACY else hashed.upper(), grant, dialect,
                         verifier)


def _parse_options(name: str, text: str) -> tuple[Dialect | None, Verifier | None]:
    """The fields after the table list: ``json=exact|maxscale``, ``scram=VERIFIER``."""
    dialect, verifier = None, None
    for field in (f.strip() for f in text.split(":") if f.strip()):
        key, sep, value = field.partition("=")
        key, value = key.strip(), value.strip()
        if sep and key == "json":
            try:
                dialect = Dialect(value.lower())
            except ValueError:
                raise ConfigError(f"user {name}: unknown JSON dialect {value!r} (exact or "
                                  "maxscale)") from None
        elif sep and key == "scram":
            try:
                verifier = Verifier.parse(value)
            except ValueError as exc:
                raise ConfigError(f"user {name}: scram=: {exc}") from None
        else:
            raise ConfigError(f"user {name}: unknown option {field[:40]!r} (json=DIALECT, "
                              "scram=VERIFIER)")
    return dialect, verifier
