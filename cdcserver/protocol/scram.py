"""The server's side of the SCRAM-SHA-256 login (RFC 5802, RFC 7677), an extension of the
protocol that MaxScale's clients never trigger (see ``protocol.md``, "SCRAM-SHA-256").

A client that sends ``AUTH SCRAM-SHA-256 <client-first-message>`` instead of MaxScale's hex
login gets ``SCRAM <server-first-message>``, answers with its ``<client-final-message>``, and
gets ``OK v=<server signature>`` (or ``ERR AUTH-FAILED``). Nothing that crosses the wire can
be replayed: each exchange has a nonce of both sides, and the proof is bound to it. The
users file holds the verifier (salt, iterations, StoredKey, ServerKey), from which no login
can be made either.

The exchange itself is scramp's (a maintained implementation, also pg8000's). What this
module adds: a user without a verifier, or no user of that name, goes through the same
exchange with a verifier derived from a secret the service keeps in its data directory
(``state/login-secret``): a salt as long as a real one (scramp's 32 bytes), the same
iteration count, the same for a name across restarts, so the replies do not tell which
names exist; and the key a proof was made with (``attempt``), recovered from the proof as
the server can, which lets the login throttle tell a retried wrong password from a new
one, as it does with MaxScale's login.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass

from scramp import ScramException, ScramMechanism

from cdcserver.core.durable import write_atomically
from cdcserver.core.errors import ConfigError

MECHANISM = "SCRAM-SHA-256"
ITERATIONS = 4096  # RFC 7677's minimum, and PostgreSQL's default
SALT_BYTES = 32  # what scramp's make_auth_info draws (secrets.token_bytes())
SECRET_BYTES = 32


@dataclass(frozen=True)
class Verifier:
    """What the users file keeps of a SCRAM password: ``scram=ITERATIONS$SALT$STOREDKEY$
    SERVERKEY`` (base64)."""

    iterations: int
    salt: bytes
    stored_key: bytes
    server_key: bytes

    @classmethod
    def make(cls, password: str, iterations: int = ITERATIONS) -> Verifier:
        """Raises ValueError for a password SASLprep (RFC 4013) refuses: control
        characters, some bidirectional text."""
        try:
            salt, stored, server, count = ScramMechanism(MECHANISM).make_auth_info(
                password, iteration_count=iterations)
        except ScramException as exc:
            raise ValueError(f"SCRAM cannot use this password: {exc}") from None
        return cls(count, salt, stored, server)

    @classmethod
    def parse(cls, text: str) -> Verifier:
        parts = text.split("$")
        if len(parts) != 4 or not parts[0].isdigit():
            raise ValueError("expected ITERATIONS$SALT$STOREDKEY$SERVERKEY")
        iterations = int(parts[0])
        salt, stored, server = (base64.b64decode(p, validate=True) for p in parts[1:])
        if iterations < ITERATIONS or len(stored) != 32 or len(server) != 32 or not salt:
            raise ValueError(f"at least {ITERATIONS} iterations, a salt, and 32-byte keys")
        return cls(iterations, salt, stored, server)

    def text(self) -> str:
        return "$".join([str(self.iterations), *(base64.b64encode(b).decode() for b in (
            self.salt, self.stored_key, self.server_key))])


def fake_verifier(user: str, secret: bytes) -> Verifier:
    """The same verifier for a name every time ``secret`` is the same, shaped as a real one
    (its salt's length, the default iteration count), which no password matches."""
    name = user.encode("utf-8", "surrogatepass")

    def derived(purpose: bytes) -> bytes:
        return hmac.new(secret, purpose + b"\0" + name, hashlib.sha256).digest()

    return Verifier(ITERATIONS, derived(b"salt")[:SALT_BYTES], derived(b"stored"),
                    derived(b"server"))


def login_secret(path: str) -> bytes:
    """The secret the made-up verifiers come from: read from ``path``, or made there the
    first time (owner-only, written whole or not at all). A file that others may read, or
    of another length, is refused: a known secret would tell made-up salts from real
    ones."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        secret = os.urandom(SECRET_BYTES)
        write_atomically(path, secret, mode=0o600)
        return secret
    except OSError as exc:
        raise ConfigError(f"{path}: {exc.strerror}") from exc
    with os.fdopen(fd, "rb") as f:
        mode = os.fstat(f.fileno()).st_mode
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise ConfigError(f"{path} may be read by other users (mode "
                              f"{stat.S_IMODE(mode):o}); chmod 600 {path}")
        secret = f.read(SECRET_BYTES + 1)
    if len(secret) != SECRET_BYTES:
        raise ConfigError(f"{path} holds {len(secret)} bytes, not the {SECRET_BYTES} of a "
                          "login secret; remove it and a new one is made")
    return secret


class LoginSecret:
    """The listener's login secret: random until :meth:`load` reads (or makes) the one kept
    at ``path``, which keeps the made-up verifiers the same after a restart."""

    def __init__(self, path: str | None = None) -> None:
        self.path = path
        self.value = os.urandom(SECRET_BYTES)

    def load(self) -> None:
        if self.path is not None:
            self.value = login_secret(self.path)


class ScramFailed(Exception):
    """The client's message is not a SCRAM-SHA-256 message this server accepts."""


class ServerExchange:
    """One login's exchange, once the client's first message named ``user``."""

    def __init__(self, client_first: str, verifier_of: Callable[[str], Verifier | None],
                 secret: bytes) -> None:
        self.user = ""
        self.has_verifier = False  # False: a made-up verifier, which no password matches
        self._verifier: Verifier | None = None

        def auth_info(name: str) -> tuple[bytes, bytes, bytes, int]:
            self.user = name
            found = verifier_of(name)
            self.has_verifier = found is not None
            self._verifier = found or fake_verifier(name, secret)
            v = self._verifier
            return v.salt, v.stored_key, v.server_key, v.iterations

        self._server = ScramMechanism(MECHANISM).make_server(auth_info)
        try:
            self._server.set_client_first(client_first)
            self.server_first: str = self._server.get_server_first()
        except ScramException as exc:
            raise ScramFailed(str(exc)) from None
        self._final = ""

    def attempt(self, client_final: str) -> bytes:
        """The ClientKey the proof was made with (SHA-1 of it: the throttle's key for this
        password); a malformed message gives its own hash, which matches nothing."""
        self._final = client_final
        without_proof, sep, proof = client_final.rpartition(",p=")
        assert self._verifier is not None
        try:
            proof_bytes = base64.b64decode(proof, validate=True) if sep else b""
        except ValueError:
            proof_bytes = b""
        if len(proof_bytes) != 32:
            return hashlib.sha1(client_final.encode("utf-8", "surrogatepass")).digest()
        message = ",".join((self._server.client_first_bare, self.server_first, without_proof))
        signature = hmac.new(self._verifier.stored_key, message.encode("utf-8"),
                             hashlib.sha256).digest()
        key = bytes(a ^ b for a, b in zip(proof_bytes, signature, strict=True))
        return hashlib.sha1(key).digest()

    def verify(self) -> str | None:
        """The server-final message (``v=...``) if the proof is right, else None."""
        try:
            self._server.set_client_final(self._final)
            final: str = self._server.get_server_final()
        except ScramException:
            return None
        return final
