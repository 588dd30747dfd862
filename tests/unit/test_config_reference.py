"""docs/configuration.md: generated from config.py, and true of it. The settings are enumerated here
from the dataclasses (not through the generator), and each row's environment variable, flag and
default are checked against what config.py does with them."""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path

import pytest

from cdcserver.core import config as cfg
from cdcserver.core import configload, options, reference
from cdcserver.core.errors import ConfigError

ROOT = Path(__file__).parent.parent.parent
DOCUMENT = ROOT / "docs" / "configuration.md"

Row = dict[str, str]


def _tables() -> dict[str, dict[str, Row]]:
    """{section: {key: {column: cell}}} from docs/configuration.md's per-section tables."""
    found: dict[str, dict[str, Row]] = {}
    for block in re.split(r"^## ", DOCUMENT.read_text(), flags=re.M)[1:]:
        heading = re.match(r"\[(\w+)\]", block)
        if heading is None:
            continue
        rows = [line for line in block.splitlines() if line.startswith("| ")]
        columns = [c.strip() for c in rows[0].strip("|").split(" | ")]
        section = found.setdefault(heading[1], {})
        for line in rows[1:]:
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
            row = dict(zip(columns, cells, strict=True))
            section[row["key"].strip("`")] = row
    return found


def _settings() -> dict[str, list[dataclasses.Field]]:
    return {name: list(dataclasses.fields(kind)) for name, kind in cfg.Config.sections().items()}


def test_the_document_is_what_the_generator_renders():
    assert DOCUMENT.read_text() == reference.render(), (
        "docs/configuration.md is stale: "
        "python -m cdcserver.core.reference > docs/configuration.md")


def test_every_setting_is_documented_once():
    tables = _tables()
    assert set(tables) == set(_settings()) == set(reference.SECTIONS)
    for section, fields in _settings().items():
        assert list(tables[section]) == [f.name for f in fields], section
        for f in fields:
            assert tables[section][f.name]["meaning"].startswith(f.metadata["help"][:40])


def test_each_environment_variable_is_the_one_config_reads():
    for section, rows in _tables().items():
        for key, row in rows.items():
            variable = row["environment variable"].strip("`")
            assert configload.from_environment({variable: "x"}, cfg.Config.sections()) \
                == {section: {key: "x"}}


def test_each_flag_is_the_one_the_command_line_takes():
    parser = argparse.ArgumentParser()
    cfg.add_arguments(parser)
    documented = {}
    for section, rows in _tables().items():
        for key, row in rows.items():
            flags = re.findall(r"`(--[\w-]+)`", row["flag"])
            for flag in flags:
                documented[flag] = f"{section}.{key}"
    taken = {flag: action.dest for action in parser._actions
             for flag in action.option_strings if action.dest != "help"}
    assert documented == taken


def test_the_defaults_written_as_toml_load_as_the_defaults(tmp_path: Path):
    """Each default cell, pasted into a TOML file, is read back as the declared default."""
    text = []
    for section, rows in _tables().items():
        text.append(f"[{section}]")
        text += [f"{key} = {row['default'].strip('`')}" for key, row in rows.items()]
    path = tmp_path / "defaults.toml"
    path.write_text("\n".join(text) + "\n")
    assert cfg.Config.load(str(path), environ={}) == cfg.Config()


@pytest.mark.parametrize(("key", "value", "expected"), [
    ("store.flush_interval", "90", 90.0), ("store.flush_interval", "5m", 300.0),
    ("store.flush_interval", "24h", 86400.0), ("store.flush_interval", "2w", 1209600.0),
    ("kafka.max_buffer_bytes", "512MiB", 512 * 1024**2),
    ("kafka.max_buffer_bytes", "50gb", 50 * 1000**3),
    ("kafka.max_buffer_bytes", "1K", 1000), ("kafka.create_topics", "off", False),
    ("kafka.create_topics", "yes", True), ("kafka.create_topics", "1", True),
    ("kafka.create_topics", "no", False),
])
def test_the_value_syntax_described_is_what_is_read(key: str, value: str, expected: object):
    section, name = key.split(".")
    variable = reference.environment_variable(section, name)
    assert getattr(getattr(cfg.Config.load(environ={variable: value}), section), name) \
        == expected


@pytest.mark.parametrize("overrides", [
    {"listener": {"tls_key": "key.pem"}},
    {"kafka": {"publisher_lock": "cdc", "state_topic": ""}},
    {"kafka": {"value_format": "avro", "format": "databus",
               "schema_registry_url": "http://127.0.0.1:8081"}},
    {"kafka": {"value_format": "avro", "format": "debezium"}},
    {"kafka": {"snapshot": "initial", "delivery": "exactly-once"}},
    {"kafka": {"snapshot": "initial", "publisher_lock": "cdc"}},
])
def test_the_settings_checked_together(overrides: dict[str, dict[str, str]]):
    with pytest.raises(ConfigError):
        cfg.Config.load(overrides=overrides, environ={})


def test_every_other_variable_config_reads_is_documented(monkeypatch: pytest.MonkeyPatch):
    source = Path(options.__file__).read_text()
    assert set(re.findall(r'"(CDCSERVER_[A-Z_]+)"', source)) == set(reference.SECRET_VARIABLES)
    for variable in reference.SECRET_VARIABLES:
        assert f"| `{variable}` |" in DOCUMENT.read_text()
    monkeypatch.setenv("CDCSERVER_SOURCE_PASSWORD", "from-env")
    monkeypatch.setenv("CDCSERVER_KAFKA_SASL_PASSWORD", "sasl-env")
    config = cfg.Config.load(overrides={"source": {"url": "mysql://a@h1, mysql://b:own@h2"}},
                             environ={})
    assert [a.password for a in config.source.addresses()] == ["from-env", "own"]
    assert config.kafka.sasl_password() == "sasl-env"
