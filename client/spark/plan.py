"""What a Spark query reads, decided on the driver: its options, its tables and their schema,
where each table starts, and how a span of offsets is cut into partitions.

Offsets are JSON objects ``{"tables": {"db.t": position, ...}}``, each table named as commands
name it (``mariadb_cdc_client.format.names``: ```my db`.t`` for a name that must be quoted), where a
position is a
:class:`mariadb_cdc_client.ranges.Position` (``gtid_state``, and ``txn``/``event`` inside a cut
transaction), or ``{"dump": name, "gtid_state": g}`` for a table whose dump is still to be
read. An end offset also lists, per table, the positions its range is cut at (``splits``):
one Spark partition reads from one cut to the next, and since the cuts are written to the
checkpoint with the offset, a micro-batch run again reads exactly the same records.
"""

from __future__ import annotations

import fnmatch
import itertools
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql.datasource import InputPartition

from mariadb_cdc_client.endpoints import Endpoints
from mariadb_cdc_client.format.names import BadTableRef, parse_table, split_list, table_ref
from mariadb_cdc_client.login import Auth
from mariadb_cdc_client.ranges import Position, advance, plan
from mariadb_cdc_client.sync import SyncCdcConnection

EARLIEST, LATEST, DUMP = "earliest", "latest", "dump"


class OptionError(ValueError):
    pass


@dataclass(frozen=True)
class Options:
    host: str
    port: int
    user: str
    password: str
    tables: tuple[str, ...]  # names or fnmatch patterns (shop.orders, shop.order_*, `my db`.*)
    starting: str  # earliest | latest | dump | a GTID state
    ending: str  # batch reads: latest | a GTID state
    max_rows_per_batch: int | None  # streaming: all tables together
    max_rows_per_partition: int
    zero_dates: str  # error | null
    timeout: float
    auth: Auth = Auth.AUTO  # the login: SCRAM when offered (mariadb_cdc_client.login)

    @classmethod
    def parse(cls, options: Any, streaming: bool) -> Options:
        o = {k.lower(): v for k, v in dict(options).items()}

        def number(name: str, default: int | None) -> int | None:
            text = o.get(name.lower())
            if text is None:
                return default
            if not str(text).isdigit() or int(text) < 1:
                raise OptionError(f"option {name} must be a positive integer, not {text!r}")
            return int(text)

        tables = tuple(split_list(o.get("tables", "")))  # commas inside quotes are names
        if not tables:
            raise OptionError("option tables is required: db.table, a list, or a pattern "
                              "such as shop.* (a name with a space, a dot or a comma is "
                              "quoted: `my db`.`my.table`)")
        for required in ("user", "password"):
            if required not in o:
                raise OptionError(f"option {required} is required")
        starting = o.get("startingposition", LATEST if streaming else EARLIEST)
        zero_dates = o.get("zerodates", "error")
        if zero_dates not in ("error", "null"):
            raise OptionError("option zeroDates is error or null")
        auth = str(o.get("auth", Auth.AUTO)).lower()
        if auth not in set(Auth):
            raise OptionError("option auth is auto, scram or legacy")
        return cls(o.get("host", "127.0.0.1"), number("port", 4001) or 4001, o["user"],
                   o["password"], tables, starting, o.get("endingposition", LATEST),
                   number("maxRowsPerBatch", None),
                   number("maxRowsPerPartition", 1_000_000) or 1_000_000,
                   zero_dates, float(o.get("timeout", 30)), Auth(auth))

    def connect(self, format: str = "JSON") -> SyncCdcConnection:
        """A connection for queries (JSON), or for bounded reads of blocks (AVRO): to the
        first instance ``host`` names (``HOST[:PORT],...``) that answers. Offsets are GTID
        states and every read is bounded by them, so any instance that replicates the same
        source serves it the same."""
        endpoints = Endpoints.of(self.host, self.port)
        for _ in range(len(endpoints.all) - 1):
            host, port = endpoints.current
            try:
                return SyncCdcConnection.open(host, port, self.user, self.password,
                                              format=format, timeout=self.timeout,
                                              auth=self.auth)
            except OSError:
                endpoints.failed()
        host, port = endpoints.current
        return SyncCdcConnection.open(host, port, self.user, self.password, format=format,
                                      timeout=self.timeout, auth=self.auth)


