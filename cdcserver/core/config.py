"""Configuration, declared once.

Each section is a frozen dataclass whose fields carry their type, default, help text,
command-line flag and the check a value must pass. A setting with a fixed set of values has a
``Literal`` type: the choices are the type's. The same declaration drives the TOML file
(``--config``, one table per section, unknown keys rejected), the environment
(``CDCSERVER_<SECTION>_<KEY>``) and every command's flags (:func:`add_arguments`), with the
precedence defaults < TOML < environment < command line. Every value is checked when the
configuration is loaded, so a mistake is reported at start, naming the setting.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import os
import re
import ssl
import stat
import tomllib
import urllib.parse
import zoneinfo
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, get_args, get_origin, get_type_hints

from cdcserver.core.capture import parse_column_patterns, parse_patterns
from cdcserver.core.errors import ConfigError
from cdcserver.core.gtid import GtidState

Check = Callable[[Any], str | None]  # a value's problem, or None

# Read beside the settings' variables: secrets, never a TOML key or a flag (documented in
# reference.SECRET_VARIABLES).
SOURCE_PASSWORD_VARIABLE = "CDCSERVER_SOURCE_PASSWORD"
KAFKA_SASL_PASSWORD_VARIABLE = "CDCSERVER_KAFKA_SASL_PASSWORD"
HASH_SALT_VARIABLE = "CDCSERVER_HASH_SALT"
ADMIN_TOKEN_VARIABLE = "CDCSERVER_ADMIN_TOKEN"  # cdcserver ctl's token (cdcserver/app/ctl.py)
_SECRET_VARIABLES = (SOURCE_PASSWORD_VARIABLE, KAFKA_SASL_PASSWORD_VARIABLE, HASH_SALT_VARIABLE,
                     ADMIN_TOKEN_VARIABLE)
_PREFIX = "CDCSERVER_"


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
                                         "is paused by a full data directory", check=positive)


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
                             "comma-separated")
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
                                    "dump transfer)", check=positive)


def table_patterns(value: str) -> str | None:
    try:
        parse_patterns(value)
    except ValueError as exc:
        return f"expects comma-separated db.table patterns (shop.*, crm.customers): {exc}"
    return None


@dataclass(frozen=True)
class KafkaConfig:
    bootstrap: str = option("", "publish every change to Kafka: HOST:PORT[,HOST:PORT...] "
                                "(empty: off)", cli="--kafka")
    format: Literal["databus", "dip", "debezium", "maxscale"] = option(
        "databus", "message format (cdcserver/sinks/kafka/README.md)", cli="--kafka-format")
    topic: str = option("auto", "topic of a table's changes; {db} and {table} are replaced (a "
                                "fixed name: one topic); auto: the format's ('databus' for "
                                "databus, else '{db}.{table}')", cli="--kafka-topic")
    ddl_topic: str = option("auto", "topic of statements that change no table (CREATE "
                                    "DATABASE...); table statements go to the table's topic; "
                                    "auto: the format's (databus: its one topic, else '{db}')")
    key: Literal["auto", "position", "primary-key"] = option(
        "auto", "message key: the change's binlog position and action, or the row's primary "
        "key; auto: the format's own (debezium: the primary key; the others: the position)")
    databus_labels: bool = option(False, "databus: ENUM and SET values as their labels instead "
                                         "of go-mysql's index and bitmask")
    key_schema: bool = option(False, "debezium: keys as Kafka Connect's JsonConverter writes "
                                     "them with schemas.enable ({\"schema\": ..., "
                                     "\"payload\": ...})")
    schema_topic: str = option("cdcserver-schemas", "topic of the tables' schemas, which "
                                                    "clients use to type values ('': none)")
    state_topic: str = option("cdcserver-state", "topic the sink also records its position in, "
                                                 "read back if state/kafka.json is lost ('': "
                                                 "none)")
    publisher_lock: str = option("", "with several service instances on one source: publish "
                                     "only while holding this named lock on the source "
                                     "(GET_LOCK); the others stand by and take over from "
                                     "state_topic when it is free ('': always publish)",
                                 cli="--kafka-publisher-lock")
    include: str = option("", "of the tables captured, those published: db.table patterns as "
                              "[capture] include's ('': every table captured)",
                          cli="--kafka-include", check=table_patterns)
    exclude: str = option("", "tables captured but not published: db.table patterns as "
                              "[capture] exclude's", cli="--kafka-exclude",
                          check=table_patterns)
    create_topics: bool = option(True, "create missing topics")
    partitions: int = option(0, "partitions of the topics it creates (0: the format's: 1 for "
                                "databus, whose consumers read partition 0; else 3)",
                             check=not_negative)
    replication_factor: int = option(1, "replication factor of the topics it creates",
                                     check=positive)
    acks: Literal["all", "1", "0"] = option("all", "producer acks")
    idempotence: bool = option(True, "idempotent producer (turn off for brokers without it)",
                               cli="--kafka-idempotence")
    compression: Literal["none", "gzip", "snappy", "lz4", "zstd"] = option(
        "none", "compression codec")
    linger_ms: int = option(5, "how long the producer waits to fill a batch")
    max_batch_bytes: int = option(256 * 1024, "largest batch per partition")
    max_buffer_bytes: int = option(64 * 1024 * 1024, "unacknowledged message bytes held; when "
                                                     "full (a slow or absent broker), "
                                                     "replication waits")
    request_timeout: float = option(30.0, "how long a send waits for the broker's "
                                          "acknowledgement; then the sink reconnects and "
                                          "sends everything unacknowledged again")
    client_id: str = option("cdcserver", "client id, and the source name in Debezium messages")
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = option(
        "PLAINTEXT", "how the producer talks to the brokers")
    ssl_cafile: str = option("", "CA bundle that signs the brokers' certificates")
    ssl_certfile: str = option("", "client certificate (mutual TLS)")
    ssl_keyfile: str = option("", "client certificate's key")
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = option(
        "PLAIN", "SASL mechanism")
    sasl_username: str = option("", "SASL user")
    sasl_password_file: str = option("", "file holding the SASL password (or "
                                         "CDCSERVER_KAFKA_SASL_PASSWORD)", secret=True)
    time_zone: str = option("UTC", "zone of the dip format's TIME field and of TIMESTAMP values "
                                   "in the maxscale format (the data platform's examples are in "
                                   "UTC+8: Asia/Shanghai)", cli="--kafka-time-zone",
                            check=time_zone)

    @property
    def enabled(self) -> bool:
        return bool(self.bootstrap.strip())

    def sasl_password(self) -> str:
        if self.sasl_password_file:
            return read_secret(self.sasl_password_file, "kafka.sasl_password_file")
        return os.environ.get(KAFKA_SASL_PASSWORD_VARIABLE, "")


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


def system_tables(value: str) -> str | None:
    for item in filter(None, (i.strip() for i in value.split(","))):
        database, dot, table = item.partition(".")
        if not dot or not database or not table or "*" in item:
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


@dataclass(frozen=True)
class CaptureConfig:
    include: str = option(
        "", "the tables to capture: comma-separated db.table patterns, * for any characters "
            "in a name, a quoted name exact (e.g. shop.*,crm.customers); empty: every table",
        cli="--include", check=table_patterns)
    exclude: str = option(
        "", "tables not to capture, of those include selects: db.table patterns as include's "
            "(e.g. audit.*,shop.sessions)", cli="--exclude", check=table_patterns)
    system_tables: str = option(
        "", "tables of the system schemas (mysql, information_schema, performance_schema, "
            "sys) to capture, named one by one (db.table,...); none by default, and never "
            "mysql.global_priv or mysql.user, which hold password hashes",
        check=system_tables)
    columns_exclude: str = option(
        "", "columns never captured: comma-separated db.table.column patterns, * for any "
            "characters (e.g. shop.users.password_hash,*.*.ssn)", cli="--columns-exclude",
        check=column_patterns)
    columns_hash: str = option(
        "", "columns stored as the hex SHA-256 of the salt and the value (joins still match): "
            "db.table.column patterns; needs hash_salt_file or CDCSERVER_HASH_SALT",
        cli="--columns-hash", check=column_patterns)
    columns_mask: str = option(
        "", "columns stored masked: db.table.column patterns, each may end :N to keep the "
            "first N characters; the rest becomes *** (e.g. shop.cards.number:4)",
        cli="--columns-mask", check=mask_patterns)
    hash_salt_file: str = option(
        "", "file holding the salt of columns_hash (or the environment variable "
            "CDCSERVER_HASH_SALT); never in this file", cli="--hash-salt-file", secret=True)

    def hash_salt(self) -> bytes | None:
        """The salt of ``columns_hash``: the file's bytes (one trailing newline dropped), or
        CDCSERVER_HASH_SALT's; None when neither is set. As with the admin token's file, a
        salt file other users may read or change is refused (the salt is what keeps a
        hashed value from being found by hashing guesses), and so is one of whitespace
        only."""
        if self.hash_salt_file:
            path = self.hash_salt_file
            try:
                with open(path, "rb") as f:
                    mode = os.fstat(f.fileno()).st_mode
                    salt = f.read()
            except OSError as exc:
                raise ConfigError(f"capture.hash_salt_file: {exc}") from exc
            if mode & (stat.S_IRWXG | stat.S_IRWXO):
                raise ConfigError(f"capture.hash_salt_file {path} may be read by other users "
                                  f"(mode {stat.S_IMODE(mode):o}); chmod 600 {path}")
            salt = salt[:-1] if salt.endswith(b"\n") else salt
            if not salt.strip():
                raise ConfigError(f"capture.hash_salt_file {path} holds no salt (empty, or "
                                  "whitespace only)")
            return salt
        value = os.environ.get(HASH_SALT_VARIABLE)
        if value is not None and value and not value.strip():
            raise ConfigError(f"{HASH_SALT_VARIABLE} holds no salt (whitespace only)")
        return value.encode("utf-8") if value else None


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
        values: dict[str, dict[str, Any]] = {name: {} for name in cls.sections()}
        if path:
            _merge(values, _read_toml(path), source=path)
        _merge(values, _from_environment(os.environ if environ is None else environ),
               source="the environment")
        _merge(values, overrides or {}, source="the command line")
        sections = {}
        for name, section_type in cls.sections().items():
            sections[name] = _build(section_type, values[name], name)
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
        if self.kafka.publisher_lock and not self.kafka.state_topic:
            raise ConfigError("kafka.publisher_lock needs kafka.state_topic: the instance that "
                              "takes over reads the position there")


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


def _from_environment(environ: dict[str, str] | Any) -> dict[str, dict[str, Any]]:
    """The settings ``CDCSERVER_<SECTION>_<KEY>`` variables set; any other ``CDCSERVER_``
    variable is a misspelling, refused as an unknown TOML key is."""
    settings = _environment_variables()
    found: dict[str, dict[str, Any]] = {}
    for name, value in environ.items():
        if not name.startswith(_PREFIX) or name in _SECRET_VARIABLES:
            continue
        if name not in settings:
            raise ConfigError(_unknown_variable(name, [*settings, *_SECRET_VARIABLES]))
        section, key = settings[name]
        found.setdefault(section, {})[key] = value
    return found


def _environment_variables() -> dict[str, tuple[str, str]]:
    """Each setting's variable, and its (section, key)."""
    return {f"{_PREFIX}{section.upper()}_{f.name.upper()}": (section, f.name)
            for section, section_type in Config.sections().items()
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
        kwargs[key] = _coerce(hints[key], value, f"{section}.{key}")
        allowed = choices(hints[key])
        if allowed and kwargs[key] not in allowed:
            raise ConfigError(f"{section}.{key} must be one of {', '.join(allowed)}, "
                              f"not {kwargs[key]!r}")
    return section_type(**kwargs)


_DURATION = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_SIZE = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1024, "m": 1000**2, "mb": 1000**2,
         "mib": 1024**2, "g": 1000**3, "gb": 1000**3, "gib": 1024**3, "t": 1000**4,
         "tb": 1000**4, "tib": 1024**4}
_QUANTITY = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?)\s*([a-zA-Z]*)\s*$")


def _quantity(value: str, units: dict[str, int]) -> float:
    """``90``, ``5m``, ``24h``, ``7d``; ``512MiB``, ``50GB``."""
    m = _QUANTITY.match(value)
    if m is None or m[2].lower() not in units:
        raise ValueError(value)
    return float(m[1]) * units[m[2].lower()]


def _coerce(kind: Any, value: Any, name: str) -> Any:
    try:
        if kind is float and isinstance(value, str):
            return _quantity(value, _DURATION)
        if kind is int and isinstance(value, str) and name.endswith("_bytes"):
            return int(_quantity(value, _SIZE))
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
