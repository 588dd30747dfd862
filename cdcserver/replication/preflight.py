"""Preflight: is this source ready to be captured, and what to change where it is not.

``cdcserver check`` prints every finding with the SQL (or configuration) that fixes it; ``run``
refuses to start on a fatal one with the same text. Each check asks the server what it is,
never assumes: the variables, the privileges of the account the service uses (tried where a
statement needs just that privilege, else read from ``SHOW GRANTS``, privilege by privilege),
the binlogs on disk and how long they are kept.

Fatal: rows could not be captured exactly (no binlog, not ROW, not a FULL image, no
replication privilege, a server too old, the service's own server_id). Warnings: it works,
but something will hurt later (no column names in the binlog, dumps impossible without SELECT,
binlogs purged sooner than an outage can last, GTID strictness off).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import pymysql

from cdcserver.core.config import SourceAddress
from cdcserver.replication import source as source_sql

# A day of binlogs: shorter, and an outage over a weekend loses the position.
MIN_RETENTION_SECONDS = 24 * 3600
_MIN_VERSION = {"mariadb": (10, 3), "mysql": (5, 7)}
_ER_ACCESS = (1044, 1045, 1142, 1227, 1370)  # access denied, command denied, need privilege
# "You are not using binary logging": the server checks the privilege of SHOW BINARY LOGS
# before it looks for a binlog (sql_parse.cc, then show_binlogs()), so this answer means the
# privilege is there; the missing binlog is the "binary log" finding's.
_ER_NO_BINARY_LOGGING = 1381
# One line of SHOW GRANTS: "GRANT SELECT, REPLICATION SLAVE ON *.* TO `u`@`%` ..." (a role's
# line, "GRANT `r` TO `u`@`%`", has no ON and grants nothing by itself).
_GRANT = re.compile(r"^GRANT (?P<privileges>.+?) ON (?P<target>(?:`(?:[^`]|``)*`|[^\s`])+) TO ",
                    re.I)
_REPLICATION = frozenset({"REPLICATION SLAVE", "REPLICATION REPLICA", "ALL PRIVILEGES", "ALL"})
_SELECT = frozenset({"SELECT", "ALL PRIVILEGES", "ALL"})


class Severity(StrEnum):
    OK = "ok"
    WARNING = "warning"
    FATAL = "fatal"


@dataclass(frozen=True)
class Finding:
    check: str
    severity: Severity
    detail: str
    fix: str = ""  # SQL or configuration that resolves it

    def text(self) -> str:
        head = f"{self.severity.value.upper():7} {self.check}: {self.detail}"
        if not self.fix:
            return head
        return head + "\n" + "\n".join("        " + line for line in self.fix.splitlines())


@dataclass(frozen=True)
class Report:
    source: str
    findings: tuple[Finding, ...]
    info: source_sql.SourceInfo | None = None  # what the server said it is (if it answered)

    @property
    def fatal(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == Severity.FATAL]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == Severity.WARNING]

    def text(self) -> str:
        lines = [f"source {self.source}"] + [f.text() for f in self.findings]
        verdict = ("not ready: fix the fatal findings above" if self.fatal else
                   "ready" + (f", with {len(self.warnings)} warning(s)" if self.warnings else ""))
        return "\n".join([*lines, verdict])

    def refusal(self) -> str:
        """What ``run`` says when it will not start."""
        return "the source cannot be captured:\n" + "\n".join(f.text() for f in self.fatal)


def check_source(address: SourceAddress, replica_server_id: int | None = None) -> Report:
    """Connect and check; a failed connection is itself the (fatal) finding."""
    try:
        conn = source_sql.connect(address)
    except Exception as exc:  # noqa: BLE001 - reported, not raised: it is the check's answer
        return Report(address.describe(), (Finding("connection", Severity.FATAL, str(exc)),))
    try:
        return check_connection(conn, address.describe(), replica_server_id)
    finally:
        conn.close()


def check_connection(conn: Any, name: str, replica_server_id: int | None = None) -> Report:
    info = source_sql.describe(conn)
    return Report(name, tuple(_findings(conn, info, replica_server_id)), info)


def _findings(conn: Any, info: source_sql.SourceInfo, replica_server_id: int | None
              ) -> list[Finding]:
    v = info.variables
    account = _account(conn)
    found = [_version(info.version, info.flavor)]
    found += _binlog_settings(v, info.flavor)
    found.append(_metadata(v, info.flavor))
    found.append(_gtid(conn, v, info.flavor))
    found += _privileges(conn, account, info.flavor)
    found.append(_retention(conn, info.flavor))
    found.append(_replica(conn, v, info.flavor))
    if replica_server_id is not None:
        found.append(_server_id(conn, v, replica_server_id))
    return found


def _account(conn: Any) -> str:
    user, _, host = str(source_sql.query(conn, "SELECT CURRENT_USER()")[0][0]).partition("@")
    return f"'{user}'@'{host}'"


def _version(version: str, flavor: str) -> Finding:
    m = re.match(r"(\d+)\.(\d+)", version)
    numbers = (int(m[1]), int(m[2])) if m else (0, 0)
    least = _MIN_VERSION[flavor]
    name = "MariaDB" if flavor == "mariadb" else "MySQL"
    if numbers < least:
        return Finding("server version", Severity.FATAL,
                       f"{name} {version}; {name} {least[0]}.{least[1]} or newer is needed",
                       f"upgrade the server to {name} {least[0]}.{least[1]} or newer")
    return Finding("server version", Severity.OK, f"{name} {version}")


def _persist(setting: str, value: str, flavor: str) -> str:
    """Set a global now and keep it over a restart."""
    if flavor == "mysql":
        return f"SET PERSIST {setting} = '{value}';"
    return (f"SET GLOBAL {setting} = '{value}';\n"
            f"-- and in the server's configuration ([mariadbd] section): {setting} = {value}")


def _binlog_settings(v: dict[str, str], flavor: str) -> list[Finding]:
    found = []
    if v.get("log_bin", "").upper() != "ON":
        found.append(Finding("binary log", Severity.FATAL, f"log_bin is {v.get('log_bin', 'OFF')}",
                             _enable_binlog(v, flavor)))
    else:
        found.append(Finding("binary log", Severity.OK, "log_bin is ON"))
    for name, wanted in (("binlog_format", "ROW"), ("binlog_row_image", "FULL")):
        actual = v.get(name, "?")
        if actual.upper() != wanted:
            found.append(Finding(
                name, Severity.FATAL, f"{name} is {actual}; only {wanted} captures every column "
                "of every change", _persist(name, wanted, flavor)
                + "\n-- sessions already open keep the old value: reconnect the applications"))
        else:
            found.append(Finding(name, Severity.OK, f"{name} is {actual}"))
    return found


def _enable_binlog(v: dict[str, str], flavor: str) -> str:
    """The server configuration that turns the binlog on (a restart is needed), with the
    other settings capture needs, which a restart without them in the file would lose."""
    section = "[mariadbd]" if flavor == "mariadb" else "[mysqld]"
    lines = [f"in the server's configuration ({section} section), then restart it:",
             "  log_bin = mysql-bin", "  server_id = 1  # any id unique among the servers",
             "  binlog_format = ROW", "  binlog_row_image = FULL"]
    if "binlog_row_metadata" in v:  # unknown to MariaDB < 10.5, which would not start
        lines.append("  binlog_row_metadata = FULL")
    return "\n".join(lines)


def _metadata(v: dict[str, str], flavor: str) -> Finding:
    actual = v.get("binlog_row_metadata")
    if actual is None:
        return Finding("binlog_row_metadata", Severity.WARNING,
                       "the server cannot log column names (MariaDB < 10.5, MySQL < 8.0.1): "
                       "they come from the service's schema history, which must then see "
                       "every CREATE/ALTER from the start of the binlog it reads")
    if actual.upper() != "FULL":
        return Finding("binlog_row_metadata", Severity.WARNING,
                       f"binlog_row_metadata is {actual}: column names, ENUM/SET labels and "
                       "keys then come from the schema history alone",
                       _persist("binlog_row_metadata", "FULL", flavor))
    return Finding("binlog_row_metadata", Severity.OK, "binlog_row_metadata is FULL")


def _gtid(conn: Any, v: dict[str, str], flavor: str) -> Finding:
    if flavor == "mariadb":
        if v.get("gtid_strict_mode", "").upper() != "ON":
            return Finding("GTID", Severity.WARNING,
                           "gtid_strict_mode is OFF: out-of-order GTIDs in a domain would make "
                           "GTID positions ambiguous after a failover",
                           _persist("gtid_strict_mode", "ON", flavor))
        return Finding("GTID", Severity.OK, "MariaDB GTIDs, gtid_strict_mode ON")
    rows = source_sql.query(conn, "SELECT @@GLOBAL.gtid_mode")
    mode = str(rows[0][0]) if rows else "OFF"
    if mode.upper() != "ON":
        return Finding("GTID", Severity.WARNING,
                       f"gtid_mode is {mode}: transactions are numbered by binlog position, "
                       "so a position does not survive a failover to another server",
                       "SET PERSIST enforce_gtid_consistency = ON;\n"
                       "SET PERSIST gtid_mode = OFF_PERMISSIVE;\n"
                       "SET PERSIST gtid_mode = ON_PERMISSIVE;\n"
                       "SET PERSIST gtid_mode = ON;  -- once no anonymous transaction is left")
    return Finding("GTID", Severity.OK, "gtid_mode is ON")


def _privileges(conn: Any, account: str, flavor: str) -> list[Finding]:
    found = []
    grants = _grants(conn)
    everywhere = grants.get("*.*", set())
    replication = bool(everywhere & _REPLICATION)
    found.append(Finding("privilege REPLICATION SLAVE",
                         Severity.OK if replication else Severity.FATAL,
                         "granted" if replication else
                         f"{account} may not read the binlog as a replica",
                         "" if replication else
                         f"GRANT REPLICATION SLAVE ON *.* TO {account};"))
    monitor = "BINLOG MONITOR" if flavor == "mariadb" else "REPLICATION CLIENT"
    if _allowed(conn, "SHOW BINARY LOGS"):
        found.append(Finding(f"privilege {monitor}", Severity.OK, "granted"))
    else:
        found.append(Finding(f"privilege {monitor}", Severity.FATAL,
                             f"{account} may not list the binlogs (SHOW BINARY LOGS)",
                             f"GRANT {monitor} ON *.* TO {account};"))
    if everywhere & _SELECT:
        found.append(Finding("privilege SELECT", Severity.OK, "granted on *.*"))
    else:
        some = sorted(t for t, p in grants.items() if p & _SELECT)
        found.append(Finding("privilege SELECT", Severity.WARNING,
                             f"{account} has no SELECT on *.*"
                             + (f" (only on {', '.join(some)})" if some else "")
                             + ": dumps and `cdcserver verify` need it for the tables they read",
                             f"GRANT SELECT ON *.* TO {account};  -- or on each db.table"))
    return found


def _grants(conn: Any) -> dict[str, set[str]]:
    """The privileges SHOW GRANTS lists, by what they are granted on (``*.*``, ```db`.*``):
    the account's and its current role's (MariaDB lists the role's grants there too, as
    ``GRANT ... TO `role```). Column privileges (``SELECT (`a`, `b`)``) grant no table."""
    grants: dict[str, set[str]] = {}
    for row in source_sql.query(conn, "SHOW GRANTS"):
        m = _GRANT.match(str(row[0]))
        if m is None:
            continue
        listed = re.split(r",(?![^()]*\))", m["privileges"])  # not at a column list's commas
        privileges = {" ".join(p.split()).upper() for p in listed if "(" not in p}
        grants.setdefault(m["target"], set()).update(privileges)
    return grants


def _allowed(conn: Any, sql: str) -> bool:
    try:
        source_sql.query(conn, sql)
    except pymysql.err.MySQLError as exc:
        if exc.args and exc.args[0] in _ER_ACCESS:
            return False
        if exc.args and exc.args[0] == _ER_NO_BINARY_LOGGING:
            return True
        raise
    return True


def _retention(conn: Any, flavor: str) -> Finding:
    seconds = _retention_seconds(conn, flavor)
    if seconds == 0:
        return Finding("binlog retention", Severity.OK,
                       "binlogs are never purged automatically (watch the disk)")
    if seconds < MIN_RETENTION_SECONDS:
        hours = seconds / 3600
        return Finding("binlog retention", Severity.WARNING,
                       f"binlogs are purged after {hours:g} h: a service stopped longer than "
                       "that cannot resume and needs new dumps",
                       _persist("binlog_expire_logs_seconds", "604800", flavor)
                       + "  -- a week")
    return Finding("binlog retention", Severity.OK, f"binlogs kept {seconds / 86400:g} days")


def _retention_seconds(conn: Any, flavor: str) -> float:
    rows = source_sql.query(conn, "SHOW GLOBAL VARIABLES WHERE Variable_name IN "
                                  "('binlog_expire_logs_seconds', 'expire_logs_days')")
    values = {str(k).lower(): float(v or 0) for k, v in rows}
    if values.get("binlog_expire_logs_seconds"):
        return values["binlog_expire_logs_seconds"]
    return values.get("expire_logs_days", 0.0) * 86400


def replica_status(conn: Any, flavor: str) -> list[tuple[Any, ...]] | None:
    """The server's replication connections (empty: not a replica; None: it would not say,
    for want of the REPLICA MONITOR privilege)."""
    try:
        return source_sql.query(conn, "SHOW ALL SLAVES STATUS" if flavor == "mariadb"
                                else "SHOW SLAVE STATUS")
    except pymysql.err.MySQLError:
        return None


def _replica(conn: Any, v: dict[str, str], flavor: str) -> Finding:
    """A replica can be the source only if it logs what it applies."""
    logs = v.get("log_slave_updates", "").upper() in ("ON", "1")
    status = replica_status(conn, flavor)
    if status is None:
        return Finding("replica", Severity.OK if logs else Severity.WARNING,
                       "cannot tell whether the server is a replica (SHOW SLAVE STATUS needs "
                       "the REPLICA MONITOR privilege)" + (
                           "" if logs else "; if it is one, without log_slave_updates its "
                           "binlog misses what it replicates"))
    if not status:
        return Finding("replica", Severity.OK, "not a replica")
    if logs:
        return Finding("replica", Severity.OK, "a replica that logs what it applies "
                                               "(log_slave_updates)")
    return Finding("replica", Severity.FATAL,
                   "a replica without log_slave_updates: its binlog does not hold the "
                   "transactions it replicates, so the stream would miss them",
                   "in the replica's configuration, then restart it:\n  log_slave_updates = ON")


def _server_id(conn: Any, v: dict[str, str], replica_server_id: int) -> Finding:
    if v.get("server_id") == str(replica_server_id):
        return Finding("server_id", Severity.FATAL,
                       f"the source's server_id is {replica_server_id}, the id the service "
                       "would register with: the source would drop the connection",
                       "set source.server_id (--server-id) in the service's configuration to "
                       "an id no server or replica uses")
    try:
        replicas = source_sql.query(conn, "SHOW SLAVE HOSTS")
    except pymysql.err.MySQLError:  # it needs REPLICATION MASTER ADMIN: not required
        replicas = []
    taken = [f"{row[1]}:{row[2]}" for row in replicas if int(row[0]) == replica_server_id]
    if taken:
        return Finding("server_id", Severity.WARNING,
                       f"a replica ({', '.join(taken)}) is connected with server_id "
                       f"{replica_server_id} now: unless it is this service running, the two "
                       "would cut each other off (the server keeps one connection per "
                       "server_id)",
                       "give each replica its own source.server_id (--server-id)")
    return Finding("server_id", Severity.OK,
                   f"source {v.get('server_id', '?')}, service {replica_server_id}")
