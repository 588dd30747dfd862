"""A session's first phase: the login, MaxScale's (a hex digest of the password) or
SCRAM-SHA-256 (an extension; see protocol.md), each checked after the throttle gives the
client its turn (``throttle.py``). :class:`Session` has these as its own methods."""

from __future__ import annotations

import logging

from cdcserver.protocol.outcomes import Delay, Outcome, Phase, Reply
from cdcserver.protocol.queries import SessionContext
from cdcserver.protocol.scram import MECHANISM, ScramFailed, ServerExchange
from cdcserver.protocol.throttle import Turn, shown_name
from mariadb_cdc_client.format.wire import MAX_USER_NAME, OK, Code, ProtocolError, parse_auth

# the session's log, wherever its lines are written from
log = logging.getLogger("cdcserver.protocol.session")
SCRAM_VERB = "AUTH "  # then the mechanism and the client-first-message


class Login:
    """The login's steps, on what :class:`Session` holds."""

    context: SessionContext
    peer: str
    phase: Phase
    user: str | None
    _scram: ServerExchange | None

    def _bad(self, exc: ProtocolError) -> Reply:
        raise NotImplementedError  # Session's: a bad command's reply, counted

    def _authenticate(self, message: bytes) -> Outcome:
        host = self.peer.rpartition(":")[0] or self.peer
        user, digest = parse_auth(message)
        known = self.context.users.exists(user)
        turn = self.context.throttle.turn(host, user, digest, known)
        if turn.refused:
            raise ProtocolError(Code.THROTTLED, f"too many new passwords tried for {user!r} "
                                f"from {host}; try again in {turn.wait:.0f}s", fatal=True)
        if turn.wait:
            log.info("%s: login as %s waits %.1fs for its turn (too many new passwords "
                     "tried for it from %s)", self.peer, shown_name(user), turn.wait, host)
            return Delay(turn.wait, lambda: self._check(host, user, digest, turn, known))
        return self._check(host, user, digest, turn, known)

    def _check(self, host: str, user: str, digest: bytes, turn: Turn, known: bool) -> Reply:
        if not self.context.users.verify(user, digest):
            if self.context.users.legacy_refused(user):
                log.info("%s: %s may log in with SCRAM-SHA-256 only", self.peer,
                         shown_name(user))
            return self._failed(host, user, digest, known)
        return self._logged_in(host, user, digest, turn, OK)

    def _failed(self, host: str, user: str, digest: bytes, known: bool) -> Reply:
        self.context.failures.failed(self.peer, host, user)
        self.context.login_failures += 1
        self.context.throttle.failed(host, user, digest, known)
        return self._bad(ProtocolError(Code.AUTH_FAILED, "Authentication failed"))

    def _logged_in(self, host: str, user: str, digest: bytes, turn: Turn, reply: bytes
                   ) -> Reply:
        self.context.throttle.succeeded(host, user, turn, digest)
        self.user = user
        self.phase = Phase.REGISTER
        log.info("%s: authenticated as %s", self.peer, shown_name(user))
        return Reply(reply)

    # -- SCRAM-SHA-256 (an extension; see protocol.md) -------------------------------------

    def _scram_first(self, client_first: str) -> Reply:
        """``AUTH SCRAM-SHA-256 <client-first-message>``: the server's first message."""
        mechanism, _, client_first = client_first.partition(" ")
        if mechanism != MECHANISM:
            raise ProtocolError(Code.BAD_AUTH, f"unknown mechanism {mechanism[:40]!r}: "
                                f"{SCRAM_VERB}{MECHANISM} <client-first-message>")
        try:
            exchange = ServerExchange(client_first.strip(), self.context.users.verifier,
                                      self.context.login_secret.value)
        except ScramFailed as exc:
            raise ProtocolError(Code.BAD_AUTH, f"not a SCRAM client-first-message: {exc}"
                                ) from None
        if not exchange.user or len(exchange.user) > MAX_USER_NAME:
            raise ProtocolError(Code.BAD_AUTH, f"a user name has at most {MAX_USER_NAME} "
                                "characters")
        self._scram = exchange
        return Reply(f"SCRAM {exchange.server_first}\n".encode())

    def _scram_final(self, exchange: ServerExchange, client_final: str) -> Outcome:
        """The client's proof: checked after the throttle's turn, as MaxScale's login is."""
        self._scram = None
        host = self.peer.rpartition(":")[0] or self.peer
        user, attempt = exchange.user, exchange.attempt(client_final)
        known = self.context.users.exists(user)
        turn = self.context.throttle.turn(host, user, attempt, known)
        if turn.refused:
            raise ProtocolError(Code.THROTTLED, f"too many new passwords tried for {user!r} "
                                f"from {host}; try again in {turn.wait:.0f}s", fatal=True)

        def check() -> Reply:
            final = exchange.verify()
            if final is None:
                if known and not exchange.has_verifier:
                    log.info("%s: %s has no SCRAM verifier: `cdcserver users add` gives it "
                             "one", self.peer, shown_name(user))
                return self._failed(host, user, attempt, known)
            return self._logged_in(host, user, attempt, turn, f"OK {final}\n".encode())

        if turn.wait:
            log.info("%s: login as %s waits %.1fs for its turn (too many new passwords "
                     "tried for it from %s)", self.peer, shown_name(user), turn.wait, host)
            return Delay(turn.wait, check)
        return check()
