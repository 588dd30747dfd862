"""Where a stream starts and where it ends: the record filters of ``REQUEST-DATA``.

A GTID positions the stream in both modes: the index gives an offset to scan from and the
stream starts at the first record of that domain whose sequence is at or after the GTID's
(inclusive, as MaxScale; any server_id, unlike MaxScale, so a seek survives a failover). In a
domain whose sequence numbers did not grow (``gtid_strict_mode=OFF``), "at or after" is by the
order the store applied transactions in (:class:`Order`), and a seek for a stored GTID starts
at that very transaction.
``AFTER <state>`` (an extension) sends exactly the records of transactions the GTID state does
not cover, in every domain: what follows a dump.

``UNTIL <state>`` (an extension) bounds the stream to the transactions the state covers.

Each filter is told when a version starts (its domains, from the index) and then asked about
each record in stored order; the stream (``stream.py``) sends what they accept.
"""

from __future__ import annotations

from typing import Any

from cdcserver.core.gtid import Gtid, GtidState
from cdcserver.protocol.requests import state_bound
from cdcserver.store.catalog import VersionInfo
from cdcserver.store.index import StoreIndex


class Order:
    """Whether a record comes after a transaction in its domain: by sequence number while the
    domain's numbers grew, else by the store's ordinals (``store/index.py``). Records are
    stored in ordinal order, so while a version is read from its start, the transaction of
    each record is the first with its GTID at or after the previous record's."""

    def __init__(self, index: StoreIndex | None) -> None:
        self.index = index
        self._floor = 0
        self._last: tuple[tuple[int, int, int], int | None] | None = None
        self._named: dict[Gtid, int | None] = {}

    def version_started(self) -> None:
        self._floor = 0
        self._last = None

    def ordered(self, domain: int) -> bool:
        return self.index is None or self.index.ordered(domain)

    def compare(self, record: dict[str, Any], gtid: Gtid) -> int:
        """<0, 0 or >0 as the record's transaction is before, is, or is after ``gtid``."""
        if not self.ordered(record["domain"]):
            mine, theirs = self._record_ordinal(record), self._ordinal(gtid)
            if mine is not None and theirs is not None:
                return mine - theirs
        return record["sequence"] - gtid.sequence

    def covers(self, state: GtidState, gtid: Gtid) -> bool:
        if self.index is None:
            return state.covers(gtid)
        return self.index.covers(state, gtid)

    def _ordinal(self, gtid: Gtid) -> int | None:
        if gtid not in self._named:
            assert self.index is not None
            self._named[gtid] = self.index.ordinal(gtid)
        return self._named[gtid]

    def _record_ordinal(self, record: dict[str, Any]) -> int | None:
        key = (record["domain"], record["server_id"], record["sequence"])
        if self._last is not None and self._last[0] == key:
            return self._last[1]
        assert self.index is not None
        ordinal = self.index.ordinal(Gtid(*key), at_least=self._floor)
        if ordinal is not None:
            self._floor = ordinal
        self._last = (key, ordinal)
        return ordinal


class Seek:
    """MaxScale's GTID position (inclusive): from the first record of the GTID's domain at or
    after its sequence, everything."""

    def __init__(self, gtid: Gtid, order: Order | None = None) -> None:
        self.gtid = gtid
        self.domain = gtid.domain
        self.sequence = gtid.sequence
        self.order = order or Order(None)
        self.settled = False  # every record from here on is sent

    def accepts(self, record: dict[str, Any]) -> bool:
        if not self.settled and record["domain"] == self.domain and \
                self.order.compare(record, self.gtid) >= 0:
            self.settled = True
        return self.settled

    def start_offset(self, index: StoreIndex, info: VersionInfo) -> int | None:
        return index.seek_offset(info.table, info.version, self.domain, self.sequence)

    def version_started(self, index: StoreIndex | None, info: VersionInfo) -> None:
        self.order.version_started()


