"""The prepared XA transactions' store (cdcserver/replication/xa.py): durable, found again by
the GTID that completed them after a restart, an xid used again never confused."""

from __future__ import annotations

import os

from cdcserver.core.gtid import Gtid, GtidState
from cdcserver.replication.xa import PreparedXa, Xid

XID = Xid(7, b"\x00\xff", b"bq")


def _prepare(store: PreparedXa, gtid: str, *events: bytes) -> None:
    recording = store.record(Gtid.parse(gtid))
    for event in events:
        recording.add(event)
    store.prepared(recording, XID, Gtid.parse(gtid), 1_700_000_000)


def test_a_completion_read_again_after_a_restart_gets_its_own_rows(tmp_path):
    directory = str(tmp_path / "xa")
    store = PreparedXa(directory)
    _prepare(store, "0-1-1", b"first", b"rows")
    assert store.complete(XID, Gtid.parse("0-1-2"), commit=True) == [b"first", b"rows"]
    _prepare(store, "0-1-3", b"again")  # the application uses the xid again
    assert [e.gtid for e in store.pending()] == [Gtid.parse("0-1-3")]
    store = PreparedXa(directory)  # a restart, the checkpoint before 0-1-2
    assert store.complete(XID, Gtid.parse("0-1-2"), commit=True) == [b"first", b"rows"]
    assert store.complete(XID, Gtid.parse("0-1-4"), commit=True) == [b"again"]


def test_a_rollback_gives_nothing_and_an_unknown_commit_is_told(tmp_path):
    store = PreparedXa(str(tmp_path / "xa"))
    _prepare(store, "0-1-1", b"rows")
    assert store.complete(XID, Gtid.parse("0-1-2"), commit=False) == []
    assert store.complete(XID, Gtid.parse("0-1-3"), commit=True) is None
    assert len(store.lost) == 1 and "0-1-3" in store.lost[0] and str(XID) in store.lost[0]


def test_completed_transactions_are_let_go_once_every_checkpoint_covers_them(tmp_path):
    directory = str(tmp_path / "xa")
    store = PreparedXa(directory)
    _prepare(store, "0-1-1", b"rows")
    _prepare(store, "0-1-5", b"pending")
    store.complete(XID, Gtid.parse("0-1-2"), commit=True)
    store.prune([GtidState.parse("0-1-2"), GtidState.parse("0-1-1")])  # one sink behind
    assert len(os.listdir(directory)) == 5  # two entries' events and headers, a completion
    store.prune([GtidState.parse("0-1-2"), GtidState.parse("0-1-3")])
    assert sorted(os.listdir(directory)) == [f"0-1-5.{XID.digest}.prepared",
                                             f"0-1-5.{XID.digest}.prepared.header"]
    assert [e.gtid for e in PreparedXa(directory).pending()] == [Gtid.parse("0-1-5")]


def test_a_recording_the_service_did_not_finish_is_dropped(tmp_path):
    directory = str(tmp_path / "xa")
    store = PreparedXa(directory)
    store.record(Gtid.parse("0-1-1")).add(b"half a group")  # killed before XA PREPARE
    assert PreparedXa(directory).pending() == []
    assert os.listdir(directory) == []
