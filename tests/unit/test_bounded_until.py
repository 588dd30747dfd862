"""``REQUEST-DATA … UNTIL state`` (cdcserver/protocol/filters.py ``Until``): when a bounded
read may stop. Driven directly with a stand-in for the store's index (which versions hold
records of which domains); the whole path, against MariaDB, is in
tests/server/test_bounded.py."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from cdcserver.core.gtid import GtidState
from cdcserver.core.names import TableName
from cdcserver.protocol.filters import Until

TABLE = TableName("db", "t")


class Index:
    """The domains each version has records of; every domain's sequence numbers grew."""

    def __init__(self, domains: dict[int, set[int]]) -> None:
        self._domains = domains

    def domains(self, table: TableName, version: int) -> set[int]:
        return self._domains.get(version, set())

    def ordered(self, domain: int) -> bool:
        return True


def _version(n: int) -> Any:
    return SimpleNamespace(table=TABLE, version=n)


def _record(sequence: int, domain: int = 0) -> dict[str, Any]:
    return {"domain": domain, "server_id": 1, "sequence": sequence}


def test_a_version_with_no_records_does_not_end_the_range():
    """Soak and chaos runs: a table created empty (or renamed away and back) has versions
    with no records; the first of them ended the range, and the later versions' records
    in it were never sent."""
    state = GtidState.parse("0-1-100")
    index = Index({3: {0}})
    until = Until(state, state)
    for version in (1, 2):  # no records
        until.version_started(index, _version(version))  # type: ignore[arg-type]
        assert not until.finished
    until.version_started(index, _version(3))  # type: ignore[arg-type]
    assert until.covers(_record(90)) and not until.done
    assert not until.covers(_record(101))
    assert until.done and until.finished  # past the state in its only domain


def test_a_version_of_one_domain_ends_itself_not_the_range_of_two():
    state = GtidState.parse("0-1-100,1-1-50")
    index = Index({1: {0}, 2: {0, 1}})
    until = Until(state, state)
    until.version_started(index, _version(1))  # type: ignore[arg-type]
    assert not until.covers(_record(101))
    assert until.done and not until.finished  # domain 1's records may still be covered
    until.version_started(index, _version(2))  # type: ignore[arg-type]
    assert not until.done and until.covers(_record(40, domain=1))
    assert not until.covers(_record(51, domain=1))
    assert until.done and until.finished
