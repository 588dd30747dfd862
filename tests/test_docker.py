"""docker/: no Docker engine runs here, so the files are checked for what can be checked
without one: they parse, every file they name exists, and they agree with each other and
with the service (ports, paths, host names, users, passwords, flags)."""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from cdcserver.core.config import Config, parse_source_url
from cdcserver.protocol.users import UsersFile
from cdcserver.store.naming import TableName
from client.format.wire import password_hash

ROOT = Path(__file__).parent.parent
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
