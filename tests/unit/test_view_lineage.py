"""A view is folded down the chain of renames that brought a table its rows
(cdcserver/reread/fold.py): walked, not recursed. A table swapped back and forth thousands of
times (a long soak of migrations) made the fold raise RecursionError, which quarantined it."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from cdcserver.core.names import TableName
from cdcserver.reread.fold import _lineage
from cdcserver.store.catalog import VersionDdl

DEPTH = 5000  # renames, far past Python's recursion limit


def _version(gtid: str, **ddl: str) -> Any:
    return SimpleNamespace(schema=SimpleNamespace(avsc={"ddl": ddl}, gtid=gtid),
                           ddl=VersionDdl.of(SimpleNamespace(avsc={"ddl": ddl}, gtid=gtid)))


class _Catalog:
    """Table ``t`` renamed from ``a4999``, renamed from ``a4998`` ... from ``a0``."""

    def __init__(self) -> None:
        self.entries: dict[TableName, Any] = {}
        names = [f"a{i}" for i in range(DEPTH)] + ["t"]
        for i, name in enumerate(names):
            versions = {1: _version(f"0-1-{i}", kind="create", **(
                {"renamed_from": f"db.{names[i - 1]}"} if i else {}))}
            if i + 1 < len(names):
                versions[2] = _version(f"0-1-{i + 1}", kind="drop",
                                       renamed_to=f"db.{names[i + 1]}")
            self.entries[TableName("db", name)] = SimpleNamespace(versions=versions)

    def get(self, table: TableName) -> Any:
        return self.entries.get(table)


def test_a_chain_of_thousands_of_renames_is_walked_to_its_start():
    segments = _lineage(_Catalog(), TableName("db", "t"))  # type: ignore[arg-type]
    assert len(segments) == DEPTH + 1
    assert [len(versions) for versions, _ in segments] == [1] * (DEPTH + 1)  # up to the rename
    oldest = segments[-1][0][0]
    assert oldest.schema.avsc["ddl"] == {"kind": "create"}
