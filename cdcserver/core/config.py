"""Configuration, declared once.

Each section is a frozen dataclass whose fields carry their type, default, help text,
command-line flag and the check a value must pass. A setting with a fixed set of values has a
``Literal`` type: the choices are the type's. The same declaration drives the TOML file
(``--config``, one table per section, unknown keys rejected), the environment
(``CDCSERVER_<SECTION>_<KEY>``) and every command's flags (:func:`add_arguments`), with the
precedence defaults < TOML < environment < command line. Every value is checked when the
configuration is loaded, so a mistake is reported at start, naming the setting.

How a setting is declared and checked, and the secrets read beside the settings, are
:mod:`cdcserver.core.options`; reading the file, the environment and the overrides is
:mod:`cdcserver.core.configload`; the ``[kafka]`` and ``[capture]`` sections are
:mod:`cdcserver.core.kafkaconfig` and :mod:`cdcserver.core.captureconfig`.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import ssl
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, get_type_hints

from cdcserver.core.captureconfig import CaptureConfig
from cdcserver.core.configload import load_sections
from cdcserver.core.errors import ConfigError
from cdcserver.core.kafkaconfig import KafkaConfig
from cdcserver.core.options import (
    SOURCE_PASSWORD_VARIABLE,
    choices,
    host_and_port,
    host_port,
    host_port_or_off,
    not_negative,
    option,
    positive,
    read_secret,
    server_tls,
    start_position,
    time_zone,
)


@dataclass(frozen=True)
class SourceAddress:
    """How to reach the primary. ``unix_socket`` wins over host/port when set."""

    host: str = "127.0.0.1"
    port: int = 3306
    user: str = "root"
    password: str = ""
    unix_socket: str | None = None
    ssl: dict[str, str] | None = None
    connect_timeout: float = 10.0

    def pymysql_kwargs(self) -> dict[str, object]:
        kwargs: dict[str, object] = {"user": self.user, "password": self.password,
                                     "connect_timeout": self.connect_timeout,
                                     "charset": "utf8mb4"}
        if self.unix_socket:
            kwargs["unix_socket"] = self.unix_socket
        else:
            kwargs["host"], kwargs["port"] = self.host, self.port
        if self.ssl:
            kwargs["ssl"] = self.ssl
        return kwargs

    def describe(self) -> str:
        where = self.unix_socket or f"{self.host}:{self.port}"
        return f"{self.user}@{where}"


@dataclass(frozen=True)
class SourceConfig:
    url: str = option("", "the source, mysql://USER[:PASSWORD]@HOST[:PORT] or "
                          "mysql://USER@localhost?socket=/path/to.sock; or several, "
                          "comma-separated (the primary and its replicas), in order of "
                          "preference", cli="--source", secret=True)
    password_file: str = option("", "read the source password from this file (keeps it out of "
                                    "the command line)", cli="--source-password-file")
    server_id: int = option(1234, "replica server_id to register with (unique among the "
                                  "primary's replicas)", cli="--server-id", check=positive)
    start_gtid: str = option("oldest", "where to start without a checkpoint: a GTID state, "
                                       "'oldest' (the oldest binlog) or 'newest'",
                             cli="--start-gtid", check=start_position)
    heartbeat: float = option(5.0, "heartbeat period in seconds; a connection silent for 3 "
                                   "periods is considered dead", cli="--heartbeat",
                              check=positive)
    report_host: str = option("cdcserver", "host name shown in the primary's SHOW SLAVE HOSTS")
    failover_after: float = option(10.0, "with several sources: seconds the one being read may "
                                         "be unreachable before the others are examined",
                                   cli="--failover-after", check=positive)

    def address(self) -> SourceAddress:
        """The first source (the preferred one)."""
        return self.addresses()[0]

    def addresses(self) -> list[SourceAddress]:
        """Every source, in order of preference."""
        password = self._password()
        return [parse_source_url(url, password) for url in split_source_urls(self.url)]

    def _password(self) -> str | None:
        if self.password_file:
            return read_secret(self.password_file, "source.password_file")
        return os.environ.get(SOURCE_PASSWORD_VARIABLE)


@dataclass(frozen=True)
class StoreConfig:
    data_dir: str = option("./data", "the data directory (avro/, dump/, state/)",
                           cli="--data-dir")
    codec: Literal["null", "deflate", "snappy", "zstandard"] = option(
        "null", "Avro block codec", cli="--codec")
    group_access: bool = option(False, "let the data directory's group read it (directories "
                                       "0750, files 0640); otherwise only the service's user "
                                       "can (0700, 0600), dumps and the index included")
    block_size: int = option(64 * 1024, "bytes of records per Avro block before it is written",
                             cli="--block-size", check=positive)
    max_open_files: int = option(256, "table files held open for writing at most (and at "
                                      "most a quarter of what the file descriptor limit "
                                      "leaves); the least recently written are closed and "
                                      "reopened when written again", check=positive)
    flush_interval: float = option(0.2, "seconds between checkpoints (fsync + checkpoint file)",
                                   cli="--flush-interval", check=positive)
    disk_full_retry: float = option(5.0, "seconds between checks for room while replication "
                                         "is paused by a full data directory (or for a write "
                                         "and an fsync to work on a failed disk)",
                                   check=positive)


@dataclass(frozen=True)
class ListenerConfig:
    listen: str = option("127.0.0.1:4001", "HOST:PORT for CDC clients (port 0: any free port)",
                         cli="--listen", check=host_port)
    users_file: str = option("users/cdcusers", "users file in MaxScale's cdcusers format; it "
                                               "must exist (`cdcserver users add NAME "
                                               "--users-file FILE` creates it)",
                             cli="--users-file")
    max_connections: int = option(2048, "connections served at once (at most what the file "
                                        "descriptor limit leaves room for)",
                                  cli="--max-connections", check=positive)
    max_unauthenticated: int = option(32, "connections from one address that have not "
                                          "logged in yet, while over half of "
                                          "max_connections are in use", check=positive)
    max_line: int = option(64 * 1024, "longest command accepted, in bytes", check=positive)
    auth_timeout: float = option(10.0, "seconds a new connection has to authenticate",
                                 check=positive)
    idle_timeout: float = option(600.0, "seconds without a command before hanging up "
                                        "(streams are never idle)", check=positive)
    dead_client_timeout: float = option(
        60.0, "seconds a client's host may acknowledge nothing (TCP keepalive probes while "
              "its stream is idle, data sent meanwhile) before its connection is ended and "
              "its resources freed: a crashed host, a partition, a half-open connection "
              "(a client that merely stops reading is never ended for it)",
        check=positive)
    bad_command_limit: int = option(10, "bad commands before the server hangs up",
                                    check=positive)
    shutdown_grace: float = option(5.0, "seconds open sessions get to end when the service "
                                        "stops (then they are closed)", check=not_negative)
    json_dialect: Literal["maxscale", "exact"] = option(
        "maxscale", "JSON mode for clients that do not ask (REGISTER ... DIALECT=) and whose "
        "user has none: maxscale (what MaxScale's clients parse) or exact", cli="--json-dialect")
    timestamp_zone: str = option("UTC", "zone TIMESTAMP values are shown in, in JSON mode",
                                 cli="--timestamp-zone", check=time_zone)
    login_failures: int = option(5, "new wrong passwords a minute, per user and address, "
                                    "checked at once; further ones wait their turn",
                                 check=positive)
    login_lockout: float = option(60.0, "longest a login waits for its turn; past that it "
                                        "gets ERR THROTTLED", check=not_negative)
    tls_cert: str = option("", "PEM certificate chain: the listener speaks TLS only "
                               "('' : plain TCP)", cli="--tls-cert")
    tls_key: str = option("", "the certificate's PEM private key", cli="--tls-key")

    def host_port(self) -> tuple[str, int]:
        return host_and_port(self.listen, "listen must be HOST:PORT")

    def tls_context(self) -> ssl.SSLContext | None:
        """The listener's TLS settings (TLS 1.2 or newer), or None for plain TCP."""
        return server_tls(self.tls_cert, self.tls_key, "listener")


