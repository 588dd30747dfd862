"""docker/: no Docker engine runs here, so the files are checked for what can be checked
without one: they parse, every file they name exists, and they agree with each other and
with the service (ports, paths, host names, users, passwords, flags)."""

from __future__ import annotations

import importlib
import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from cdcserver.core.config import Config, parse_source_url
from cdcserver.core.names import TableName
from cdcserver.ops import status
from cdcserver.ops.status import endpoint_url
from cdcserver.protocol.users import UsersFile
from mariadb_cdc_client.format.wire import password_hash

ROOT = Path(__file__).parent.parent.parent
DOCKER = ROOT / "docker"


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    return document


@pytest.fixture(scope="module")
def config() -> Config:
    return Config.load(str(DOCKER / "cdc.toml"), environ={})


def _instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(instruction, arguments), with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    lines = [line.strip() for line in text.splitlines()]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1])
            for line in lines if line and not line.startswith("#")]


def _mounts(service: dict[str, Any]) -> dict[str, str]:
    """Container path -> host path (relative to docker/) or volume name."""
    return {volume.split(":")[1]: volume.split(":")[0] for volume in service.get("volumes", [])}


def test_compose_has_the_shape_compose_requires(compose: dict[str, Any]):
    assert set(compose["services"]) == {"mariadb", "kafka", "cdc", "spark-mirror"}
    named_volumes = set(compose.get("volumes", {}))
    for name, service in compose["services"].items():
        assert ("image" in service) != ("build" in service), name
        for dependency in service.get("depends_on", {}):
            assert dependency in compose["services"], (name, dependency)
        for host_side in _mounts(service).values():
            if host_side.startswith("."):
                assert (DOCKER / host_side).exists(), (name, host_side)
            else:
                assert host_side in named_volumes, (name, host_side)
        if "build" in service:
            assert (DOCKER / service["build"]["context"] / service["build"]["dockerfile"]
                    ).is_file()
    for condition in (d["condition"] for s in compose["services"].values()
                      for d in s.get("depends_on", {}).values()):
        assert condition in ("service_started", "service_healthy", "service_completed_successfully")


@pytest.mark.parametrize("name", ["Dockerfile", "spark-mirror.Dockerfile"])
def test_every_file_a_dockerfile_copies_exists(name: str):
    steps = _instructions(DOCKER / name)
    assert steps[0][0] == "FROM"
    for instruction, arguments in steps:
        if instruction == "COPY" and not arguments.startswith("--from"):
            *sources, _ = shlex.split(arguments)
            for source in sources:
                assert (ROOT / source).exists(), f"{name} copies {source}"
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    entry = next(args for instr, args in steps if instr == "ENTRYPOINT")
    command = yaml.safe_load(entry)[0]
    assert command in pyproject["project"]["scripts"] or command == "python"


def test_the_service_image_and_its_configuration_agree(compose: dict[str, Any],
                                                       config: Config):
    steps = dict(_instructions(DOCKER / "Dockerfile"))  # the last of each kind
    config_path = yaml.safe_load(steps["CMD"])[1]
    cdc = compose["services"]["cdc"]
    mounts = _mounts(cdc)
    assert mounts[config_path] == "./cdc.toml"
    assert mounts[config.listener.users_file] == "./cdcusers"
    assert mounts[config.store.data_dir] == "cdc-data"
    assert steps["VOLUME"] == config.store.data_dir
    exposed = {int(p) for p in steps["EXPOSE"].split()}
    published = {int(p.rsplit(":", 1)[1]) for p in cdc["ports"]}
    listen_port = config.listener.host_port()[1]
    metrics = config.metrics.host_port()
    assert metrics is not None and metrics[0] == "0.0.0.0" and config.listener.host_port()[0] \
        == "0.0.0.0"  # reachable from outside the container
    assert {listen_port, metrics[1]} == exposed == published
    assert "--config" in steps["HEALTHCHECK"] and config_path in steps["HEALTHCHECK"]


def _seconds(duration: str) -> float:
    """A Docker duration: ``30s``, ``5m``, ``1m30s``."""
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h)", duration)
    assert parts and "".join(n + u for n, u in parts) == duration, duration
    return sum(float(n) * units[u] for n, u in parts)


