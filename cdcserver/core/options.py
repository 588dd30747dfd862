"""Declaring a setting of :mod:`cdcserver.core.config`: the field that carries its default, help
text, flag and check; the checks a value must pass; the syntax of durations and sizes, and how a
value read as text becomes the declared type; and the secrets read beside the settings.
"""

from __future__ import annotations

import re
import ssl
import zoneinfo
from collections.abc import Callable
from dataclasses import field
from typing import Any, Literal, get_args, get_origin

from cdcserver.core.capture import parse_column_patterns, parse_patterns
from cdcserver.core.errors import ConfigError
from cdcserver.core.gtid import GtidState
from mariadb_cdc_client.format.names import BadTableRef, parse_table, split_list

Check = Callable[[Any], str | None]  # a value's problem, or None

# Read beside the settings' variables: secrets, never a TOML key or a flag (documented in
# reference.SECRET_VARIABLES).
SOURCE_PASSWORD_VARIABLE = "CDCSERVER_SOURCE_PASSWORD"
KAFKA_SASL_PASSWORD_VARIABLE = "CDCSERVER_KAFKA_SASL_PASSWORD"
SCHEMA_REGISTRY_PASSWORD_VARIABLE = "CDCSERVER_KAFKA_SCHEMA_REGISTRY_PASSWORD"
HASH_SALT_VARIABLE = "CDCSERVER_HASH_SALT"
ADMIN_TOKEN_VARIABLE = "CDCSERVER_ADMIN_TOKEN"  # cdcserver ctl's token (cdcserver/app/ctl.py)
SECRET_VARIABLES = (SOURCE_PASSWORD_VARIABLE, KAFKA_SASL_PASSWORD_VARIABLE,
                    SCHEMA_REGISTRY_PASSWORD_VARIABLE, HASH_SALT_VARIABLE, ADMIN_TOKEN_VARIABLE)


def read_secret(path: str, setting: str) -> str:
    """A password kept in a file (one line; the newline is not part of it)."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().rstrip("\n")
    except OSError as exc:
        raise ConfigError(f"{setting}: {exc}") from exc


def host_and_port(text: str, expected: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:4001`` for IPv6; an empty host is every address)."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(f"{expected}, not {text!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


def server_tls(cert: str, key: str, section: str) -> ssl.SSLContext | None:
    """A listener's TLS settings (TLS 1.2 or newer) from its section's ``tls_cert`` and
    ``tls_key``, or None for plain TCP."""
    if not cert:
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert, key or None)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"{section}.tls_cert/tls_key: {exc}") from exc
    return context


def option(default: Any, help: str, cli: str | None = None, secret: bool = False,
           check: Check | None = None) -> Any:
    return field(default=default,
                 metadata={"help": help, "cli": cli, "secret": secret, "check": check})


def positive(value: float) -> str | None:
    return None if value > 0 else "must be more than 0"


def not_negative(value: float) -> str | None:
    return None if value >= 0 else "must not be negative"


def time_zone(value: str) -> str | None:
    try:
        zoneinfo.ZoneInfo(value)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        return f"unknown time zone {value!r}"
    return None


def host_port(value: str) -> str | None:
    try:
        host_and_port(value, "must be HOST:PORT")
    except ConfigError as exc:
        return str(exc)
    return None


def host_port_or_off(value: str) -> str | None:
    return host_port(value) if value else None


def start_position(value: str) -> str | None:
    if value.strip() in ("oldest", "newest"):
        return None
    try:
        GtidState.parse(value.strip())
    except ValueError as exc:
        return f"'oldest', 'newest' or a GTID state: {exc}"
    return None


def choices(kind: Any) -> tuple[Any, ...]:
    """The values a ``Literal`` type allows (empty for other types)."""
    return get_args(kind) if get_origin(kind) is Literal else ()


def table_patterns(value: str) -> str | None:
    try:
        parse_patterns(value)
    except ValueError as exc:
        return f"expects comma-separated db.table patterns (shop.*, crm.customers): {exc}"
    return None


def system_tables(value: str) -> str | None:
    for item in split_list(value):
        try:
            named = parse_table(item)
        except BadTableRef:
            named = None
        if named is None or (not named.quoted and "*" in named.database + named.table):
            return f"expects db.table names, each named (no pattern), not {item!r}"
    return None


def column_patterns(value: str) -> str | None:
    try:
        parse_column_patterns(value, keep=False)
    except ValueError as exc:
        return f"expects comma-separated db.table.column patterns (shop.users.email): {exc}"
    return None


def mask_patterns(value: str) -> str | None:
    try:
        parse_column_patterns(value, keep=True)
    except ValueError as exc:
        return ("expects comma-separated db.table.column patterns, each may end :N to keep "
                f"the first N characters (shop.cards.number:4): {exc}")
    return None


DURATION = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
SIZE = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1024, "m": 1000**2, "mb": 1000**2,
         "mib": 1024**2, "g": 1000**3, "gb": 1000**3, "gib": 1024**3, "t": 1000**4,
         "tb": 1000**4, "tib": 1024**4}
_QUANTITY = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?)\s*([a-zA-Z]*)\s*$")


def quantity(value: str, units: dict[str, int]) -> float:
    """``90``, ``5m``, ``24h``, ``7d``; ``512MiB``, ``50GB``."""
    m = _QUANTITY.match(value)
    if m is None or m[2].lower() not in units:
        raise ValueError(value)
    return float(m[1]) * units[m[2].lower()]


def coerce(kind: Any, value: Any, name: str) -> Any:
    try:
        if kind is float and isinstance(value, str):
            return quantity(value, DURATION)
        if kind is int and isinstance(value, str) and name.endswith("_bytes"):
            return int(quantity(value, SIZE))
        if kind is bool and isinstance(value, str):
            if value.lower() not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
                raise ValueError(value)
            return value.lower() in ("1", "true", "yes", "on")
        if kind in (int, float, str, bool):
            return kind(value)
        if choices(kind):
            return str(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name}: {value!r} is not a valid {kind.__name__}") from None
    return value