@dataclass(frozen=True)
class DumpConfig:
    tables: str = option("", "tables the service dumps on a schedule: db.table or db.* , "
                             "comma-separated (a name holding a dot, a comma or a space "
                             "quoted as in protocol.md)")
    interval: float = option(0.0, "time between scheduled dumps of each table (e.g. 24h); "
                                  "0: no schedule", check=not_negative)
    chunk_rows: int = option(50_000, "rows per primary-key chunk (a crash loses at most one; "
                                     "with readers, an ALTER TABLE waits for one at most)",
                             cli="--chunk-rows", check=positive)
    readers: int = option(2, "readers per table, each over its own key range, each chunk read "
                             "in a short snapshot of its own with the changes between them "
                             "merged in (needs the service replicating into the data "
                             "directory); 0: the whole table in one snapshot, which holds its "
                             "metadata lock for the whole read", cli="--readers",
                          check=not_negative)
    batch_rows: int = option(500, "rows fetched from the source per round trip while a "
                                  "chunk is read", check=positive)
    store_timeout: float = option(60.0, "how long a chunked or resumed dump waits for the "
                                        "store to reach the dump's snapshot (the service "
                                        "replicating into the data directory)",
                                  check=positive)
    sync_interval: float = option(2.0, "chunked dumps: how often each reader makes what it "
                                       "read durable and records it (a killed dump loses at "
                                       "most this much reading; 0: after every chunk)",
                                  cli="--sync-interval", check=not_negative)


