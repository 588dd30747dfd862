"""Resuming a stream after a reconnect, exactly: what a ``REQUEST-DATA`` stream has
delivered, the request that continues right after it, and the events of the new stream
that were already delivered, dropped."""

from __future__ import annotations

from mariadb_cdc_client.stream import ChangeRecord, Event, SchemaChange


class Resume:
    """What a stream has delivered, so a reconnect can continue exactly after it.

    The server's GTID seek is inclusive (it starts at the first record of the requested
    transaction), so after ``REQUEST-DATA db.t.<version> <last gtid>`` the records of that
    transaction already delivered are dropped here, as is the repeated schema.

    A stream that began ``AFTER`` a GTID state (after a dump) resumes exactly in every domain:
    each transaction delivered whole joins the state, and the one being delivered when the
    connection dropped is asked for again (its domain at the transaction delivered before
    it), with its records already delivered dropped.

    Sequence numbers are never compared: with ``gtid_strict_mode=OFF`` a domain's numbers can
    go down, and the server answers both requests by the order it stored transactions in.
    """

    def __init__(self, version: int | None = None, gtid: str | None = None,
                 after: str | None = None) -> None:
        self.version = version
        self.gtid = gtid
        self._after = _AfterState.parse(after) if after is not None else None
        # (domain, server_id, sequence, event_number) of the last record delivered
        self._last: tuple[int, int, int, int] | None = None
        self._schema_version: int | None = None

    @property
    def after(self) -> str | None:
        return self._after.request() if self._after is not None else None

    def request(self) -> tuple[int | None, str | None, str | None]:
        """(version, gtid, after) for the next request."""
        if self._after is not None:
            return self.version, None, self._after.request()
        return self.version, self.gtid, None

    def accepted(self, events: list[Event]) -> list[Event]:
        """The events of a batch (a schema alone, or records: as the decoders' ``batches``
        give them) to deliver: :meth:`accept` of each, with the check of every record made
        only where it can fail, at the batch's start."""
        if not events or self._after is not None or isinstance(events[0], SchemaChange):
            return [event for event in events if self.accept(event)]
        start, last, count = 0, self._last, len(events)
        if last is not None:  # the seek is inclusive: the records delivered come again first
            while start < count and self._repeated(events[start], last):  # type: ignore[arg-type]
                start += 1
            if start == count:
                return []
        tail = events[-1]
        assert isinstance(tail, ChangeRecord)
        self._last = (tail.domain, tail.server_id, tail.sequence, tail.event_number)
        self.gtid = tail.gtid
        return events[start:] if start else events

    @staticmethod
    def _repeated(record: ChangeRecord, last: tuple[int, int, int, int]) -> bool:
        return (record.domain, record.server_id, record.sequence) == last[:3] \
            and record.event_number <= last[3]

    def accept(self, event: Event) -> bool:
        if isinstance(event, SchemaChange):
            if event.version == self._schema_version:
                return False
            if self._last is not None and self._after is None:
                # A new version after delivered records: nothing of it was delivered, so a
                # resume starts at its beginning. (A GTID from the old version would skip the
                # new version's records of other domains that precede that GTID's domain.)
                self.gtid = None
                self._last = None
            self._schema_version = self.version = event.version
            return True
        if self._after is not None:
            return self._after.accept(event)
        last = self._last
        if last is not None and self._repeated(event, last):
            return False  # the seek is inclusive: this transaction's records were delivered
        self._last = (event.domain, event.server_id, event.sequence, event.event_number)
        self.gtid = event.gtid
        return True


class _AfterState:
    """A GTID state (per domain: server_id, sequence) plus the transaction in delivery."""

    def __init__(self, domains: dict[int, tuple[int, int]], uuid: str | None) -> None:
        self.domains = domains
        self.uuid = uuid  # a MySQL state: one source UUID, stored in domain 0
        self.current: tuple[int, int, int] | None = None  # (domain, server_id, sequence)
        self.event = 0  # the last event_number of ``current`` delivered

    @classmethod
    def parse(cls, text: str) -> _AfterState:
        domains: dict[int, tuple[int, int]] = {}
        uuid = None
        for item in filter(None, (i.strip() for i in text.split(","))):
            if ":" in item:
                uuid, _, numbers = item.partition(":")
                domains[0] = (0, int(numbers.rsplit("-", 1)[-1]))
            else:
                domain, server, sequence = (int(x) for x in item.split("-"))
                domains[domain] = (server, sequence)
        return cls(domains, uuid)

    def accept(self, record: ChangeRecord) -> bool:
        txn = (record.domain, record.server_id, record.sequence)
        if txn == self.current:
            if record.event_number <= self.event:
                return False  # delivered before the reconnect
        else:
            if self.current is not None:  # the previous transaction was delivered whole
                self.domains[self.current[0]] = self.current[1:]
            self.current = txn
        self.event = record.event_number
        return True

    def request(self) -> str:
        # The transaction in delivery is asked for again: its domain stays at the one
        # delivered before it (or, if none was, is left out: all of it is wanted).
        state = dict(self.domains)
        if self.uuid is not None:
            return f"{self.uuid}:{state.get(0, (0, 0))[1]}"
        return ",".join(f"{d}-{s}-{n}" for d, (s, n) in sorted(state.items()))