@dataclass
class Catalog:
    """The tables a query reads: for each, its stored versions' schemas and its dumps."""

    versions: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    dumps: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    @classmethod
    def load(cls, conn: SyncCdcConnection, options: Options) -> Catalog:
        listed = {(t["database"], t["table"]): t["versions"]
                  for t in conn.query("LIST-TABLES")["tables"]}
        dumps: dict[tuple[str, str], list[dict[str, Any]]] = {}
        if options.starting == DUMP:
            for d in conn.list_dumps():
                dumps.setdefault((d["database"], d["table"]), []).append(d)
        found = sorted({n for n in (*listed, *dumps)
                        if any(matches(n, p) for p in options.tables)})
        names = [table_ref(*n) for n in found]
        if not names:
            raise OptionError(f"no stored table matches {', '.join(options.tables)}")
        return cls({r: listed.get(n, []) for r, n in zip(names, found, strict=True)},
                   {r: dumps.get(n, []) for r, n in zip(names, found, strict=True)})

    @property
    def tables(self) -> list[str]:
        return list(self.versions)

    def schemas(self) -> list[dict[str, Any]]:
        """Every schema the query may meet: each stored version, and with a dump start the
        dumps' (a version retention removed is never read, so it does not count)."""
        found = [v for n in self.tables for v in self.versions[n]]
        for dumps in self.dumps.values():
            if dumps:
                found.append(dumps[-1]["schema"])
        return found


def matches(table: tuple[str, str], pattern: str) -> bool:
    """Whether a pattern of the ``tables`` option names a table: matched with fnmatch against
    the reference (``shop.order_*``), or name by name (```my db`.a*`` matches ``a b``)."""
    if fnmatch.fnmatchcase(table_ref(*table), pattern):
        return True
    try:
        ref = parse_table(pattern)
    except BadTableRef:
        return False
    return fnmatch.fnmatchcase(table[0], ref.database) and \
        fnmatch.fnmatchcase(table[1], ref.table)


# -- offsets -------------------------------------------------------------------------------

def start_positions(conn: SyncCdcConnection, catalog: Catalog, options: Options
                    ) -> dict[str, dict[str, Any]]:
    """Each table's starting position, as offset JSON."""
    starting = options.starting
    if starting == EARLIEST:
        return {t: Position().to_json() for t in catalog.tables}
    if starting == LATEST:
        state = conn.query("QUERY-STATE")["gtid_state"]
        return {t: Position(state).to_json() for t in catalog.tables}
    if starting == DUMP:
        positions = {}
        for table in catalog.tables:
            dumps = catalog.dumps.get(table)
            if not dumps:
                raise OptionError(f"startingPosition=dump: {table} has no dump (take one "
                                  f"with: cdcserver dump {table})")
            positions[table] = {"dump": dumps[-1]["name"], "gtid_state": dumps[-1]["gtid"]}
        return positions
    try:
        advance(starting, "")
    except ValueError:
        raise OptionError(f"startingPosition is earliest, latest, dump or a GTID state, "
                          f"not {starting!r}") from None
    return {t: Position(starting).to_json() for t in catalog.tables}


def end_positions(conn: SyncCdcConnection, start: dict[str, dict[str, Any]],
                  options: Options, limit: int | None, until: str | None = None
                  ) -> dict[str, dict[str, Any]]:
    """Each table's end position after ``start``: at most ``limit`` records in all (shared
    evenly between the tables), within ``until`` (a GTID state) if given, with the cuts
    for partitions of at most ``max_rows_per_partition`` records."""
    share = None if limit is None else max(1, limit // max(1, len(start)))
    ends = {}
    for table, offset in start.items():
        if "dump" in offset:  # the dump is the whole range: changes follow in the next one
            ends[table] = {"gtid_state": offset["gtid_state"], "splits": []}
            continue
        ends[table] = _cut(conn, table, Position.from_json(offset), share,
                           options.max_rows_per_partition, until)
    return ends


def _cut(conn: SyncCdcConnection, table: str, start: Position, budget: int | None,
         size: int, until: str | None) -> dict[str, Any]:
    cuts, current = [], start
    while budget is None or budget > 0:
        step = size if budget is None else min(size, budget)
        following, events = plan(conn, table, current, step, until)
        if following == current:
            break
        cuts.append(following)
        current = following
        if budget is not None:
            budget -= max(events, 1)
    end = current.to_json()
    end["splits"] = [c.to_json() for c in cuts[:-1]]
    return end


def same_position(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return _bare(a) == _bare(b)


# -- partitions ----------------------------------------------------------------------------

class RangePartition(InputPartition):
    """Records of one table from one position to another (``dump``: a whole dump)."""

    def __init__(self, table: str, start: dict[str, Any], end: dict[str, Any]) -> None:
        super().__init__((table, start, end))
        self.table = table
        self.start = start
        self.end = end


def partitions(start: dict[str, dict[str, Any]], end: dict[str, dict[str, Any]]
               ) -> list[RangePartition]:
    parts = []
    for table, last in end.items():
        first = start.get(table, Position().to_json())
        if same_position(first, last):
            continue
        cuts = [first, *last.get("splits", []), last]
        for a, b in itertools.pairwise(cuts):
            parts.append(RangePartition(table, _bare(a), _bare(b)))
    return parts


def _bare(position: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in position.items() if k != "splits"}


__all__ = ["DUMP", "EARLIEST", "LATEST", "Catalog", "OptionError", "Options", "RangePartition",
           "end_positions", "partitions", "same_position", "start_positions"]
