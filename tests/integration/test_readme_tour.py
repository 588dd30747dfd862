"""The README's five-minute tour, as written. Its commands are read out of the README itself
(every line of every ``sh`` block of "A five-minute tour"), so the README and this test cannot
drift: a command this test does not know fails it, and so does a check no command reached.

The README's first command, ``cdcserver demo``, runs as a user runs it, in a directory of its
own with ``.venv`` beside it; each tour command then runs there with ``bash``, with the demo's
default ports replaced by the ones it printed (and the broker's and two free ones for the
Kafka step's service). What each must show:

- the streams (``cdc``, ``cdc -f AVRO``, netcat) start with ``shop.orders``' schema and its
  records, and run until stopped, as a stream does;
- ``cdcserver dump`` takes a dump beside the running service, ``cdc dumps`` lists it, and
  ``cdc dump --follow`` saves a checked dump, then prints the stream after it;
- ``cdcserver status`` says OK, ``cdcserver ctl ... clients`` prints its table, and the
  console's address serves its page;
- the Kafka step's service publishes to the suite's broker (Apache Kafka), as written (an
  idempotent producer), until Ctrl-C stops it with exit code 0, and
  ``cdc kafka`` prints its messages;
- the ``pip install`` lines name extras that pyproject.toml declares (the suite's virtualenv
  has them all), and the Spark mirror's command is parsed by the mirror's own argument parser,
  not run: ``tests/integration/test_spark_workers.py`` runs that command with a Spark session.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tomllib
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.apache_kafka import ApacheKafka
from tests.helpers import wait_until

pytestmark = [pytest.mark.mariadb, pytest.mark.kafka, pytest.mark.slow,
              pytest.mark.timeout(900)]

ROOT = Path(__file__).parent.parent.parent
VENV = Path(sys.executable).parent.parent
TOUR = "## A five-minute tour"
# The demo's default ports, as the README writes them, and where each is found here.
DEMO_PORTS = {4001: "listener", 3307: "mariadb", 4002: "metrics", 8989: "admin"}
PRINTED = {
    "listener": re.compile(r"The CDC service is listening on 127\.0\.0\.1:(\d+)"),
    "mariadb": re.compile(r"mariadb --no-defaults -uroot -h127\.0\.0\.1 -P(\d+) shop"),
    "metrics": re.compile(r"Prometheus metrics at http://127\.0\.0\.1:(\d+)/metrics"),
    "admin": re.compile(r"http://127\.0\.0\.1:(\d+)/console/"),
}
STEP_TIMEOUT = 120.0


def tour() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index(f"\n{TOUR}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else len(text)]


def tour_commands() -> list[str]:
    """Every command of the tour's ``sh`` blocks, a backslash-continued line joined."""
    commands = []
    for block in re.findall(r"```sh\n(.*?)```", tour(), re.S):
        joined = re.sub(r"\\\n\s*", "", block)
        commands += [line for line in joined.splitlines() if line.strip()]
    return commands


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Background:
    """A command running in a process group of its own, its output in files."""

    def __init__(self, line: str, cwd: Path, name: str) -> None:
        self.line = line
        self.out, self.err = cwd / f"{name}.out", cwd / f"{name}.err"
        with open(self.out, "wb") as out, open(self.err, "wb") as err:
            self.process = subprocess.Popen(["bash", "-c", line], cwd=cwd, stdout=out,
                                            stderr=err, start_new_session=True)

    def output(self) -> str:
        return self.out.read_text(errors="replace")

    def errors(self) -> str:
        return self.err.read_text(errors="replace")

    def running(self) -> bool:
        return self.process.poll() is None

    def wait_for(self, condition: Callable[[], bool], what: str) -> None:
        try:
            wait_until(lambda: condition() or not self.running(), STEP_TIMEOUT, what)
        finally:
            assert condition(), (f"{self.line}\n{what}; exit code {self.process.poll()}\n"
                                 f"{self.output()[-2000:]}\n{self.errors()[-2000:]}")

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.running():
            os.killpg(self.process.pid, sig)
        try:
            return self.process.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            raise


def run_to_end(line: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["bash", "-c", line], cwd=cwd, capture_output=True, text=True,
                          timeout=STEP_TIMEOUT, check=False)
    assert done.returncode == 0, f"{line}\nexit code {done.returncode}\n{done.stdout}{done.stderr}"
    return done


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def is_orders_schema(line: dict[str, Any]) -> bool:
    return line.get("namespace") == "MaxScaleChangeDataSchema.avro" and \
        (line.get("database"), line.get("table")) == ("shop", "orders")


# -- what each command of the tour must show ---------------------------------------------------

