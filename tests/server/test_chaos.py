"""The differential chaos test (issue 35, item 6): random schema migrations and row changes
against the real MariaDB, the service killed with -9 at random points, every table rebuilt
from its raw JSON stream and compared with ``SELECT`` (``tests/chaos.py``), and every
``update_before``, ``delete`` and ``insert`` in it audited against the row the stream holds
for its key (issue 50, item 3: a true stream, not only a right ending).

Three seeds of 350 statements each (1,050 in all), two of them with a kill about every 60
statements. ``CHAOS_SEEDS=1,2,3`` and ``CHAOS_STATEMENTS=N`` run others; ``bench/bench_chaos.py``
runs the long soak. A failure prints the seed and writes the statement list beside the
test's data, to replay it.
"""

from __future__ import annotations

import os

import pytest

from tests import chaos
from tests.conftest import Source
from tests.helpers import PASSWORD, USER

pytestmark = [pytest.mark.mariadb, pytest.mark.slow]

SEEDS = [int(s) for s in os.environ.get("CHAOS_SEEDS", "20261128,7,4242").split(",")]
STATEMENTS = int(os.environ.get("CHAOS_STATEMENTS", "350"))


@pytest.mark.parametrize("seed", SEEDS)
async def test_random_migrations_with_kills_keep_every_table_exact(
        tmp_path, source: Source, users_file: str, seed: int):
    await _chaos(tmp_path, source, users_file, seed, 0 if seed == SEEDS[-1] else 60)


async def test_random_migrations_with_kills_and_every_repair_beside_the_stream(
        tmp_path, source: Source, users_file: str, monkeypatch: pytest.MonkeyPatch):
    """Another seed, with every keyed table's whole-table repair and resync read
    beside the stream (``reread/beside.py``: its changes held meanwhile, ``reread/held.py``),
    however small the table: kills land while repairs read, hold and release."""
    monkeypatch.setenv("CDC_TEST_BESIDE_MIN_BYTES", "0")
    await _chaos(tmp_path, source, users_file, SEEDS[0] + 1, 60)
    log = (tmp_path / "service.log").read_text(errors="replace")
    assert "is read beside the stream" in log, "no repair took the path this test is for"


async def test_random_migrations_with_kills_and_application_sessions(
        tmp_path, source: Source, users_file: str):
    """Another seed, with what one application's session may do among the migrations
    (issue 50): XA transactions left prepared across kills and committed or rolled back
    later from another connection, changes logged as statements, a rollback to a savepoint
    over a MyISAM table. The service used to stop at each."""
    await _chaos(tmp_path, source, users_file, SEEDS[0] + 2, 60, sessions=True)
    log = (tmp_path / "service.log").read_text(errors="replace")
    assert " prepared at " in log, "no XA transaction was prepared"


async def _chaos(tmp_path, source: Source, users_file: str, seed: int,
                 kill_every: int, sessions: bool = False) -> None:
    outcome = await chaos.run(
        source.url, lambda: source.server.connect(source.database), source.database,
        str(tmp_path / "data"), users_file, USER, PASSWORD, seed=seed, statements=STATEMENTS,
        kill_every=kill_every, log_path=str(tmp_path / "service.log"), sessions=sessions)
    replay = tmp_path / f"chaos-{seed}.sql"
    replay.write_text(outcome.statement_list())
    assert outcome.exact, f"{outcome.report()}\nstatements: {replay}\nservice log: " \
                  f"{tmp_path / 'service.log'}"
    assert outcome.kills >= (STATEMENTS // 90 if kill_every else 0)
