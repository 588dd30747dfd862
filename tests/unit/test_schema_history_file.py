"""The schema history's file keeps whole lines only: a line the disk takes part of is taken
back, so the next line and the next start read a whole file.

A disk that fills in the middle of a write takes what fits and reports no error; the next
write fails. The kernel does the same at a process's file size limit (``RLIMIT_FSIZE``: the
write is cut at the limit, the next one fails with ``EFBIG``), which a child process sets here,
so the write really is cut short: no stand-in for the file system."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from cdcserver.core.gtid import Gtid, GtidState
from cdcserver.core.names import TableName
from cdcserver.schema.historyfile import append_change, read_history

_CUT_SHORT = """
import resource, signal, sys
from cdcserver.core.gtid import Gtid
from cdcserver.core.names import TableName
from cdcserver.schema.historyfile import append_change
path, limit = sys.argv[1], int(sys.argv[2])
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # (EFBIG, as a full disk's ENOSPC)
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
try:
    append_change(path, TableName("db", "dropped"), None, Gtid(0, 1, 2))
except OSError as exc:
    print("refused:", exc.errno)
else:
    print("appended")
"""


def _bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def test_a_line_the_disk_takes_part_of_is_taken_back(tmp_path) -> None:
    path = str(tmp_path / "schema_history.jsonl")
    append_change(path, TableName("db", "kept"), None, Gtid(0, 1, 1))
    before = _bytes(path)
    # room for a few bytes more: the next line's write is cut there
    limit = len(before) + 10
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", _CUT_SHORT, path, str(limit)], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("refused:"), done.stdout  # not "appended" with half a line
    assert _bytes(path) == before

    append_change(path, TableName("db", "later"), None, Gtid(0, 1, 3))
    lines = _bytes(path).decode().splitlines()
    assert [json.loads(line)["gtid"] for line in lines] == ["0-1-1", "0-1-3"]
    assert read_history(path, GtidState([Gtid(0, 1, 3)])) == {}


def test_a_last_line_of_zeros_is_torn_and_any_earlier_bad_line_is_an_error(tmp_path) -> None:
    """A power loss while appending can leave the file's new size with zeros where the line
    was, its newline included or not: that last line is torn, as a line cut short is (its
    transaction was not applied). A line before it that is not JSON is damage, and says so."""
    path = str(tmp_path / "schema_history.jsonl")
    append_change(path, TableName("db", "kept"), None, Gtid(0, 1, 1))
    whole = _bytes(path)
    for tail in (b"\0" * 5000, b"\0" * 5000 + b"\n", b"\0" * 4096 + b'"db"]}\n\n',
                 b'{"gtid": "0-1-2", "tab', b"\xff\xfe\n"):
        with open(path, "wb") as f:
            f.write(whole + tail)
        assert read_history(path, GtidState([Gtid(0, 1, 3)])) == {}
    with open(path, "wb") as f:
        f.write(b"\0" * 100 + b"\n" + whole)
    try:
        read_history(path, GtidState([Gtid(0, 1, 3)]))
    except ValueError:
        pass
    else:
        raise AssertionError("a damaged line before the last was taken")