class Tour:
    def __init__(self, cwd: Path, ports: dict[int, int], broker: ApacheKafka,
                 monkeypatch: pytest.MonkeyPatch) -> None:
        self.cwd, self.ports, self.broker, self.monkeypatch = cwd, ports, broker, monkeypatch
        self.background: list[Background] = []
        self.publisher: Background | None = None

    def stream(self, line: str) -> None:
        """``cdc ... shop.orders``: the schema, then the records, and on until stopped."""
        command = Background(line, self.cwd, "stream")
        command.wait_for(lambda: len(json_lines(command.output())) >= 2, "schema and records")
        lines = json_lines(command.output())
        assert is_orders_schema(lines[0]) and "event_type" in lines[1], lines[:2]
        assert command.running(), "a stream ends only when stopped"
        command.stop()

    def avro_stream(self, line: str) -> None:
        """``cdc ... -f AVRO shop.orders > orders.avro``: an Avro container of the table."""
        command = Background(line, self.cwd, "avro")
        saved = self.cwd / "orders.avro"

        def header() -> bool:
            return saved.exists() and saved.read_bytes()[:4] == b"Obj\x01" and \
                b'"table":"orders"' in saved.read_bytes().replace(b" ", b"")
        command.wait_for(header, "orders.avro's container header")
        assert command.running()
        command.stop()

    def netcat(self, line: str) -> None:
        """The protocol by hand: OK, OK, the schema line, the records."""
        command = Background(line, self.cwd, "netcat")
        command.wait_for(lambda: len(command.output().splitlines()) >= 4,
                         "two OKs, the schema, records")
        lines = command.output().splitlines()
        assert lines[:2] == ["OK", "OK"], lines[:2]
        assert is_orders_schema(json.loads(lines[2])) and "event_type" in json.loads(lines[3])
        command.stop()

    def take_dump(self, line: str) -> None:
        done = run_to_end(line, self.cwd)
        assert re.search(r"shop\.orders\.\S+\.dump: \d+ rows", done.stdout + done.stderr), done

    def list_dumps(self, line: str) -> None:
        done = run_to_end(line, self.cwd)
        assert any(d["name"].startswith("shop.orders.") for d in json_lines(done.stdout)), done

    def dump_and_follow(self, line: str) -> None:
        """``cdc dump shop.orders --follow -o orders.dump > changes.jsonl``."""
        command = Background(line, self.cwd, "follow")
        changes = self.cwd / "changes.jsonl"
        command.wait_for(lambda: "saved orders.dump" in command.errors() and changes.exists()
                         and bool(json_lines(changes.read_text())), "the dump, then the stream")
        header = json.loads((self.cwd / "orders.dump").read_text().splitlines()[0])
        assert (header["format"], header["table"]) == ("cdc-dump/1", "orders"), header
        assert is_orders_schema(json_lines(changes.read_text())[0])
        assert command.running(), "--follow goes on with the stream"
        command.stop()

    def status(self, line: str) -> None:
        done = run_to_end(line, self.cwd)
        assert re.match(r"service at http://127\.0\.0\.1:\d+: OK\n", done.stdout), done.stdout

    def ctl_clients(self, line: str) -> None:
        done = run_to_end(line, self.cwd)
        assert done.stdout.startswith("ID "), done.stdout

    def pip_extra(self, line: str) -> None:
        """Not run (the suite's virtualenv has every extra): the extra must exist."""
        (extra,) = re.findall(r"'\.\[(\w+)\]'", line)
        declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
            "optional-dependencies"]
        assert extra in declared, f"{line}: pyproject.toml has no extra {extra!r}"

    def kafka_service(self, line: str) -> None:
        """A second service publishing to the broker, until Ctrl-C (at the end of the tour)."""
        self.publisher = Background(line, self.cwd, "publisher")
        self.background.append(self.publisher)

    def kafka_reader(self, line: str) -> None:
        """``cdc kafka shop.orders``: once the service has published, its messages, decoded.
        Until it has, the topic does not exist and the command says so (tried again)."""
        tries: list[Background] = []

        def messages() -> bool:
            if not tries or (not tries[-1].running() and "no topic" in tries[-1].errors()):
                tries.append(Background(line, self.cwd, f"kafka{len(tries)}"))
            return any(m.get("topic") == "shop.orders" and m.get("table") == "orders"
                       for m in json_lines(tries[-1].output()))
        wait_until(lambda: messages() or (not tries[-1].running() and
                   "no topic" not in tries[-1].errors()), STEP_TIMEOUT, "Kafka messages")
        assert messages(), (tries[-1].output()[-2000:], tries[-1].errors()[-2000:])
        tries[-1].stop()

    def spark_mirror(self, line: str) -> None:
        """Parsed by the mirror's own parser, not run (it starts Spark)."""
        from mariadb_cdc_client.spark import mirror

        argv = shlex.split(line)
        assert argv[:3] == [".venv/bin/python", "-m", "mariadb_cdc_client.spark.mirror"], argv
        parsed: list[argparse.Namespace] = []
        original = argparse.ArgumentParser.parse_args

        class Parsed(Exception):
            pass

        def parse_args(parser: argparse.ArgumentParser, args: Any = None,
                       namespace: Any = None) -> argparse.Namespace:
            parsed.append(original(parser, args, namespace))
            raise Parsed
        self.monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_args)
        with pytest.raises(Parsed):
            mirror.main(argv[3:])
        self.monkeypatch.undo()
        (args,) = parsed
        assert (args.table, args.port, args.once) == ("shop.orders", str(self.ports[4001]), True)

    def stop(self) -> None:
        if self.publisher is not None:
            code = self.publisher.stop(signal.SIGINT)  # Ctrl-C
            assert code == 0, (code, self.publisher.errors()[-3000:])
        for command in self.background:
            if command.running():
                command.stop(signal.SIGKILL)