def test_the_healthchecks_ask_whether_the_service_is_ready(compose: dict[str, Any],
                                                          config: Config):
    """Compose's healthcheck and the image's HEALTHCHECK run the same probe: GET /ready on
    the endpoint the mounted configuration names, with a timeout that lets the probe's own
    time out first (it then says why)."""
    steps = dict(_instructions(DOCKER / "Dockerfile"))
    options, command = steps["HEALTHCHECK"].split(" CMD ", 1)
    image_check = yaml.safe_load(command)
    healthcheck = compose["services"]["cdc"]["healthcheck"]
    assert healthcheck["test"] == ["CMD", *image_check]
    python, flag, module, *args = image_check
    assert (python, flag) == ("python", "-m")
    probe = importlib.import_module(module)
    parsed = probe.parser().parse_args(args)
    assert parsed.probe == "ready"
    assert parsed.config == yaml.safe_load(steps["CMD"])[1]  # the file the service runs with
    assert endpoint_url(config) == f"http://127.0.0.1:{config.metrics.host_port()[1]}"
    image_options = dict(option.lstrip("-").split("=", 1) for option in options.split())
    for timeout in (healthcheck["timeout"], image_options["timeout"]):
        assert _seconds(timeout) > status.TIMEOUT
    for key in ("interval", "start_period", "retries"):
        assert str(healthcheck[key]) == image_options[key.replace("_", "-")], key


def test_the_source_is_the_compose_mariadb_with_what_preflight_requires(
        compose: dict[str, Any], config: Config):
    mariadb = compose["services"]["mariadb"]
    address = parse_source_url(config.source.url,
                               compose["services"]["cdc"]["environment"]
                               ["CDCSERVER_SOURCE_PASSWORD"])
    assert address.host == "mariadb" and address.port == 3306
    flags = dict(flag.lstrip("-").split("=", 1) for flag in mariadb["command"])
    assert flags["binlog-format"] == "ROW" and flags["binlog-row-image"] == "FULL"
    assert flags["binlog-row-metadata"] == "FULL" and flags["log-bin"]
    assert int(flags["server-id"]) != config.source.server_id
    assert int(flags["binlog-expire-logs-seconds"]) >= 86400  # preflight warns under a day
    init = (DOCKER / "mariadb-init.sql").read_text()
    assert f"CREATE USER '{address.user}'@'%' IDENTIFIED BY '{address.password}'" in init
    grant = re.search(rf"GRANT (.+) ON \*\.\* TO '{address.user}'@'%'", init)
    assert grant is not None
    assert {p.strip() for p in grant[1].split(",")} >= {"REPLICATION SLAVE", "BINLOG MONITOR",
                                                        "SELECT"}
    database = mariadb["environment"]["MARIADB_DATABASE"]
    assert f"CREATE TABLE {database}.orders" in init


def test_kafka_runs_kraft_and_is_where_the_service_publishes(compose: dict[str, Any],
                                                            config: Config):
    env = compose["services"]["kafka"]["environment"]
    assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    node = env["KAFKA_NODE_ID"]
    controller = next(listener for listener in env["KAFKA_LISTENERS"].split(",")
                      if listener.startswith(env["KAFKA_CONTROLLER_LISTENER_NAMES"]))
    assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"] == f"{node}@kafka:{controller.rsplit(':', 1)[1]}"
    advertised = env["KAFKA_ADVERTISED_LISTENERS"].split("//", 1)[1]
    assert config.kafka.bootstrap == advertised == "kafka:9092"
    assert int(env["KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"]) == 1  # one broker


def test_the_spark_mirror_reaches_the_service_as_a_user_the_users_file_knows(
        compose: dict[str, Any], config: Config):
    mirror = compose["services"]["spark-mirror"]
    args = mirror["command"]
    option = dict(zip(args[::2], args[1::2], strict=True))
    assert option["--host"] == "cdc" and int(option["--port"]) == config.listener.host_port()[1]
    accounts = UsersFile(str(DOCKER / "cdcusers")).load()
    account = accounts[option["--user"]]
    assert account.hash == password_hash(mirror["environment"]["CDC_PASSWORD"])
    database, table = option["--table"].split(".")
    assert account.tables is not None and account.tables.allows(TableName(database, table))
    assert option["--table"] in config.dump.tables  # it starts from the table's dump
    assert mirror["depends_on"]["cdc"]["condition"] == "service_healthy"


