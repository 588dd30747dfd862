"""The client's side of the two logins (protocol.md, "Authentication"), with no I/O.

MaxScale's login sends ``hex(user:SHA1(password))``: whoever sees it once can log in with
it. The SCRAM-SHA-256 login (an extension of this service) sends a proof bound to nonces of
both sides, and checks the server's signature. ``Auth.AUTO``, the default, uses SCRAM
whenever the server offers it and MaxScale's login otherwise; ``Auth.SCRAM`` never sends
the replayable login; ``Auth.LEGACY`` sends only it (MaxScale itself).
"""

from __future__ import annotations

from enum import StrEnum

from scramp import ScramClient, ScramException

from mariadb_cdc_client.format.wire import Code, ProtocolError, parse_reply

MECHANISM = "SCRAM-SHA-256"
SCRAM_REPLY = "SCRAM "  # the server's reply to AUTH SCRAM-SHA-256: then server-first


class Auth(StrEnum):
    AUTO = "auto"  # SCRAM when the server offers it, else MaxScale's login
    SCRAM = "scram"  # SCRAM or nothing
    LEGACY = "legacy"  # MaxScale's login only


class ScramLogin:
    """One SCRAM exchange: ``first()``, then ``final(reply)`` with the server's reply,
    then ``check(reply)`` with the ``OK v=...`` that ends it."""

    def __init__(self, user: str, password: str, auth: Auth = Auth.AUTO) -> None:
        """Raises ValueError for a password SASLprep refuses (control characters...)."""
        self.auth = auth
        try:
            self._client = ScramClient([MECHANISM], user, password)
        except ScramException as exc:
            raise ValueError(f"SCRAM cannot use this password: {exc}") from None

    def first(self) -> bytes:
        return f"AUTH {MECHANISM} {self._client.get_client_first()}\n".encode()

    @staticmethod
    def offered(reply: bytes) -> bool:
        """Whether the server answered the first line with its SCRAM message."""
        return reply.startswith(SCRAM_REPLY.encode())

    def final(self, reply: bytes) -> bytes:
        text = reply.decode("utf-8", "replace").strip()[len(SCRAM_REPLY):]
        try:
            self._client.set_server_first(text)
            return (self._client.get_client_final() + "\n").encode()
        except ScramException as exc:
            raise ProtocolError(Code.AUTH_FAILED, f"the server's SCRAM message is not "
                                f"valid: {exc}") from None

    def answer(self, reply: bytes) -> bytes | None:
        """The client-final line for the server's reply to :meth:`first`; None when
        ``Auth.AUTO`` should use MaxScale's login instead (the server offers no SCRAM:
        an error, or a hang-up, ``b""``)."""
        if self.offered(reply):
            return self.final(reply)
        if self.auth == Auth.AUTO:
            return None
        raise not_offered()

    def accepted(self, reply: bytes) -> bool:
        """Whether the server's last reply logged in (its signature checked); False when
        ``Auth.AUTO`` should try MaxScale's login (AUTH-FAILED: a user without a verifier)."""
        if not reply:
            raise ConnectionError("the server closed the connection")
        ok, code, message = parse_reply(reply)
        if not ok:
            if self.auth == Auth.AUTO and code == Code.AUTH_FAILED:
                return False
            raise ProtocolError(code or Code.INTERNAL, message)
        self.check(message)
        return True

    def check(self, message: str) -> None:
        """``message``: what followed ``OK`` in the server's last reply (``v=...``)."""
        try:
            self._client.set_server_final(message.strip())
        except ScramException as exc:
            raise ProtocolError(Code.AUTH_FAILED, "the server's SCRAM signature is wrong: it "
                                f"does not hold this user's verifier ({exc})") from None


def not_offered() -> ProtocolError:
    return ProtocolError(Code.AUTH_FAILED, "the server does not offer SCRAM-SHA-256 "
                         "(auth=scram): use auth=auto or auth=legacy with MaxScale")


def scram_login(user: str, password: str, auth: Auth) -> ScramLogin | None:
    """The SCRAM exchange to try first (None: MaxScale's login only)."""
    if auth == Auth.LEGACY:
        return None
    try:
        return ScramLogin(user, password, auth)
    except ValueError as exc:
        if auth == Auth.SCRAM:
            raise ProtocolError(Code.AUTH_FAILED, str(exc)) from None
        return None