STEPS: dict[str, Callable[[Tour, str], None]] = {
    r"^\.venv/bin/cdc -h \S+ -P \d+ -u \S+ -p \S+ shop\.orders$": Tour.stream,
    r"^\.venv/bin/cdc -h \S+ -P \d+ -u \S+ -p \S+ -f AVRO shop\.orders > orders\.avro$":
        Tour.avro_stream,
    r"^printf .* \| nc 127\.0\.0\.1 \d+$": Tour.netcat,
    r"^\.venv/bin/cdcserver dump shop\.orders --source \S+ --data-dir \.cdc-demo/data$":
        Tour.take_dump,
    r"^\.venv/bin/cdc dumps ": Tour.list_dumps,
    r"^\.venv/bin/cdc dump shop\.orders --follow -o orders\.dump .* > changes\.jsonl$":
        Tour.dump_and_follow,
    r"^\.venv/bin/cdcserver status ": Tour.status,
    r"^\.venv/bin/cdcserver ctl .* clients$": Tour.ctl_clients,
    r"^\.venv/bin/pip install -e '\.\[\w+\]'$": Tour.pip_extra,
    r"^\.venv/bin/cdcserver run .* --kafka ": Tour.kafka_service,
    r"^\.venv/bin/cdc kafka shop\.orders ": Tour.kafka_reader,
    r"^\.venv/bin/python -m mariadb_cdc_client\.spark\.mirror ": Tour.spark_mirror,
}


def step_of(line: str) -> str:
    """The pattern of STEPS the command matches (without its comment), exactly one."""
    bare = re.sub(r"\s{2,}#.*$", "", line.strip())
    matching = [pattern for pattern in STEPS if re.search(pattern, bare)]
    assert len(matching) == 1, f"the tour's command {line!r} matches {matching}: give it a check"
    return matching[0]


def with_ports(line: str, ports: dict[int, int]) -> str:
    def port(match: re.Match[str]) -> str:
        number = int(match.group(2))
        assert number in ports, f"the tour names port {number}, which this test does not know"
        return f"{match.group(1)}{ports[number]}"
    return re.sub(r"(127\.0\.0\.1[: ]|-P )(\d+)\b", port, line)


# -- the tests -----------------------------------------------------------------------------------

def test_every_command_of_the_tour_has_a_check_and_every_check_a_command():
    used = [step_of(line) for line in tour_commands()]
    unused = set(STEPS) - set(used)
    assert not unused, f"checks no command of the tour reaches: {unused}"


def test_the_tour_runs_as_written(tmp_path: Path, kafka_broker: ApacheKafka,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    commands = tour_commands()
    (tmp_path / ".venv").symlink_to(VENV)
    demo = Background(".venv/bin/cdcserver demo --listen 127.0.0.1:0 --mariadb-port 0 "
                      "--trickle 1", tmp_path, "demo")
    tour_run: Tour | None = None
    try:
        demo.wait_for(lambda: "Press Ctrl-C to stop." in demo.output(), "the demo's banner")
        found = {name: pattern.search(demo.output()) for name, pattern in PRINTED.items()}
        printed = {name: int(match[1]) for name, match in found.items() if match}
        assert set(printed) == set(PRINTED), f"the demo did not print {set(PRINTED) - set(printed)}"
        ports = {number: printed[name] for number, name in DEMO_PORTS.items()}
        ports = {**ports, 9092: int(kafka_broker.bootstrap.rsplit(":", 1)[1]),
                 4011: free_port(), 4012: free_port()}
        tour_run = Tour(tmp_path, ports, kafka_broker, monkeypatch)
        for line in commands:
            STEPS[step_of(line)](tour_run, with_ports(line, ports))
        console = re.search(r"http://127\.0\.0\.1:\d+/console/", tour())
        assert console, "the tour names the console's address"
        with urllib.request.urlopen(with_ports(console[0], ports), timeout=30) as page:
            assert "console.js" in page.read().decode()
        tour_run.stop()
    finally:
        if tour_run is not None:
            for command in tour_run.background:
                if command.running():
                    command.stop(signal.SIGKILL)
        code = demo.stop(signal.SIGINT)  # Ctrl-C
    assert code == 0, demo.output()[-3000:]
