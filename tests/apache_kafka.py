"""Apache Kafka for the tests: the real broker (KRaft mode, no ZooKeeper), run from the jars
tests/jvm/fetch.sh resolved (``tests/jvm/kafka/pom.xml`` pins the version).

``ApacheKafka(directory)`` is one node that is broker and controller at once, the suite's
``kafka_broker``; ``ApacheKafka(directory, nodes=3)`` is a cluster of three such nodes, a
3-voter quorum, topics replicated 3 times with ``min.insync.replicas`` 2 (the
``kafka_cluster`` fixture, for fault tests). Every port is a free one on 127.0.0.1; each node
keeps its log in ``directory/node<N>/data``, so a node stopped or killed and started again
has its topics back, and logs to ``directory/node<N>.log``, which every error names.
``ApacheKafka(directory, host=host)`` runs the single node inside a ``tests/netfault.Host``,
listening on its address: the tests cut the link between it and the service.

The JVMs die with the test process: they are started from one thread of this module's that
lives as long as the process, with ``PR_SET_PDEATHSIG`` (:func:`die_with_parent`), whichever
thread asks (an event loop's worker thread ends with its loop, and would take them along).
The methods block; from a coroutine, call them through ``asyncio.to_thread``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import random
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import IO, Any, TypeVar

from cdcserver.core.lifetime import die_with_parent
from tests import jvm

T = TypeVar("T")

# Startup reads ~50 jars and compiles with C1 only; on two shared cores it takes 3 to 15 s.
START_TIMEOUT = 120.0
# 256 MB of heap is many times what the tests' topics need (3 nodes fit in under 1.5 GB RSS).
HEAP = "256m"

# One thread that starts every JVM and never ends before the process (see the module's
# docstring).
_launcher = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="kafka-launcher")


# Ports are drawn independently of the random module's state (tests seed it), and never
# handed out twice by this process: a port is free until its node binds it, seconds later,
# and a cluster once drew the same one for node 1's controller and node 2's clients (node 2
# failed to start: "Address already in use").
_random = random.SystemRandom()
_handed_out: set[int] = set()


def free_port() -> int:
    """A free port on 127.0.0.1 below the kernel's ephemeral range: a node stopped and
    started again binds its ports again, and in between no port 0 of another test (nor the
    local end of a connection) can have taken them."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            first = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        first = 32768
    low = min(first, 32768) // 2
    while True:
        port = _random.randrange(low, first)
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port


