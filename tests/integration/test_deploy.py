"""deploy/systemd/cdcserver.service: no systemd runs the tests, so the unit is checked against
what it starts: the command line exists, the type matches what the service tells systemd
(nothing: it does not speak sd_notify), the exit codes and paths agree with the service's."""

from __future__ import annotations

import shlex
import tomllib
from pathlib import Path

import pytest

from cdcserver.app import cli
from cdcserver.app.process import EXIT_USAGE
from cdcserver.core.config import ListenerConfig, StoreConfig

ROOT = Path(__file__).parent.parent.parent
UNIT = ROOT / "deploy" / "systemd" / "cdcserver.service"


@pytest.fixture(scope="module")
def unit() -> dict[str, dict[str, list[str]]]:
    """{section: {key: [values]}} (a key may repeat, as systemd allows)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
            continue
        key, sep, value = line.partition("=")
        assert sep, line
        current.setdefault(key, []).append(value)
    return sections


def _one(unit: dict[str, dict[str, list[str]]], section: str, key: str) -> str:
    (value,) = unit[section][key]
    return value


def test_exec_start_is_a_command_line_cdcserver_run_takes(unit, capsys):
    argv = shlex.split(_one(unit, "Service", "ExecStart"))
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert argv[0] == "/opt/mariadb-cdc/bin/cdcserver" and Path(argv[0]).name in scripts
    assert argv[1:] == ["run", "--config", "/etc/cdcserver/cdc.toml"]
    args = cli._parser().parse_args(argv[1:])
    assert args.handler is cli.cmd_run and args.config == "/etc/cdcserver/cdc.toml"
    with pytest.raises(SystemExit) as exited:
        cli.main(["run", "--help"])
    assert exited.value.code == 0
    assert "--config" in capsys.readouterr().out


def test_the_type_is_exec_since_the_service_does_not_notify(unit):
    assert _one(unit, "Service", "Type") == "exec"
    sources = "".join(p.read_text() for p in (ROOT / "cdcserver").rglob("*.py"))
    assert "NOTIFY_SOCKET" not in sources and "sd_notify" not in sources


def test_restarts_on_failure_but_not_on_a_configuration_error(unit):
    service = unit["Service"]
    assert service["Restart"] == ["on-failure"]
    assert service["RestartPreventExitStatus"] == [str(EXIT_USAGE)]
    assert "StartLimitBurst" in unit["Unit"] and "StartLimitIntervalSec" in unit["Unit"]


def test_runs_unprivileged_and_hardened(unit):
    service = unit["Service"]
    assert service["User"] == ["cdc"]
    for key, value in (("NoNewPrivileges", "yes"), ("PrivateTmp", "yes"),
                       ("ProtectSystem", "strict"), ("ProtectHome", "yes"),
                       ("CapabilityBoundingSet", "")):
        assert service[key] == [value], key


def test_the_only_writable_place_is_the_state_directory(unit):
    """ProtectSystem=strict leaves the StateDirectory writable: the data directory goes there
    (the unit's comment says data_dir = "/var/lib/cdcserver")."""
    state = _one(unit, "Service", "StateDirectory")
    assert _one(unit, "Service", "WorkingDirectory") == f"/var/lib/{state}"
    assert f'data_dir = "/var/lib/{state}"' in UNIT.read_text()


def test_descriptors_cover_the_default_limits(unit):
    limit = int(_one(unit, "Service", "LimitNOFILE"))
    assert limit == 65536
    assert limit > ListenerConfig().max_connections + StoreConfig().max_open_files
