"""Questions the replicator asks the primary over an ordinary SQL connection."""

from __future__ import annotations

import re
import socket
import ssl
import threading
from dataclasses import dataclass
from typing import Any

import pymysql

from cdcserver.core.config import SourceAddress
from cdcserver.core.errors import SourceError, SourceUnavailable
from cdcserver.core.gtid import BinlogPosition, GtidState
from cdcserver.mariadb.charsets import CollationTable
from mariadb_cdc_client.format.keepalive import end_silent_peers

_GTID_LIST_INFO = re.compile(r"\[(.*)\]")


@dataclass(frozen=True)
class SourceInfo:
    version: str
    flavor: str  # "mariadb" or "mysql"
    variables: dict[str, str]


# A source that has acknowledged nothing for this long is gone (a partition, a half-open
# connection, a host that died): the connection ends with an error, whatever it was doing
# (a query, a dump's read), and the caller reconnects. TCP alone would wait for about 15
# minutes, or for ever on an idle connection. A slow query on a live server is not cut:
# its connection acknowledges (mariadb_cdc_client.format.keepalive).
DEAD_SOURCE_TIMEOUT = 30.0


class Connection(pymysql.connections.Connection):
    """pymysql's connection, sharing one TLS context among the connections that set no TLS
    options: without options pymysql tries TLS if the server offers it (unverified, as
    before), and made a context for every connection, loading the system's CA bundle each
    time (35 ms; a chunked dump opens a connection per reader). Each ends once the source
    acknowledges nothing for ``DEAD_SOURCE_TIMEOUT`` seconds."""

    _preferred: ssl.SSLContext | None = None
    _lock = threading.Lock()

    def connect(self, sock: Any = None) -> None:
        if sock is None and not self.unix_socket:
            sock = self._tcp_socket()
        super().connect(sock)

    def _tcp_socket(self) -> socket.socket:
        """pymysql's TCP connection, with the dead-peer bound set before the handshake: a
        source that vanished while it greeted (its host cut off, its network namespace
        gone) was waited for for ever, holding the thread that asked."""
        source = (self.bind_address, 0) if self.bind_address is not None else None
        try:
            sock = socket.create_connection((self.host, self.port), self.connect_timeout,
                                            source_address=source)
        except OSError as exc:
            raise pymysql.err.OperationalError(
                2003, f"Can't connect to MySQL server on {self.host!r} ({exc})") from exc
        self.host_info = f"socket {self.host}:{self.port}"
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        end_silent_peers(sock, DEAD_SOURCE_TIMEOUT)
        return sock

    def _create_ssl_ctx(self, sslp: Any) -> Any:
        if sslp != {}:
            return super()._create_ssl_ctx(sslp)
        with Connection._lock:
            if Connection._preferred is None:
                Connection._preferred = super()._create_ssl_ctx(sslp)
            return Connection._preferred


def connect(address: SourceAddress) -> pymysql.connections.Connection:
    try:
        return Connection(**address.pymysql_kwargs(), autocommit=True)
    except pymysql.err.OperationalError as exc:
        code = exc.args[0] if exc.args else 0
        if code in (1044, 1045):  # access denied
            raise SourceError(f"{address.describe()}: {exc.args[1]}") from exc
        raise SourceUnavailable(f"cannot connect to {address.describe()}: {exc}") from exc


def query(conn: Any, sql: str, args: tuple[object, ...] = ()) -> list[tuple[Any, ...]]:
    with conn.cursor() as cur:
        cur.execute(sql, args or None)  # no args: a literal % must not be a placeholder
        return list(cur.fetchall())


_VARIABLES = ("log_bin", "binlog_format", "binlog_row_image", "binlog_row_metadata",
              "gtid_strict_mode", "binlog_checksum", "server_id", "gtid_binlog_pos",
              "log_bin_compress", "version_comment", "log_slave_updates")


def server_identity(conn: Any) -> str:
    """Which server a connection reached, as ``server_id@hostname:port``: the server_id
    alone does not tell Galera nodes apart (they share one), and a proxy may send two
    connections to two servers."""
    server_id, host, port = query(conn, "SELECT @@GLOBAL.server_id, @@hostname, @@port")[0]
    return f"{server_id}@{host}:{port}"


def estimated_rows(conn: Any, database: str, table: str) -> int:
    """The rows the source estimates a table holds (InnoDB's statistics, not a count);
    0 for a table it does not have."""
    rows = query(conn, "SELECT TABLE_ROWS FROM information_schema.TABLES WHERE "
                       "TABLE_SCHEMA = %s AND TABLE_NAME = %s", (database, table))
    return int(rows[0][0] or 0) if rows else 0


def describe(conn: Any) -> SourceInfo:
    version = str(query(conn, "SELECT VERSION()")[0][0])
    names = ",".join(f"'{n}'" for n in _VARIABLES)
    variables = {str(k).lower(): str(v) for k, v in
                 query(conn, f"SHOW GLOBAL VARIABLES WHERE Variable_name IN ({names})")}
    flavor = "mariadb" if "mariadb" in version.lower() else "mysql"
    return SourceInfo(version, flavor, variables)


def collations(conn: Any) -> CollationTable:
    rows = query(conn, "SELECT ID, CHARACTER_SET_NAME FROM information_schema.COLLATIONS")
    return CollationTable({int(i): str(name) for i, name in rows if i is not None})


def newest_position(conn: Any, info: SourceInfo) -> BinlogPosition:
    """The end of the binlog: start here to skip history."""
    status = query(conn, "SHOW MASTER STATUS")
    file, pos = (str(status[0][0]), int(status[0][1])) if status else ("", 4)
    if info.flavor == "mariadb":
        state = str(query(conn, "SELECT @@GLOBAL.gtid_binlog_pos")[0][0] or "")
    else:
        state = _mysql_gtid_set(conn, "gtid_executed")
    return BinlogPosition(GtidState.parse(state), file, pos)


def oldest_position(conn: Any, info: SourceInfo) -> BinlogPosition:
    """The start of the oldest binlog still on the server. MariaDB: the GTID state in its
    first Gtid_list event (what MaxScale's ``gtid_start_pos=oldest`` reads); MySQL: the GTIDs
    already purged (none are left to send before them)."""
    logs = query(conn, "SHOW BINARY LOGS")
    if not logs:
        raise SourceError("the source has no binary logs (is log_bin on?)")
    first = str(logs[0][0])
    if info.flavor != "mariadb":
        return BinlogPosition(GtidState.parse(_mysql_gtid_set(conn, "gtid_purged")), first, 4)
    for row in query(conn, "SHOW BINLOG EVENTS IN %s LIMIT 5", (first,)):
        if str(row[2]) == "Gtid_list":
            m = _GTID_LIST_INFO.search(str(row[5]))
            return BinlogPosition(GtidState.parse(m[1] if m else ""), first, 4)
    return BinlogPosition(GtidState(), first, 4)


def _mysql_gtid_set(conn: Any, variable: str) -> str:
    try:
        return str(query(conn, f"SELECT @@GLOBAL.{variable}")[0][0] or "")
    except pymysql.err.OperationalError:  # gtid_mode is OFF on an old server
        return ""
