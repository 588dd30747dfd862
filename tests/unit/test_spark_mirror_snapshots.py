"""The Parquet mirror keeps a replaced snapshot for the readers that opened it before
``CURRENT`` moved: a CI run read ``batch=0``'s files while the next batch removed them at once
(``FileNotFoundError``). ``remove_replaced`` removes what was replaced ``keep`` seconds ago or
more, never the current snapshot. (Files only: the batches themselves are Spark's, tested
in tests/integration/test_spark.py and test_spark_cluster.py.)"""

from __future__ import annotations

import os
import time
from pathlib import Path

from mariadb_cdc_client.spark.mirror import CURRENT, current_snapshot, remove_replaced


def _snapshot(root: Path, name: str, replaced_ago: float) -> Path:
    directory = root / name
    directory.mkdir()
    (directory / "part-00000.parquet").write_bytes(b"PAR1")
    when = time.time() - replaced_ago
    os.utime(directory, (when, when))
    return directory


def test_a_snapshot_replaced_within_the_time_kept_stays_and_an_older_one_goes(tmp_path: Path):
    _snapshot(tmp_path, "batch=0", replaced_ago=600)
    _snapshot(tmp_path, "batch=1", replaced_ago=5)
    _snapshot(tmp_path, "batch=2", replaced_ago=3600)  # current: written long ago, kept
    (tmp_path / CURRENT).write_text("batch=2\n")

    removed = remove_replaced(str(tmp_path), keep=60)

    assert removed == ["batch=0"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [CURRENT, "batch=1", "batch=2"]
    assert current_snapshot(str(tmp_path)) == str(tmp_path / "batch=2")
    assert (tmp_path / "batch=1" / "part-00000.parquet").read_bytes() == b"PAR1"


def test_nothing_is_removed_before_a_first_snapshot_and_other_files_are_left(tmp_path: Path):
    _snapshot(tmp_path, "batch=0", replaced_ago=600)  # half written by a crash, no CURRENT
    (tmp_path / "notes.txt").write_text("a user's file")
    old = time.time() - 600
    os.utime(tmp_path / "notes.txt", (old, old))

    assert remove_replaced(str(tmp_path), keep=600 + 60) == []
    assert remove_replaced(str(tmp_path), keep=60) == ["batch=0"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]