@dataclass(frozen=True)
class RetentionConfig:
    dumps_keep: int = option(3, "complete dumps kept per table (0: no count limit); the "
                                "newest dump of a table is always kept")
    dumps_max_age: float = option(0.0, "delete dumps older than this (e.g. 7d; 0: no limit)")
    dumps_max_bytes: int = option(0, "delete the oldest dumps while all of them take more "
                                     "than this (e.g. 50GiB; 0: no limit)")
    versions_max_age: float = option(0.0, "delete table versions older than this that a "
                                          "newer dump replaces (0: keep all)")
    versions_max_bytes: int = option(0, "delete the oldest replaced table versions while "
                                        "the Avro files take more than this (0: no limit)")
    interval: float = option(300.0, "time between cleaner runs (it also runs after each "
                                    "dump taken and each dump transfer)", check=positive)


@dataclass(frozen=True)
class MetricsConfig:
    listen: str = option("127.0.0.1:4002", "HOST:PORT of the HTTP endpoint serving /metrics "
                                           "(Prometheus) and /health; '' turns it off",
                         cli="--metrics-listen", check=host_port_or_off)
    lag_interval: float = option(5.0, "seconds between asking the source how far ahead it is",
                                 check=positive)
    max_lag: float = option(300.0, "replication lag (seconds) above which /health says "
                                   "degraded", check=positive)

    def host_port(self) -> tuple[str, int] | None:
        if not self.listen:
            return None
        return host_and_port(self.listen, "metrics.listen must be HOST:PORT or ''")


@dataclass(frozen=True)
class AdminConfig:
    listen: str = option("127.0.0.1:8989", "HOST:PORT of the admin API and the web console "
                                           "(docs/admin.md); served only with a token_file",
                         cli="--admin-listen", check=host_port)
    token_file: str = option("", "file holding the bearer token the admin API and the console "
                                 "ask for (at least 16 characters, readable by its owner "
                                 "only); '' turns the API and the console off",
                             cli="--admin-token-file")
    tls_cert: str = option("", "PEM certificate (chain) for HTTPS on the admin listener; '' "
                               "for plain HTTP")
    tls_key: str = option("", "PEM private key for tls_cert ('' if the certificate file holds "
                              "it)")

    @property
    def enabled(self) -> bool:
        return bool(self.token_file)

    def host_port(self) -> tuple[str, int]:
        return host_and_port(self.listen, "admin.listen must be HOST:PORT")

    def tls_context(self) -> ssl.SSLContext | None:
        """HTTPS settings (TLS 1.2 or newer), or None for plain HTTP."""
        return server_tls(self.tls_cert, self.tls_key, "admin")


