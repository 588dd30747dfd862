"""The users file, in MaxScale's ``cdcusers`` format, so an existing one works unchanged.

One user per line: ``name:HASH`` where HASH is the uppercase hex of SHA1(SHA1(password)),
what MaxScale's ``cdc_users.py`` prints and ``maxctrl call command cdc add_user`` appends.
Blank lines and lines starting with ``#`` are ignored. Passwords are never stored or printed;
the server checks SHA1(the client's SHA1(password)) against HASH in constant time.
"""

from __future__ import annotations

import hmac
import os
import re
import stat
import threading

from cdcserver.errors import ConfigError
from cdcserver.store.checkpoint import write_atomically
from client.wire import digest_hash, password_hash

_HASH = re.compile(r"^[0-9A-F]{40}$")
_NAME = re.compile(r"^[^:\s]{1,43}$")  # MaxScale's auth message allows 43-byte names


class UsersFile:
    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._users: dict[str, str] = {}
        self._mtime: float | None = None

    def load(self) -> dict[str, str]:
        users: dict[str, str] = {}
        try:
            with open(self.path, encoding="utf-8") as f:
                lines = f.read().splitlines()
        except FileNotFoundError:
            return users
        for number, line in enumerate(lines, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            name, sep, hashed = line.partition(":")
            hashed = hashed.split(":", 1)[0].strip()
            if not sep or not _NAME.match(name) or not _HASH.match(hashed):
                raise ConfigError(f"{self.path}:{number}: expected name:HASH (40 uppercase hex "
                                  "digits of SHA1(SHA1(password)))")
            users[name] = hashed
        return users

    def _current(self) -> dict[str, str]:
        """The users, reloaded when the file changed (MaxScale reloads after a failed check)."""
        try:
            mtime = os.stat(self.path).st_mtime
        except FileNotFoundError:
            mtime = None
        with self._lock:
            if mtime != self._mtime:
                self._users = self.load()
                self._mtime = mtime
            return self._users

    def verify(self, user: str, password_sha1: bytes) -> bool:
        expected = self._current().get(user)
        candidate = digest_hash(password_sha1)
        # Compare even for unknown users so timing does not reveal who exists.
        return hmac.compare_digest(candidate, expected or "0" * 40) and expected is not None

    def names(self) -> list[str]:
        return sorted(self.load())

    def add(self, name: str, password: str) -> bool:
        """Add or replace a user; True if it replaced an existing one."""
        if not _NAME.match(name):
            raise ConfigError(f"invalid user name {name!r}: 1-43 characters, no ':' or spaces")
        if not password:
            raise ConfigError("the password must not be empty")
        users = self.load()
        replaced = name in users
        users[name] = password_hash(password)
        self._save(users)
        return replaced

    def remove(self, name: str) -> bool:
        users = self.load()
        if name not in users:
            return False
        del users[name]
        self._save(users)
        return True

    def _save(self, users: dict[str, str]) -> None:
        directory = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(directory, exist_ok=True)
        text = "".join(f"{n}:{h}\n" for n, h in sorted(users.items()))
        write_atomically(self.path, text.encode("utf-8"))
        os.chmod(self.path, stat.S_IRUSR | stat.S_IWUSR)