def test_kafka_keeps_its_topics_on_its_volume(compose: dict[str, Any]):
    """apache/kafka writes its logs (the topics) under /tmp unless KAFKA_LOG_DIRS says
    otherwise; on the volume they survive a re-created container."""
    kafka = compose["services"]["kafka"]
    mounts = _mounts(kafka)
    log_dirs = kafka["environment"]["KAFKA_LOG_DIRS"].split(",")
    assert log_dirs == ["/var/lib/kafka/data"]
    for log_dir in log_dirs:
        assert mounts[log_dir] in compose["volumes"], log_dir  # a named volume, not a bind


def _one_shot(name: str, service: dict[str, Any], compose: dict[str, Any]) -> bool:
    """A service meant to finish: another waits for its success, or it runs `--once`."""
    waited_for = any(d.get("condition") == "service_completed_successfully"
                     for s in compose["services"].values()
                     for n, d in s.get("depends_on", {}).items() if n == name)
    return waited_for or "--once" in service.get("command", [])


def test_every_long_running_service_restarts(compose: dict[str, Any]):
    for name, service in compose["services"].items():
        if not _one_shot(name, service, compose):
            assert service.get("restart") in ("always", "unless-stopped", "on-failure"), name


def _ignored(path: str, patterns: list[str]) -> bool:
    """Whether .dockerignore keeps ``path`` (relative to the context) out: Docker's rules
    (Go's filepath.Match, ``**`` for any directories, a matched directory takes its contents,
    ``!`` re-includes, the last matching line wins)."""
    ignored = False
    for pattern in patterns:
        negated, pattern = pattern.startswith("!"), pattern.lstrip("!").strip("/")
        if re.fullmatch(rf"{_glob_regex(pattern)}(/.*)?", path):
            ignored = not negated
    return ignored


def _glob_regex(pattern: str) -> str:
    tokens = re.findall(r"\*\*/?|\*|\?|\[[^\]]*\]|[^*?\[]+", pattern)
    return "".join("(.*/)?" if t == "**/" else ".*" if t == "**" else "[^/]*" if t == "*"
                   else "[^/]" if t == "?" else t if t.startswith("[") else re.escape(t)
                   for t in tokens)


def test_the_build_context_leaves_local_artefacts_out_and_keeps_the_sources():
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    for local in (".venv/bin/python", ".git/HEAD", "bench/out/router.json",
                  "cdcserver/store/_transcode.c", "cdcserver/dump/_rawrows.c",
                  "cdcserver/store/_transcode.cpython-311-x86_64-linux-gnu.so",
                  "cdcserver/__pycache__/config.cpython-311.pyc", "client/stray.pyc",
                  "build/lib/cdcserver/__init__.py", "mariadb_cdc.egg-info/PKG-INFO",
                  ".hypothesis/examples/x", "users/cdcusers"):
        assert _ignored(local, patterns), local
    for name in ("Dockerfile", "spark-mirror.Dockerfile"):
        for instruction, arguments in _instructions(DOCKER / name):
            if instruction != "COPY" or arguments.startswith("--from"):
                continue
            for source in shlex.split(arguments)[:-1]:
                files = [ROOT / source] if (ROOT / source).is_file() else [
                    p for p in (ROOT / source).rglob("*")
                    if p.is_file() and p.suffix in (".py", ".pyx", ".pxd", ".gz", ".typed")
                    and "__pycache__" not in p.parts]
                assert files, source
                for file in files:
                    relative = file.relative_to(ROOT).as_posix()
                    assert not _ignored(relative, patterns), f"{name} copies {relative}"


def test_the_service_image_builds_with_what_the_build_reads():
    """pip builds the wheel from what the Dockerfile copied: the readme, the licence, setup.py
    and MANIFEST.in must be among it."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    needed = {pyproject["readme"], *pyproject["license-files"], "setup.py", "MANIFEST.in",
              "pyproject.toml"}
    copied = {source for instruction, arguments in _instructions(DOCKER / "Dockerfile")
              if instruction == "COPY" and not arguments.startswith("--from")
              for source in shlex.split(arguments)[:-1]}
    assert needed <= copied, needed - copied
