"""Loading the configuration's values (:meth:`cdcserver.core.config.Config.load`): the TOML
file, the ``CDCSERVER_<SECTION>_<KEY>`` environment variables and the command line's overrides,
merged in that order, unknown sections, keys and variables refused, each value read as its
declared type."""

from __future__ import annotations

import dataclasses
import difflib
import tomllib
from typing import Any, get_type_hints

from cdcserver.core.errors import ConfigError
from cdcserver.core.options import SECRET_VARIABLES, choices, coerce

_PREFIX = "CDCSERVER_"
Sections = dict[str, type[Any]]  # each section's name and dataclass


def load_sections(sections: Sections, path: str | None,
                  overrides: dict[str, dict[str, Any]] | None,
                  environ: dict[str, str] | Any) -> dict[str, Any]:
    """Each section built from its values: defaults < ``path`` (TOML) < ``environ`` <
    ``overrides`` (the command line)."""
    values: dict[str, dict[str, Any]] = {name: {} for name in sections}
    if path:
        _merge(values, _read_toml(path), source=path)
    _merge(values, from_environment(environ, sections), source="the environment")
    _merge(values, overrides or {}, source="the command line")
    return {name: _build(section_type, values[name], name)
            for name, section_type in sections.items()}


def _read_toml(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: {exc}") from exc


def _merge(values: dict[str, dict[str, Any]], new: dict[str, Any], source: str) -> None:
    for section, keys in new.items():
        if section not in values or not isinstance(keys, dict):
            raise ConfigError(f"{source}: unknown section [{section}]")
        values[section].update(keys)


def from_environment(environ: dict[str, str] | Any, sections: Sections
                     ) -> dict[str, dict[str, Any]]:
    """The settings ``CDCSERVER_<SECTION>_<KEY>`` variables set; any other ``CDCSERVER_``
    variable is a misspelling, refused as an unknown TOML key is."""
    settings = _environment_variables(sections)
    found: dict[str, dict[str, Any]] = {}
    for name, value in environ.items():
        if not name.startswith(_PREFIX) or name in SECRET_VARIABLES:
            continue
        if name not in settings:
            raise ConfigError(_unknown_variable(name, [*settings, *SECRET_VARIABLES]))
        section, key = settings[name]
        found.setdefault(section, {})[key] = value
    return found


def _environment_variables(sections: Sections) -> dict[str, tuple[str, str]]:
    """Each setting's variable, and its (section, key)."""
    return {f"{_PREFIX}{section.upper()}_{f.name.upper()}": (section, f.name)
            for section, section_type in sections.items()
            for f in dataclasses.fields(section_type)}


def _unknown_variable(name: str, known: list[str]) -> str:
    # Compared without the prefix every name shares, which would make any two look alike.
    suffixes = [variable[len(_PREFIX):] for variable in known]
    close = difflib.get_close_matches(name[len(_PREFIX):], suffixes, n=1)
    hint = (f"did you mean {_PREFIX}{close[0]}?" if close else
            "docs/configuration.md lists every variable")
    return f"unknown environment variable {name} ({hint}): fix or unset it"


def _build(section_type: type[Any], values: dict[str, Any], section: str) -> Any:
    hints = get_type_hints(section_type)
    known = {f.name: f for f in dataclasses.fields(section_type)}
    kwargs = {}
    for key, value in values.items():
        if key not in known:
            raise ConfigError(f"unknown setting {section}.{key}")
        kwargs[key] = coerce(hints[key], value, f"{section}.{key}")
        allowed = choices(hints[key])
        if allowed and kwargs[key] not in allowed:
            raise ConfigError(f"{section}.{key} must be one of {', '.join(allowed)}, "
                              f"not {kwargs[key]!r}")
    return section_type(**kwargs)