def _accepting(port: int, address: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((address, port), timeout=0.5):
            return True
    except OSError:
        return False


def _in_own_loop(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a coroutine to its end in an event loop of its own, on a thread of its own, so
    that it can be called from a thread that runs a loop already."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(lambda: asyncio.run(make())).result()


async def _metadata(bootstrap: str) -> Any:
    """The cluster metadata (every topic) as the nodes of ``bootstrap`` answer it."""
    from aiokafka.client import AIOKafkaClient

    client = AIOKafkaClient(bootstrap_servers=bootstrap, request_timeout_ms=5000)
    try:
        await client.bootstrap()
        return await client.fetch_all_metadata()
    finally:
        await client.close()


class KafkaNode:
    """One broker-and-controller process."""

    def __init__(self, node_id: int, directory: Path, port: int, controller_port: int,
                 advertised_port: int, address: str = "127.0.0.1",
                 launcher: tuple[str, ...] = (), heap: str = HEAP) -> None:
        self.node_id = node_id
        self.heap = heap
        self.address = address  # where it listens
        self.launcher = launcher  # the command prefix that runs it (in a network namespace)
        self.port = port
        self.controller_port = controller_port
        self.advertised_port = advertised_port
        self.home = directory / f"node{node_id}"
        self.data_dir = self.home / "data"
        self.properties = self.home / "server.properties"
        self.log_path = directory / f"node{node_id}.log"
        self.process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def launch(self) -> None:
        """Start the JVM (returns at once; :meth:`ApacheKafka.start` waits for it)."""
        if self.running:
            raise RuntimeError(f"Kafka node {self.node_id} is running already")
        self._close_log()
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed by _close_log()
        self._log.write(f"--- started {time.strftime('%H:%M:%S')} ---\n".encode())
        self._log.flush()
        command = jvm.command("kafka", "kafka.Kafka", str(self.properties), heap=self.heap,
                              options=("-Xms64m", "-Dorg.slf4j.simpleLogger.showDateTime=true",
                                       "-Dorg.slf4j.simpleLogger.dateTimeFormat=HH:mm:ss.SSS"))
        command = [*self.launcher, *command]
        log = self._log
        self.process = _launcher.submit(
            lambda: subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL,
                                     preexec_fn=die_with_parent)).result()

    def kill(self) -> None:
        """SIGKILL: no clean shutdown, whatever was not acknowledged may be lost."""
        if self.process is not None:
            if self.process.poll() is None:
                self.process.send_signal(signal.SIGKILL)
            self.process.wait(30)
            self.process = None
        self._close_log()

    def terminate(self) -> None:
        """Ask for a clean shutdown (SIGTERM); :meth:`stop` waits for it."""
        if self.running:
            assert self.process is not None
            self.process.terminate()

    def stop(self, timeout: float = 30.0) -> None:
        """A clean shutdown (SIGTERM), SIGKILL if it takes more than ``timeout``."""
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(30)
            self.process = None
        self._close_log()

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None


class ApacheKafka:
    """A single Kafka node (``nodes=1``) or a cluster of ``nodes`` nodes, each broker and
    controller. ``advertised_port`` (single node only): the port the broker gives clients in
    its metadata instead of its own, a proxy's in front of it."""

    def __init__(self, directory: str | os.PathLike[str], nodes: int = 1, *,
                 advertised_port: int | None = None, host: Any = None,
                 heap: str = HEAP) -> None:
        """``heap``: each node's JVM heap (the default is the tests'; a soak that makes
        thousands of topics needs more)."""
        if (advertised_port is not None or host is not None) and nodes != 1:
            raise ValueError("advertised_port and host are for a single node")
        self.address = host.address if host is not None else "127.0.0.1"
        launcher = tuple(host.launcher) if host is not None else ()
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.cluster_id = ""
        self.nodes: dict[int, KafkaNode] = {}
        for node_id in range(1, nodes + 1):
            port = free_port()
            self.nodes[node_id] = KafkaNode(node_id, self.directory, port, free_port(),
                                            advertised_port or port, self.address, launcher,
                                            heap)
        self._formatted = False

    @property
    def bootstrap(self) -> str:
        """Every node's advertised address, comma-separated (a client needs one that
        answers)."""
        return ",".join(f"{n.address}:{n.advertised_port}" for n in self.nodes.values())

    @property
    def port(self) -> int:
        """The single node's own port (what a proxy in front of it connects to)."""
        (node,) = self.nodes.values()
        return node.port

    def _properties(self, node: KafkaNode) -> str:
        voters = ",".join(f"{n.node_id}@{n.address}:{n.controller_port}"
                          for n in self.nodes.values())
        replicas = len(self.nodes)
        min_isr = 2 if replicas >= 3 else 1
        settings = {
            "process.roles": "broker,controller",
            "node.id": node.node_id,
            "controller.quorum.voters": voters,
            "listeners": f"PLAINTEXT://{node.address}:{node.port},"
                         f"CONTROLLER://{node.address}:{node.controller_port}",
            "advertised.listeners": f"PLAINTEXT://{node.address}:{node.advertised_port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(node.data_dir),
            # Replication: all of it on a cluster, and a write is acknowledged (acks=all) once
            # 2 replicas have it, so one node may be down.
            "default.replication.factor": replicas,
            "min.insync.replicas": min_isr,
            "offsets.topic.replication.factor": replicas,
            "transaction.state.log.replication.factor": replicas,
            "transaction.state.log.min.isr": min_isr,
            "share.coordinator.state.topic.replication.factor": replicas,
            "share.coordinator.state.topic.min.isr": min_isr,
            # Fewer partitions for the internal topics than the 50 of a production cluster:
            # they are created on first use, while a test waits.
            "offsets.topic.num.partitions": 4,
            "transaction.state.log.num.partitions": 4,
            "num.partitions": 1,
            "group.initial.rebalance.delay.ms": 0,
            # The log cleaner's buffer is 128 MB by default: half this heap.
            "log.cleaner.dedupe.buffer.size": 8 * 1024 * 1024,
            # A killed node is fenced (its partitions get a new leader) after 4 s without a
            # heartbeat instead of 9; still far above the pauses of a loaded machine.
            "broker.heartbeat.interval.ms": 500,
            "broker.session.timeout.ms": 4000,
            # Fewer threads than for a production machine's cores: two are shared here.
            "num.network.threads": 2,
            "num.io.threads": 2,
            "background.threads": 2,
            "num.recovery.threads.per.data.dir": 1,
        }
        return "".join(f"{key}={value}\n" for key, value in settings.items())

    def _format(self) -> None:
        """Write each node's properties and format its log directory (once: a restart keeps
        them)."""
        self.cluster_id = base64_uuid()
        formats = []
        for node in self.nodes.values():  # all at once: a JVM each
            node.home.mkdir(parents=True, exist_ok=True)
            node.properties.write_text(self._properties(node))
            with open(node.log_path, "ab") as log:
                formats.append((node, subprocess.Popen(
                    jvm.command("kafka", "kafka.tools.StorageTool", "format", "-t",
                                self.cluster_id, "-c", str(node.properties), heap="128m"),
                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)))
        for node, process in formats:
            try:
                code = process.wait(START_TIMEOUT)
            except subprocess.TimeoutExpired:
                process.kill()
                code = process.wait()
            if code != 0:
                raise RuntimeError(f"formatting Kafka node {node.node_id} failed (exit code "
                                   f"{code}); see {node.log_path}")
        self._formatted = True

    def start(self, node_id: int | None = None) -> None:
        """Start every node (formatted the first time), or the one given, and wait until it
        answers metadata that lists it (for every node: it is registered with the quorum and
        not fenced, it serves clients)."""
        if not self._formatted:
            self._format()
        nodes = list(self.nodes.values()) if node_id is None else [self.nodes[node_id]]
        for node in nodes:  # all at once: a node's start waits for the quorum
            node.launch()
        for node in nodes:
            self._wait_serving(node)

    def _wait_serving(self, node: KafkaNode) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if not node.running:
                code = node.process.returncode if node.process else None
                raise RuntimeError(f"Kafka node {node.node_id} exited with {code}; see "
                                   f"{node.log_path}")
            if _accepting(node.port, node.address):
                try:
                    metadata = _in_own_loop(lambda: _metadata(f"{node.address}:{node.port}"))
                    if any(b.nodeId == node.node_id for b in metadata.brokers()):
                        return
                except ImportError:
                    raise  # aiokafka missing: no wait makes it ready (the kafka extra)
                except Exception:  # noqa: BLE001 - not ready yet: asked again below
                    pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"Kafka node {node.node_id} did not serve within "
                                   f"{START_TIMEOUT:.0f} s; see {node.log_path}")
            time.sleep(0.1)

    def kill(self, node_id: int) -> None:
        """SIGKILL one node (``kill -9``)."""
        self.nodes[node_id].kill()

    def stop(self, node_id: int | None = None) -> None:
        """Stop every node (all at once), or the one given, cleanly: SIGTERM, then SIGKILL
        after 30 s. (Node by node, the last ones would wait for a quorum that is gone.)"""
        nodes = list(self.nodes.values()) if node_id is None else [self.nodes[node_id]]
        for node in nodes:
            node.terminate()
        for node in nodes:
            node.stop()

    def close(self) -> None:
        """SIGKILL every node: the end of a test's cluster, whose data nobody reads again."""
        for node in self.nodes.values():
            node.kill()

    def running(self) -> list[int]:
        return [n.node_id for n in self.nodes.values() if n.running]

    def leader_of(self, topic: str, partition: int = 0) -> int | None:
        """The node that leads a partition now, as the running nodes' metadata says (None
        while it has no leader)."""
        bootstrap = ",".join(f"{n.address}:{n.port}" for n in self.nodes.values() if n.running)
        from aiokafka.structs import TopicPartition

        metadata = _in_own_loop(lambda: _metadata(bootstrap))
        leader = metadata.leader_for_partition(TopicPartition(topic, partition))
        return None if leader is None or leader < 0 else int(leader)

    def log_files(self) -> list[str]:
        return [str(n.log_path) for n in self.nodes.values()]


def base64_uuid() -> str:
    """A cluster ID as Kafka makes them (``StorageTool random-uuid``: URL-safe base64 of 16
    random bytes, unpadded, never starting with ``-``, which a command line would take for
    an option), without starting a JVM for it."""
    import base64

    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text
