"""What a pipeline started again in the same process (after a full disk, a sink rewound, a
source that could not be reached) takes over from the one before (``Repairer.take_over``)."""

from __future__ import annotations

from cdcserver.core.changes import Rowless
from cdcserver.core.config import parse_source_url
from cdcserver.core.names import TableName
from cdcserver.reread.repair import Repairer
from cdcserver.reread.view import Views
from cdcserver.store.catalog import Catalog


def test_only_the_resyncs_are_taken_over_and_each_is_asked_for_again(tmp_path):
    """A repair of a change is not: the replay recognises the change again (no checkpoint
    passed it), and taken over too, it was read twice (fdf319e). A resync is asked for again
    (a review of that change: carried as a plain repair, it was read without being
    released, and did not count as under way, so another could be asked for)."""
    views = Views(str(tmp_path / "views.sqlite"))
    repairer = Repairer(parse_source_url("mysql://cdc@127.0.0.1:1"),
                        Catalog(str(tmp_path / "avro")), views)
    repairer.take_over([
        ([Rowless("db", "child", "ON DELETE CASCADE of db.parent")], "0-1-5"),
        ([Rowless("db", "t", "resync: its binlog was purged")], "resync")])
    assert repairer.resyncing == {TableName("db", "t")}
    assert not repairer.request_resync(TableName("db", "t"), "again")  # under way
    assert [entry["tables"] for entry in repairer.waiting()] == []  # no repair to read
    views.close()
