"""The reconnect policy's one final error it asks about again: a table this stream has had
records of that the server no longer knows (a service started over from its checkpoint
replays the table's creation: the fault soak's resuming client got ``NO-FILE`` for its ledger
for 0.7 s after a disk fault, and gave up)."""

from __future__ import annotations

import pytest

from mariadb_cdc_client.endpoints import Endpoints
from mariadb_cdc_client.format.wire import Code, ProtocolError
from mariadb_cdc_client.reconnect import NO_FILE_RETRIES, Reconnect

NO_FILE = ProtocolError(Code.NO_FILE, "File 'db.t.000001.avro' not found. (unknown table db.t)")


def _policy() -> Reconnect:
    return Reconnect(Endpoints.of("127.0.0.1", 4001), delays=(0.1, 0.5))


def test_an_unknown_table_is_final_before_the_stream_had_a_record():
    with pytest.raises(ProtocolError):
        _policy().failed(NO_FILE)


def test_a_table_the_stream_had_records_of_is_asked_for_again_for_a_while():
    policy = _policy()
    policy.received()
    delays = [policy.failed(NO_FILE) for _ in range(NO_FILE_RETRIES)]
    assert delays[0] == 0.1 and delays[-1] == 0.5
    with pytest.raises(ProtocolError):  # (then it is the caller's)
        policy.failed(NO_FILE)
    policy.received()  # a record: the tries start again
    assert policy.failed(NO_FILE) == 0.1


def test_other_final_errors_stay_final_after_records():
    policy = _policy()
    policy.received()
    with pytest.raises(ProtocolError):
        policy.failed(ProtocolError(Code.AUTH_FAILED, "wrong password"))