class After:
    """``AFTER <state>`` (exclusive): every record of a transaction the state does not cover.
    Within a domain records are stored in commit order, so once a domain has had a record
    after the state, all its later records are too; when that holds for every domain of the
    state that the version has records of, the filter is settled and blocks go out as
    stored."""

    def __init__(self, state: GtidState, given: GtidState | None = None,
                 order: Order | None = None) -> None:
        self.state = state  # in the domains records are stored with
        self.given = given if given is not None else state  # as the client named it
        self.order = order or Order(None)
        self.settled = not state
        self._pending: set[int] = set()

    @classmethod
    def parse(cls, text: str, order: Order | None = None) -> After:
        bound = state_bound(text)
        return cls(bound.stored, bound.given, order)

    def covers(self, gtid_text: str) -> bool:
        """Whether a version's creating transaction precedes the state."""
        if not gtid_text:
            return False
        gtid = Gtid.parse(gtid_text)
        if gtid.source_uuid is not None:
            gtid = Gtid(0, 0, gtid.sequence)
        return self.order.covers(self.state, gtid)

    def version_started(self, index: StoreIndex | None, info: VersionInfo) -> None:
        self.order.version_started()
        if not self.state:
            return
        domains = {g.domain for g in self.state}
        if index is not None:
            domains &= index.domains(info.table, info.version)
        self._pending = domains
        self.settled = not domains

    def accepts(self, record: dict[str, Any]) -> bool:
        if self.settled:
            return True
        last = self.state.get(record["domain"])
        if last is not None and self.order.compare(record, last) <= 0:
            return False
        self._pending.discard(record["domain"])
        self.settled = not self._pending
        return True

    def start_offset(self, index: StoreIndex, info: VersionInfo) -> int | None:
        offsets = []
        for domain in self._pending:
            last = self.state.get(domain)
            assert last is not None
            offset = index.seek_offset(info.table, info.version, domain, last.sequence + 1)
            if offset is None:
                return None
            offsets.append(offset)
        return min(offsets) if offsets else None


class Until:
    """``UNTIL <state>``: only records of transactions the state covers. Once a record past
    the state has been seen in each of its domains, nothing later can be covered
    (:attr:`finished`); within a version, once it has been seen in each domain the version
    has records of, nothing later in the version can (:attr:`done`)."""

    def __init__(self, state: GtidState, given: GtidState, order: Order | None = None) -> None:
        self.state = state
        self.given = given
        self.order = order or Order(None)
        self._open = {g.domain for g in state}  # the state's domains not passed yet
        self._open_here = set(self._open)  # and those of them the version has records of
        self.domains: set[int] | None = None  # the current version's, when the index knows

    @property
    def done(self) -> bool:
        """Nothing later in this version is covered."""
        return not self._open_here

    @property
    def finished(self) -> bool:
        """Nothing later in the table is covered. (A version with no records of a domain,
        one with none at all above all, says nothing of the versions after it: such a
        version used to end the range, and the versions after it were never sent.)"""
        return not self._open

    def covers(self, record: dict[str, Any]) -> bool:
        last = self.state.get(record["domain"])
        if last is not None and self.order.compare(record, last) <= 0:
            return True
        self._open.discard(record["domain"])
        self._open_here.discard(record["domain"])
        return False

    def version_started(self, index: StoreIndex | None, info: VersionInfo) -> None:
        """Only the domains the version has records of can close the range within it."""
        self.order.version_started()
        self._open_here = set(self._open)
        if index is None:
            return
        self.domains = index.domains(info.table, info.version)
        self._open_here &= self.domains

    def covered_prefix(self, index: StoreIndex | None, info: VersionInfo) -> int:
        """An offset of ``info``'s file before which every record is covered (the file's
        header size when the index cannot tell): in each domain of the version, the indexed
        block at or before the state's last transaction."""
        if index is None or self.domains is None or not self.domains:
            return info.header.size
        offsets = []
        for domain in self.domains:
            last = self.state.get(domain)
            if last is None:  # a domain the state does not name: none of its records are
                return info.header.size
            offset = index.seek_offset(info.table, info.version, domain, last.sequence + 1)
            offsets.append(info.header.size if offset is None else offset)
        return min(offsets)

    def covers_version(self, gtid_text: str) -> bool:
        """Whether the transaction that created a version is covered (else none of its
        records are)."""
        return After(self.state, order=self.order).covers(gtid_text)
