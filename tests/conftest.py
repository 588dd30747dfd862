"""Fixtures: a real MariaDB for the session, and the service started on port 0 per test.

The MariaDB server is Debian's ``mariadbd``, started privately by :mod:`cdcserver.app.embedded`
with the binlog settings CDC needs; ``source`` gives each test a clean binlog (``RESET MASTER``)
and a database of its own. Services run in the test's event loop and are awaited to readiness
through their ``started`` callback, never by sleeping.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import logging
import os
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from cdcserver.app.embedded import EmbeddedMariaDB
from cdcserver.app.service import Service
from cdcserver.core.captureconfig import CaptureConfig
from cdcserver.core.config import (
    AdminConfig,
    Config,
    DumpConfig,
    ListenerConfig,
    MetricsConfig,
    RetentionConfig,
    SourceConfig,
    StoreConfig,
)
from cdcserver.core.gtid import GtidState, same_transaction
from cdcserver.core.kafkaconfig import KafkaConfig
from cdcserver.protocol.users import UsersFile
from tests.apache_kafka import ApacheKafka
from tests.apicurio import Apicurio
from tests.helpers import JVM_OPTIONS, PASSWORD, USER, eventually

_server_ids = itertools.count(5000)


def next_server_id() -> int:
    """A server_id no other service of this test session replicates with."""
    return next(_server_ids)


@pytest.fixture(scope="session")
def mariadb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedMariaDB]:
    server = EmbeddedMariaDB(str(tmp_path_factory.mktemp("mariadb")), port=0)
    server.start()
    yield server
    server.stop()


class Source:
    """The shared MariaDB, with a clean binlog and a database for this test."""

    def __init__(self, server: EmbeddedMariaDB, database: str) -> None:
        self.server = server
        self.database = database

    @property
    def url(self) -> str:
        return self.server.url()

    def execute(self, *statements: str) -> None:
        self.server.execute(*statements)

    def query(self, sql: str, args: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
        return self.server.query(sql, args)

    def gtid_state(self) -> GtidState:
        return GtidState.parse(str(self.query("SELECT @@GLOBAL.gtid_binlog_pos")[0][0] or ""))


@pytest.fixture
def source(mariadb: EmbeddedMariaDB, request: pytest.FixtureRequest) -> Source:
    name = "".join(c if c.isalnum() else "_" for c in request.node.name)
    if len(name) > 50:  # keep parametrized names apart: a topic or file may be named after it
        name = name[:41] + "_" + hashlib.sha1(name.encode()).hexdigest()[:8]
    database = "t_" + name
    existing = [row[0] for row in mariadb.query("SHOW DATABASES")]
    mariadb.execute(*(f"DROP DATABASE `{db}`" for db in existing if str(db).startswith("t_")))
    mariadb.execute("RESET MASTER", f"CREATE DATABASE `{database}`")
    return Source(mariadb, database)


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApacheKafka]:
    """One Apache Kafka node (broker and controller) for the session; tests use topics of
    their own. ``.bootstrap`` is its address."""
    broker = ApacheKafka(tmp_path_factory.mktemp("kafka"))
    broker.start()
    yield broker
    broker.close()


@pytest.fixture(scope="session")
def _kafka_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApacheKafka]:
    cluster = ApacheKafka(tmp_path_factory.mktemp("kafka-cluster"), nodes=3)
    cluster.start()
    yield cluster
    cluster.close()


@pytest.fixture
def kafka_cluster(_kafka_cluster: ApacheKafka) -> ApacheKafka:
    """Three Apache Kafka nodes, each broker and controller (a 3-voter quorum), topics
    replicated 3 times with min.insync.replicas 2: for fault tests, which kill nodes
    (``kill(node_id)``, ``start(node_id)``, ``leader_of(topic, partition)``). Started the
    first time a test asks, shared by the session; a test finds every node running (one a
    failed test left killed is started again)."""
    for node_id in _kafka_cluster.nodes:
        if node_id not in _kafka_cluster.running():
            _kafka_cluster.start(node_id)
    return _kafka_cluster


@pytest.fixture(scope="session")
def schema_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Apicurio]:
    """Apicurio Registry 3 (in memory) for the session: the registry tests and the JDBC sink's
    Avro runs share it (tests use subjects of their own)."""
    registry = Apicurio(str(tmp_path_factory.mktemp("apicurio")))
    registry.start()
    yield registry
    registry.stop()


@pytest.fixture
def users_file(tmp_path: os.PathLike[str]) -> str:
    path = os.path.join(tmp_path, "cdcusers")
    UsersFile(path).add(USER, PASSWORD)
    return path


class RunningService:
    def __init__(self, service: Service, task: asyncio.Task[None], stop: asyncio.Event) -> None:
        self.service = service
        self.task = task
        self._stop = stop

    @property
    def host(self) -> str:
        assert self.service.listener.address is not None
        return self.service.listener.address[0]

    @property
    def port(self) -> int:
        assert self.service.listener.address is not None
        return self.service.listener.address[1]

    async def replicating(self, timeout: float = 60.0) -> None:
        """Wait until the replicator has resolved its start position and is running."""
        await self._unless_stopped(self.service.replication.runner.replicating.wait(), timeout)

    async def caught_up(self, source: Source, timeout: float = 60.0) -> None:
        """Wait until every sink has applied everything the source has logged so far: the
        pipeline's state is the source's, transaction for transaction (a GTID may repeat
        without gtid_strict_mode, so "covered" is not enough)."""
        await self._unless_stopped(self._exactly_at(source.gtid_state()), timeout)

    async def repairs_out(self, source: Source, timeout: float = 60.0) -> None:
        """Until no repair waits: the records of a repair read beside the stream ride on
        the source's next transaction after its read (docs/repairs.md), so transactions
        on a table of the test's own are committed meanwhile."""
        tick = f"`{source.database}`._tick"
        source.execute(f"CREATE TABLE IF NOT EXISTS {tick} (id INT AUTO_INCREMENT PRIMARY KEY)")

        async def done() -> bool:
            source.execute(f"INSERT INTO {tick} VALUES ()")
            await self.caught_up(source)
            return not self.service.replication.runner.stats().repair_pending

        await eventually(done, bool, timeout, "the repairs")

    async def _exactly_at(self, target: GtidState) -> None:
        service = self.service
        await service.wait_caught_up(target)
        while True:
            pipeline = service.replication.runner.pipeline
            assert pipeline is not None
            if all(same_transaction(pipeline.state.get(g.key), g) for g in target):
                return
            await pipeline.progress()

    async def _unless_stopped(self, awaitable: Any, timeout: float) -> None:
        waiter = asyncio.ensure_future(awaitable)
        try:
            async with asyncio.timeout(timeout):
                await asyncio.wait({waiter, self.task}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
        if self.task.done():
            self.task.result()
            raise RuntimeError("the service stopped")
        waiter.result()

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.wait_for(self.task, 60)


@pytest.fixture(autouse=True)
def _root_logger_restored() -> Iterator[None]:
    """A command's ``main`` run in-process (``cdcserver check``, ``cdc``) sets the root
    logger up on the stderr of the test that ran it, at INFO: left so, a later record (py4j's
    INFO when a Spark gateway is collected) goes to that test's closed capture and prints a
    "Logging error" into whichever test runs then. Each test gets the root logger back as it
    found it."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def make_config(data_dir: str, source_url: str, users: str, **sections: dict[str, object]
                ) -> Config:
    source_cfg = dict(url=source_url, server_id=next_server_id(), start_gtid="oldest",
                      heartbeat=1.0)
    source_cfg.update(sections.get("source", {}))
    store_cfg: dict[str, object] = dict(data_dir=data_dir, flush_interval=0.05)
    store_cfg.update(sections.get("store", {}))
    listener_cfg: dict[str, object] = dict(listen="127.0.0.1:0", users_file=users)
    metrics_cfg: dict[str, object] = dict(listen="127.0.0.1:0", lag_interval=0.5)
    metrics_cfg.update(sections.get("metrics", {}))
    listener_cfg.update(sections.get("listener", {}))
    return Config(source=SourceConfig(**source_cfg),  # type: ignore[arg-type]
                  store=StoreConfig(**store_cfg),  # type: ignore[arg-type]
                  listener=ListenerConfig(**listener_cfg),  # type: ignore[arg-type]
                  dump=DumpConfig(**sections.get("dump", {})),  # type: ignore[arg-type]
                  retention=RetentionConfig(**sections.get("retention", {})),  # type: ignore[arg-type]
                  kafka=KafkaConfig(**sections.get("kafka", {})),  # type: ignore[arg-type]
                  capture=CaptureConfig(**sections.get("capture", {})),  # type: ignore[arg-type]
                  admin=AdminConfig(**sections.get("admin", {})),  # type: ignore[arg-type]
                  metrics=MetricsConfig(**metrics_cfg))  # type: ignore[arg-type]


async def start_service(config: Config, sinks: tuple[Any, ...] = ()) -> RunningService:
    """The service running in this event loop (``sinks``: more sinks, there from the
    start)."""
    service = Service(config, more_sinks=sinks)
    stop = asyncio.Event()
    started = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(service.run(stop, started=lambda s: started.set_result(s)))
    await asyncio.wait({started, task}, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        task.result()
        raise RuntimeError("the service stopped before it started")
    return RunningService(service, task, stop)


@pytest.fixture
async def cdc(tmp_path: os.PathLike[str], source: Source, users_file: str
              ) -> AsyncIterator[RunningService]:
    """The service on a fresh data directory, replicating the test's source."""
    running = await start_service(make_config(os.path.join(tmp_path, "data"), source.url,
                                              users_file))
    yield running
    if not running.task.done():
        await running.stop()


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """A local Spark session (two executor threads) with the ``cdc`` data source registered.
    Its Python workers run this interpreter, so they import the project from the venv."""
    import sys

    from pyspark.sql import SparkSession

    from mariadb_cdc_client.spark import register

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    session = (SparkSession.builder.master("local[2]").appName("cdc-tests")
               .config("spark.driver.extraJavaOptions", JVM_OPTIONS)
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.sql.session.timeZone", "UTC")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    yield session
    session.stop()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """With pytest-xdist (tests/run.sh runs the suite on several workers, each with its own
    MariaDB, broker and ports), the tests that use the local Spark session (``spark``)
    share one worker: one JVM, not one each. Those that run Spark in processes of their own
    (``spark-submit``, ``spark-pipelines``) go wherever there is room. First among the
    hooks: xdist's own (``--dist loadgroup``) reads the groups from the markers in the same
    hook, and a marker added after it has no effect."""
    for item in items:
        if "spark" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("spark"))


def pytest_collection_finish(session: pytest.Session) -> None:
    """Refuse to run when ``--dist loadgroup`` does not group: pytest 9.2 renamed what
    xdist 3.8 sets to group a test (``item._nodeid``), and every group went to every worker
    without a word: four Spark JVMs and clusters at once, the same wheel built four times,
    two in-tree builds colliding. A worker's group shows as a ``@name`` suffix of the node
    ID."""
    if not session.config.getoption("loadgroup", default=False):
        return
    ungrouped = [item.nodeid for item in session.items
                 if item.get_closest_marker("xdist_group") is not None and "@" not in
                 item.nodeid]
    if ungrouped:
        message = (f"--dist loadgroup does not group with pytest {pytest.__version__} and "
                   f"this pytest-xdist (e.g. {ungrouped[0]}): use the versions "
                   "pyproject.toml's test extra pins")
        sys.__stderr__.write(f"\ntests/conftest.py: {message}\n")  # xdist hides the error
        raise pytest.UsageError(message)


def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item
                                  ) -> dict[str, Callable[[], asyncio.AbstractEventLoop]]:
    """The loop the service runs on in production (``cdcserver run`` installs uvloop): the
    tests that run the service in their own loop run it there too. uvloop says some things
    its own way (RuntimeError on a closed transport, where asyncio raises ConnectionError),
    and a test on asyncio's loop would not see what the service does with them.
    ``CDC_TEST_LOOP=asyncio`` runs them on asyncio's loop instead."""
    asyncio_loop = {"asyncio": asyncio.new_event_loop}
    if os.environ.get("CDC_TEST_LOOP", "uvloop") == "asyncio":
        return asyncio_loop
    try:
        import uvloop
    except ImportError:  # not installed where cdcserver run would not use it either
        return asyncio_loop
    return {"uvloop": uvloop.new_event_loop}