@dataclass(frozen=True)
class LogConfig:
    level: Literal["debug", "info", "warning", "error"] = option(
        "info", "log level", cli="--log-level")
    format: Literal["text", "json"] = option("text", "log line format", cli="--log-format")


@dataclass(frozen=True)
class Config:
    source: SourceConfig = field(default_factory=SourceConfig)
    store: StoreConfig = field(default_factory=StoreConfig)
    listener: ListenerConfig = field(default_factory=ListenerConfig)
    dump: DumpConfig = field(default_factory=DumpConfig)
    retention: RetentionConfig = field(default_factory=RetentionConfig)
    kafka: KafkaConfig = field(default_factory=KafkaConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    capture: CaptureConfig = field(default_factory=CaptureConfig)
    admin: AdminConfig = field(default_factory=AdminConfig)
    log: LogConfig = field(default_factory=LogConfig)

    @classmethod
    def sections(cls) -> dict[str, type[Any]]:
        hints = get_type_hints(cls)
        return {f.name: hints[f.name] for f in dataclasses.fields(cls)}

    @classmethod
    def load(cls, path: str | None = None, overrides: dict[str, dict[str, Any]] | None = None,
             environ: dict[str, str] | None = None) -> Config:
        sections = load_sections(cls.sections(), path, overrides,
                                 os.environ if environ is None else environ)
        config = cls(**sections)
        config.check()
        return config

    def check(self) -> None:
        """Every value passes its declared check (defaults included)."""
        for name in self.sections():
            section = getattr(self, name)
            for f in dataclasses.fields(section):
                check = f.metadata.get("check")
                problem = check(getattr(section, f.name)) if check else None
                if problem:
                    raise ConfigError(f"{name}.{f.name}: {problem}")
        if self.listener.tls_key and not self.listener.tls_cert:
            raise ConfigError("listener.tls_key is set without listener.tls_cert")
        if self.admin.tls_key and not self.admin.tls_cert:
            raise ConfigError("admin.tls_key is set without admin.tls_cert")
        if self.kafka.avro and self.kafka.format != "debezium":
            raise ConfigError("kafka.value_format = \"avro\" takes format = \"debezium\" (the "
                              "Kafka Connect world Confluent's wire format belongs to); the "
                              f"{self.kafka.format} format's values are JSON")
        if self.kafka.key_format == "avro" and not self.kafka.avro:
            raise ConfigError("kafka.key_format = \"avro\" goes with value_format = \"avro\"")
        if self.kafka.key_format == "avro" and self.kafka.key not in ("auto", "primary-key"):
            raise ConfigError("kafka.key_format = \"avro\" writes the primary key (key = "
                              "\"primary-key\", the debezium format's own)")
        if self.kafka.avro and self.kafka.value_schema:
            raise ConfigError("kafka.value_schema writes JSON values with their Connect schema; "
                              "Avro values (value_format = \"avro\") name theirs in the "
                              "registry: set one of them")
        if self.kafka.key_format == "avro" and self.kafka.key_schema:
            raise ConfigError("kafka.key_schema writes JSON keys with their Connect schema; "
                              "Avro keys (key_format = \"avro\") name theirs in the registry: "
                              "set one of them")
        if self.kafka.avro and not self.kafka.schema_registry_url:
            raise ConfigError("kafka.value_format = \"avro\" needs schema_registry_url, where "
                              "the tables' schemas are registered")
        if self.kafka.publisher_lock and not self.kafka.state_topic:
            raise ConfigError("kafka.publisher_lock needs kafka.state_topic: the instance that "
                              "takes over reads the position there")
        if self.kafka.snapshot == "initial" and self.kafka.exactly_once:
            raise ConfigError("kafka.snapshot = \"initial\" publishes at least once (its rows "
                              "may be sent again after a crash); it does not go with "
                              "delivery = \"exactly-once\"")
        if self.kafka.snapshot == "initial" and self.kafka.publisher_lock:
            raise ConfigError("kafka.snapshot = \"initial\" is taken by one instance; it does "
                              "not go with kafka.publisher_lock")
        if self.kafka.exactly_once:
            kafka = self.kafka
            if not kafka.state_topic:
                raise ConfigError("kafka.delivery = \"exactly-once\" needs kafka.state_topic: "
                                  "the position is committed there with the messages")
            if not kafka.idempotence or kafka.acks != "all":
                raise ConfigError("kafka.delivery = \"exactly-once\" needs kafka.idempotence "
                                  "= true and kafka.acks = \"all\" (Kafka transactions do)")


def add_config_flag(parser: argparse.ArgumentParser | argparse._MutuallyExclusiveGroup,
                    read_for: str = "") -> None:
    """``--config FILE``, the one way every command is given the service's TOML file
    (``read_for``: what the command reads in it, when it is not the whole)."""
    parser.add_argument("--config", metavar="FILE",
                        help="the service's TOML file" + (f" ({read_for})" if read_for else
                                                          ""))


def add_arguments(parser: argparse.ArgumentParser, settings: Iterable[str] | None = None,
                  flags: dict[str, str] | None = None) -> None:
    """One flag per setting that declares one (or, with ``settings``, for those
    ``section.key`` names only; ``flags`` gives a flag to a setting that has none); values land
    in ``dest='section.key'`` for :func:`overrides_from_args`."""
    wanted = None if settings is None else set(settings)
    for section, section_type in Config.sections().items():
        hints = get_type_hints(section_type)
        for f in dataclasses.fields(section_type):
            name = f"{section}.{f.name}"
            flag = (flags or {}).get(name) or f.metadata.get("cli")
            if not flag or (wanted is not None and name not in wanted):
                continue
            kind = hints[f.name]
            kwargs: dict[str, Any] = {"dest": name, "default": argparse.SUPPRESS,
                                      "help": f"{f.metadata['help']} (default: {f.default!r})"
                                      if not f.metadata.get("secret") else f.metadata["help"]}
            if kind is bool:
                kwargs["action"] = argparse.BooleanOptionalAction
            elif choices(kind):
                kwargs["choices"] = choices(kind)
            else:
                kwargs["type"] = kind
                kwargs["metavar"] = f.name.upper()
            parser.add_argument(flag, **kwargs)


def overrides_from_args(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    overrides: dict[str, dict[str, Any]] = {}
    for dest, value in vars(args).items():
        if "." in dest:
            section, key = dest.split(".", 1)
            overrides.setdefault(section, {})[key] = value
    return overrides


def split_source_urls(text: str) -> list[str]:
    """``mysql://a,mysql://b`` as its URLs (a comma inside a URL, in a password, is
    percent-encoded: ``%2C``)."""
    urls = [u.strip() for u in re.split(r",\s*(?=[A-Za-z][A-Za-z0-9+.-]*://)", text.strip())]
    return [u for u in urls if u] or [""]


def parse_source_url(url: str, password: str | None = None) -> SourceAddress:
    """``mysql://user:pass@host:port`` or ``mysql://user@localhost?socket=/path``."""
    if not url:
        raise ConfigError("no source: give --source mysql://USER:PASSWORD@HOST:PORT")
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in ("mysql", "mariadb"):
        raise ConfigError(f"the source URL must start with mysql:// (got {parsed.scheme!r}://)")
    query = urllib.parse.parse_qs(parsed.query)
    try:
        port = parsed.port or 3306
    except ValueError:
        raise ConfigError("the source URL has an invalid port") from None
    url_password = urllib.parse.unquote(parsed.password) if parsed.password else ""
    ssl = {k[4:]: v[0] for k, v in query.items() if k.startswith("ssl_")} or None
    return SourceAddress(
        host=parsed.hostname or "127.0.0.1", port=port,
        user=urllib.parse.unquote(parsed.username or "root"),
        password=password if password is not None and not url_password else url_password,
        unix_socket=query.get("socket", [None])[0], ssl=ssl)
