"""Fast tests of the pieces that need no server: value formats, GTIDs, grammar, config."""

from __future__ import annotations

import asyncio
import datetime as dt
import io
import itertools
import json
import socket
import threading
import time
from decimal import Decimal

import fastavro
import pytest

from cdcserver.core.changes import ColumnDef, EventType, TableLayout
from cdcserver.core.config import Config, SourceConfig, parse_source_url
from cdcserver.core.errors import ConfigError
from cdcserver.core.gtid import Gtid, GtidState
from cdcserver.core.handoff import Handoff
from cdcserver.core.names import TableName
from cdcserver.mariadb.constants import ColumnType as T
from cdcserver.protocol.framing import MessageReader
from cdcserver.replication import values
from cdcserver.store.encoder import compile_encoder, record_head, record_tail
from cdcserver.store.naming import (
    decode_identifier,
    encode_identifier,
    parse_version_file,
    version_file,
)
from cdcserver.store.schema import TableSchema
from mariadb_cdc_client.format.wire import (
    Code,
    Dialect,
    Format,
    ProtocolError,
    Registration,
    auth_message,
    parse_auth,
    parse_register,
    parse_request_data,
)

# -- binlog value formats ----------------------------------------------------------------

def test_decimal_binary_format_from_the_mysql_manual():
    # DECIMAL(14,4): the example in MySQL's strings/decimal.cc (bin2decimal).
    fmt = values.DecimalFormat(14, 4)
    assert fmt.size == 7
    assert fmt.decode(bytes.fromhex("810DFB38D204D2")) == Decimal("1234567890.1234")
    assert fmt.decode(bytes.fromhex("7EF204C72DFB2D")) == Decimal("-1234567890.1234")


def test_decimal_keeps_all_65_digits():
    fmt = values.DecimalFormat(65, 30)
    digits = "12345678901234567890123456789012345.123456789012345678901234567890"
    # Encode the way the server does: 35 integer digits are a leading group of 8 (4 bytes)
    # and three of 9; 30 fraction digits are three groups of 9 and one of 3 (2 bytes).
    intg, frac = digits.split(".")
    groups = [(4, intg[:8])] + [(4, intg[8 + 9 * i:17 + 9 * i]) for i in range(3)] + \
        [(4, frac[9 * i:9 + 9 * i]) for i in range(3)] + [(2, frac[27:])]
    assert fmt.size == 30
    raw = bytearray(b"".join(int(g).to_bytes(n, "big") for n, g in groups))
    raw[0] |= 0x80
    assert fmt.decode(bytes(raw)) == Decimal(digits)
    negative = bytes(b ^ 0xFF for b in raw)
    assert fmt.decode(negative) == Decimal("-" + digits)  # (unary minus would round to 28)


def test_temporal_formats():
    # DATETIME2(0) of 2024-01-02 03:04:05: ((2024*13+1) << 22 | 2 << 17 | hms) + 2^39
    ym, day, hms = 2024 * 13 + 1, 2, (3 << 12) | (4 << 6) | 5
    packed = ((ym << 5 | day) << 17 | hms) + 0x8000000000
    assert values.datetime2(packed.to_bytes(5, "big"), 0) == dt.datetime(2024, 1, 2, 3, 4, 5)
    assert values.datetime2((0x8000000000).to_bytes(5, "big"), 0) == "0000-00-00 00:00:00"
    assert values.datetime2((0x8000000000).to_bytes(5, "big") + b"\x00\x00\x00", 6) == \
        "0000-00-00 00:00:00.000000"
    assert values.timestamp2(b"\x00\x00\x00\x00", 0) == "0000-00-00 00:00:00"
    assert values.timestamp2((86400).to_bytes(4, "big") + (1234).to_bytes(2, "big"), 3) == \
        dt.datetime(1970, 1, 2, 0, 0, 0, 123400, tzinfo=dt.UTC)
    assert values.date_from_int((2024 << 9) | (2 << 5) | 29) == dt.date(2024, 2, 29)
    assert values.date_from_int(0) == "0000-00-00"
    assert values.date_from_int((2020 << 9) | 0) == "2020-00-00"


def test_time2_negative_and_long_values():
    def encode(sign: int, h: int, m: int, s: int, micros: int, fsp: int) -> bytes:
        intpart = (h << 12) | (m << 6) | s
        if fsp == 6:
            packed = sign * ((intpart << 24) + micros) + 0x800000000000
            return packed.to_bytes(6, "big")
        assert fsp == 0
        return (sign * intpart + 0x800000).to_bytes(3, "big")

    assert values.time2(encode(-1, 838, 59, 59, 0, 0), 0) == -dt.timedelta(hours=838,
                                                                           minutes=59, seconds=59)
    assert values.time2(encode(1, 100, 0, 1, 500000, 6), 6) == dt.timedelta(
        hours=100, seconds=1, microseconds=500000)
    assert values.time2(encode(-1, 0, 0, 1, 250000, 6), 6) == -dt.timedelta(
        seconds=1, microseconds=250000)


def test_set_and_enum_labels():
    assert values.set_labels(0b101, ("a", "b", "c")) == "a,c"
    assert values.set_labels(0, ("a",)) == ""
    assert values.enum_label(2, ("x", "y")) == "y"
    assert values.enum_label(0, ("x",)) == ""


# -- GTIDs -----------------------------------------------------------------------------

def test_gtid_states():
    state = GtidState.parse("0-1-10,2-5-7")
    assert state.covers(Gtid(0, 9, 10)) and not state.covers(Gtid(0, 1, 11))
    assert not state.covers(Gtid(1, 1, 1))
    assert str(state.advanced(Gtid(1, 3, 4))) == "0-1-10,1-3-4,2-5-7"
    assert state.minimum(GtidState.parse("0-1-8,2-5-9")) == GtidState.parse("0-1-8,2-5-7")
    assert GtidState.parse("") == GtidState() and not GtidState()
    mysql = GtidState.parse("3e11fa47-71ca-11e1-9e33-c80aa9429562:1-23")
    assert mysql.covers(Gtid.parse("3e11fa47-71ca-11e1-9e33-c80aa9429562:20"))
    with pytest.raises(ValueError):
        Gtid.parse("1-2")


# -- the wire grammar ------------------------------------------------------------------

def test_when_an_auth_message_is_only_the_start_of_one():
    from mariadb_cdc_client.format.wire import auth_incomplete

    message = auth_message("foobar", "pw")
    assert not auth_incomplete(message) and not auth_incomplete(message + b"0")
    for cut in range(1, len(message)):
        assert auth_incomplete(message[:cut]), cut
    for judged_now in (b"not hex", b"", message + b"00" * 300, b"3a" + b"00" * 21):
        assert not auth_incomplete(judged_now)


def test_auth_message_parsing_is_as_lenient_as_maxscale():
    message = b"666f6f6261723a96c86eb4479c9e3142111cf29d931bcddf248783"
    user, digest = parse_auth(message + b"\n")  # one trailing byte: ignored (odd length)
    assert user == "foobar" and len(digest) == 20
    assert parse_auth(message.upper())[0] == "foobar"
    for bad in (b"zz", b"666f6f", b"3a" + b"00" * 20):
        with pytest.raises(ProtocolError) as exc:
            parse_auth(bad)
        assert exc.value.code == Code.BAD_AUTH


def test_register_and_request_data_grammar():
    assert parse_register("REGISTER UUID=11ec2300-2e23, TYPE=AVRO") == Registration(
        "11ec2300-2e23", Format.AVRO)
    assert parse_register("register uuid=x,type=json") == Registration("x", Format.JSON)
    assert parse_register("REGISTER UUID=x, TYPE=JSON, DIALECT=EXACT") == Registration(
        "x", Format.JSON, Dialect.EXACT)
    assert parse_register("REGISTER UUID=x,TYPE=JSON,dialect=maxscale").dialect == \
        Dialect.MAXSCALE
    for bad in ("REGISTER TYPE=JSON", "REGISTER UUID=x, TYPE=JSON, DIALECT=fast",
                "REGISTER UUID=x, TYPE=JSON, DIALECT="):
        with pytest.raises(ProtocolError):
            parse_register(bad)
    request = parse_request_data("db2.table4 0-11-345")
    assert (request.database, request.table, request.version, request.gtid) == (
        "db2", "table4", None, "0-11-345")
    assert parse_request_data("dbi1.table1.000003").version == 3
    assert parse_request_data("db.t.000002").line() == "REQUEST-DATA db.t.000002"
    for bad, code in (("", Code.BAD_SYNTAX), ("db.t.3", Code.NO_FILE),
                      ("db.t x y", Code.BAD_SYNTAX), ("db.t 1-2", Code.BAD_SYNTAX),
                      ("db.t.000000", Code.NO_FILE)):
        with pytest.raises(ProtocolError) as exc:
            parse_request_data(bad)
        assert exc.value.code == code


async def _frames(chunks: list[bytes], max_line: int = 100) -> list[bytes]:
    reader = asyncio.StreamReader()
    for chunk in chunks:
        reader.feed_data(chunk)
    reader.feed_eof()
    framer = MessageReader(reader, max_line)
    out = []
    while (message := await framer.next()) is not None:
        out.append(message)
    return out


async def test_message_framing():
    assert await _frames([b"A\nB\r\nC\n"]) == [b"A", b"B", b"C"]
    assert await _frames([b"NO NEWLINE"]) == [b"NO NEWLINE"]
    with pytest.raises(ProtocolError) as exc:
        await _frames([b"x" * 200 + b"\n"])
    assert exc.value.code == Code.LINE_TOO_LONG


# -- names, config ---------------------------------------------------------------------

@pytest.mark.parametrize("name", ["orders", "my.table", "../etc", "日本語", "a b/c", "x@0041"])
def test_identifier_encoding_round_trips_and_never_contains_dots(name: str):
    encoded = encode_identifier(name)
    assert "." not in encoded and "/" not in encoded
    assert decode_identifier(encoded) == name
    table = TableName(name, "t")
    assert parse_version_file(version_file(table, 3, "avro")) == (table, 3, "avro")


def test_config_precedence_and_validation(tmp_path):
    path = tmp_path / "cdc.toml"
    path.write_text('[source]\nurl = "mysql://u@h:3307"\nserver_id = 7\n'
                    '[listener]\nlisten = "0.0.0.0:5000"\n')
    config = Config.load(str(path), {"source": {"server_id": 9}},
                         environ={"CDCSERVER_LISTENER_LISTEN": "127.0.0.1:6000"})
    assert config.source.server_id == 9 and config.source.url == "mysql://u@h:3307"
    assert config.listener.host_port() == ("127.0.0.1", 6000)
    path.write_text("[source]\nuurl = 'x'\n")
    with pytest.raises(ConfigError, match=r"source\.uurl"):
        Config.load(str(path), environ={})
    path.write_text("[store]\ncodec = 'lzma'\n")
    with pytest.raises(ConfigError, match="codec"):
        Config.load(str(path), environ={})


@pytest.mark.parametrize(("section", "key", "value", "complaint"), [
    ("listener", "timestamp_zone", "Mars/Olympus", "unknown time zone"),
    ("listener", "listen", "4001", "HOST:PORT"),
    ("metrics", "listen", "localhost", "HOST:PORT"),
    ("source", "start_gtid", "yesterday", "GTID state"),
    ("store", "flush_interval", "0", "more than 0"),
    ("listener", "max_connections", "-1", "more than 0"),
    ("kafka", "time_zone", "Nowhere", "unknown time zone"),
    ("log", "level", "loud", "one of debug, info, warning, error"),
])
def test_every_value_is_checked_when_the_configuration_loads(section, key, value, complaint):
    with pytest.raises(ConfigError, match=rf"{section}\.{key}.*{complaint}"):
        Config.load(None, {section: {key: value}}, environ={})


def test_commands_take_their_flags_from_the_configuration():
    from cdcserver.app.cli import _parser

    parser = _parser()
    args = parser.parse_args(["check", "--source", "mysql://u@h", "--server-id", "12"])
    assert vars(args)["source.url"] == "mysql://u@h" and vars(args)["source.server_id"] == 12
    args = parser.parse_args(["dump", "db.t", "--chunk-rows", "7", "--data-dir", "/d"])
    assert vars(args)["dump.chunk_rows"] == 7 and vars(args)["store.data_dir"] == "/d"
    with pytest.raises(SystemExit):  # a typed choice: argparse refuses what is not one
        parser.parse_args(["run", "--codec", "lzma"])


def test_passwords_kept_in_files(tmp_path):
    from cdcserver.core.kafkaconfig import KafkaConfig

    secret = tmp_path / "secret"
    secret.write_text("p@ss word\n")
    assert SourceConfig(url="mysql://u@h", password_file=str(secret)).address().password == \
        "p@ss word"
    assert KafkaConfig(sasl_password_file=str(secret)).sasl_password() == "p@ss word"
    with pytest.raises(ConfigError, match=r"kafka\.sasl_password_file"):
        KafkaConfig(sasl_password_file=str(tmp_path / "missing")).sasl_password()


def test_source_urls():
    address = parse_source_url("mysql://repl:p%40ss@db.example:3307")
    assert (address.user, address.password, address.host, address.port) == (
        "repl", "p@ss", "db.example", 3307)
    local = parse_source_url("mysql://root@localhost?socket=/run/mysqld.sock", "fromfile")
    assert local.unix_socket == "/run/mysqld.sock" and local.password == "fromfile"
    with pytest.raises(ConfigError):
        parse_source_url("postgres://x")


def test_several_source_urls_in_order_each_with_the_password_setting(tmp_path) -> None:
    secret = tmp_path / "pw"
    secret.write_text("s3cret\n")
    config = SourceConfig(url=" mysql://cdc@db1:3306, mysql://cdc:own%2Cpw@db2,"
                              "mariadb://cdc@localhost?socket=/run/db3.sock ",
                          password_file=str(secret))
    first, second, third = config.addresses()
    assert (first.host, first.port, first.password) == ("db1", 3306, "s3cret")
    assert (second.host, second.password) == ("db2", "own,pw")  # its own, comma encoded
    assert (third.unix_socket, third.password) == ("/run/db3.sock", "s3cret")
    assert config.address() == first
    assert len(SourceConfig(url="mysql://cdc@db1").addresses()) == 1
    with pytest.raises(ConfigError):
        SourceConfig(url="mysql://a@db1,postgres://b@db2").addresses()


# -- the Avro encoder --------------------------------------------------------------------

def test_encoder_output_reads_back_with_fastavro():
    columns = (
        ColumnDef("i", T.LONG), ColumnDef("u", T.LONGLONG, unsigned=True),
        ColumnDef("d", T.NEWDECIMAL, meta=(30 << 8) | 10), ColumnDef("f", T.FLOAT),
        ColumnDef("s", T.VARCHAR, meta=100, charset="utf-8"), ColumnDef("b", T.BLOB, meta=2),
        ColumnDef("day", T.DATE), ColumnDef("at", T.DATETIME2, meta=6),
        ColumnDef("ts", T.TIMESTAMP2, meta=3), ColumnDef("t", T.TIME2, meta=2),
        ColumnDef("bit1", T.BIT, meta=1), ColumnDef("bits", T.BIT, meta=(8 << 8)),
    )
    schema = TableSchema.from_layout(TableLayout("d", "t", columns), 1, "0-1-1")
    encode = compile_encoder(schema.columns, columns)
    rows = [
        (-(2**31), 2**64 - 1, Decimal("-12345678901234567890.0123456789"), 0.5, "héllo 🎉",
         b"\x00\xff", dt.date(1000, 1, 1), dt.datetime(9999, 12, 31, 23, 59, 59, 999999),
         dt.datetime(2038, 1, 19, 3, 14, 8, 1000, tzinfo=dt.UTC),
         -dt.timedelta(hours=838, minutes=59, seconds=59), 1, 2**63 + 5),
        (None,) * 12,
        (0, 0, Decimal("0E-10"), -0.0, "", b"", "0000-00-00", "2020-00-01 00:00:00.000000",
         "0000-00-00 00:00:00.000", dt.timedelta(hours=23, microseconds=990000), 0, 0),
    ]
    out = bytearray()
    tails = (record_tail(1700000000, EventType.INSERT), record_tail(1700000000, EventType.INSERT))
    assert encode(out, record_head(0, 1, 2**40), tails, rows, 1) == 4
    parsed = fastavro.parse_schema(schema.avsc)
    data = io.BytesIO(bytes(out))
    decoded = [fastavro.schemaless_reader(data, parsed, None) for _ in rows]
    assert data.read() == b""
    first = decoded[0]
    assert first["sequence"] == 2**40 and first["event_number"] == 1
    assert (first["i"], first["u"], first["d"], first["s"], first["b"]) == (
        -(2**31), Decimal(2**64 - 1), Decimal("-12345678901234567890.0123456789"), "héllo 🎉",
        b"\x00\xff")
    assert first["day"] == dt.date(1000, 1, 1)
    assert first["at"] == dt.datetime(9999, 12, 31, 23, 59, 59, 999999)
    assert first["ts"] == dt.datetime(2038, 1, 19, 3, 14, 8, 1000, tzinfo=dt.UTC)
    assert first["t"] == "-838:59:59.00"
    assert (first["bit1"], first["bits"]) == (True, Decimal(2**63 + 5))
    assert all(v is None for k, v in decoded[1].items() if k in [c.name for c in columns])
    third = decoded[2]
    assert (third["day"], third["at"], third["ts"]) == (
        "0000-00-00", "2020-00-01 00:00:00.000000", "0000-00-00 00:00:00.000")
    assert third["t"] == dt.time(23, 0, 0, 990000)


# -- the hand-off ----------------------------------------------------------------------

async def test_handoff_blocks_the_producer_when_full_and_delivers_in_order():
    handoff = Handoff(asyncio.get_running_loop(), capacity=10)
    produced = threading.Event()

    def produce() -> None:
        for i in range(50):
            handoff.put([i], weight=4)  # type: ignore[list-item]
        handoff.finish()
        produced.set()

    thread = threading.Thread(target=produce)
    thread.start()
    seen: list[int] = []
    most_in_flight = 0
    while batches := await handoff.get():
        most_in_flight = max(most_in_flight, len(batches))
        seen.extend(b[0] for b in batches)  # type: ignore[misc]
    thread.join()
    assert seen == list(range(50)) and produced.is_set()
    assert most_in_flight <= 3  # 3 x 4 > capacity 10: never more than fits


async def test_handoff_says_whether_a_batch_waits():
    """What the pipeline asks before it holds the stream's last transaction for a repair."""
    handoff = Handoff(asyncio.get_running_loop(), capacity=10)
    assert not handoff.waiting
    handoff.put([1], weight=4)  # type: ignore[list-item]
    assert handoff.waiting
    assert await handoff.get() == [[1]] and not handoff.waiting
    handoff.finish()
    assert handoff.waiting  # the stream ended: nothing more will come to wait for


def test_replication_starts_at_the_earliest_sink_checkpoint():
    from dataclasses import dataclass as dc

    from cdcserver.core.gtid import BinlogPosition
    from cdcserver.sinks.pipeline import start_position

    @dc
    class _Sink:
        durable: BinlogPosition | None

    behind = BinlogPosition(GtidState.parse("0-1-5,1-2-9"), "bin.000003", 400)
    ahead = BinlogPosition(GtidState.parse("0-1-8,1-2-9"), "bin.000004", 4)
    default = BinlogPosition(GtidState(), "bin.000001", 4)
    start = start_position([_Sink(ahead), _Sink(behind)], default)  # type: ignore[list-item]
    assert start == BinlogPosition(GtidState.parse("0-1-5,1-2-9"), "bin.000003", 400)
    # A sink with no checkpoint yet starts where configured, and so everything does.
    assert start_position([_Sink(ahead), _Sink(None)], default).gtid_state == GtidState()  # type: ignore[list-item]


def test_after_dump_and_list_dumps_grammar():
    from mariadb_cdc_client.format.wire import parse_list_dumps, parse_request_dump

    request = parse_request_data("db.t AFTER 0-1-5,3-2-9")
    assert request.after == "0-1-5,3-2-9" and request.gtid is None
    assert request.line() == "REQUEST-DATA db.t AFTER 0-1-5,3-2-9"
    assert parse_request_data("db.t.000002 after 0-1-5").version == 2
    mysql = "3e11fa47-71ca-11e1-9e33-c80aa9429562:1-57"
    assert parse_request_data(f"db.t AFTER {mysql}").after == mysql
    for bad in ("db.t AFTER", "db.t AFTER 0-1", "db.t AFTER 0-1-5 x", "db.t BEFORE 0-1-5"):
        with pytest.raises(ProtocolError) as info:
            parse_request_data(bad)
        assert info.value.code == Code.BAD_SYNTAX, bad
    dump = parse_request_dump("shop.orders FOLLOW")
    assert dump.follow and dump.table == ("shop", "orders")
    named = parse_request_dump("shop.orders.20261121T093000-123456Z.dump")
    assert not named.follow and named.table is None
    for bad, code in (("", Code.BAD_SYNTAX), ("a.b c", Code.BAD_SYNTAX),
                      ("../x.dump", Code.NO_FILE), ("a.b.000001", Code.NO_FILE)):
        with pytest.raises(ProtocolError) as info:
            parse_request_dump(bad)
        assert info.value.code == code, bad
    assert parse_list_dumps("") is None and parse_list_dumps("a.b") == ("a", "b")


def test_resuming_after_a_gtid_state_is_exact_in_every_domain():
    """A stream AFTER a state, cut after any record and resumed (the server filtering with
    its real AFTER filter), delivers every record exactly once, across domains."""
    from cdcserver.protocol.filters import After
    from mariadb_cdc_client.resume import Resume
    from mariadb_cdc_client.stream import ChangeRecord, SchemaChange

    def record(domain: int, seq: int, event: int) -> ChangeRecord:
        return ChangeRecord("db", "t", 3, domain, 1, seq, event, 0, "insert", {"n": seq})

    stored = [record(0, 100, 1), record(0, 101, 1), record(0, 101, 2), record(7, 51, 1),
              record(0, 102, 1), record(0, 103, 1), record(0, 103, 2), record(7, 52, 1)]
    schema = SchemaChange("db", "t", 3, "0-1-1", {}, ())

    def served(after: str) -> list[ChangeRecord]:
        wanted = After.parse(after)
        return [r for r in stored if wanted.accepts({"domain": r.domain,
                                                       "sequence": r.sequence})]

    for cut in range(1, len(stored) + 1):
        resume = Resume(3, None, "0-1-100,7-1-50")
        delivered = []
        first = served("0-1-100,7-1-50")
        for event in [schema, *first[:cut]]:
            if resume.accept(event) and isinstance(event, ChangeRecord):
                delivered.append(event)
        version, gtid, after = resume.request()
        assert version == 3 and gtid is None and after is not None
        for event in [schema, *served(after)]:
            if resume.accept(event) and isinstance(event, ChangeRecord):
                delivered.append(event)
        assert delivered == stored[1:], cut  # 0-1-100 was in the state already


def test_an_after_state_for_a_mysql_source_resumes_by_its_uuid():
    from mariadb_cdc_client.resume import Resume
    from mariadb_cdc_client.stream import ChangeRecord

    uuid = "3e11fa47-71ca-11e1-9e33-c80aa9429562"
    resume = Resume(None, None, f"{uuid}:1-57")
    resume.accept(ChangeRecord("db", "t", 1, 0, 1, 58, 1, 0, "insert", {}))
    assert resume.request() == (None, None, f"{uuid}:57")
    resume.accept(ChangeRecord("db", "t", 1, 0, 1, 59, 1, 0, "insert", {}))
    assert resume.request() == (None, None, f"{uuid}:58")


def test_durations_and_sizes_in_the_configuration():
    config = Config.load(overrides={"retention": {"dumps_max_age": "1.5h",
                                                  "dumps_max_bytes": "2GiB"},
                                    "dump": {"interval": "90"}})
    assert config.retention.dumps_max_age == 5400
    assert config.retention.dumps_max_bytes == 2 << 30 and config.dump.interval == 90
    with pytest.raises(ConfigError, match="dumps_max_age"):
        Config.load(overrides={"retention": {"dumps_max_age": "soon"}})


def test_dump_values_encode_and_decode_to_the_stream_types():
    from mariadb_cdc_client.format.dump import decode_value, encode_value
    from mariadb_cdc_client.format.schema import Field, Kind

    cases = [
        (Field("d", Kind.DECIMAL, "d", scale=2), Decimal("-12.50")),
        (Field("f", Kind.FLOAT, "f"), 1.100000023841858),
        (Field("t", Kind.TIMESTAMP, "t", fsp=6),
         dt.datetime(2024, 1, 2, 3, 4, 5, 600, tzinfo=dt.UTC)),
        (Field("m", Kind.TIME, "m", fsp=3), -dt.timedelta(hours=838, milliseconds=5)),
        (Field("b", Kind.BYTES, "b"), b"\x00\xff"),
        (Field("n", Kind.LONG, "n"), -(2**63)),
        (Field("y", Kind.BOOLEAN, "y"), True),
        (Field("z", Kind.DATE, "z"), "0000-00-00"),
    ]
    for f, value in cases:
        assert decode_value(f, encode_value(f, value)) == value, f.name


def test_the_compiled_dump_row_path_writes_the_same_bytes_as_the_python_one() -> None:
    """cdcserver/dump/_rawrows.pyx against rawrows._row, on random row packets: every
    length-prefix width, NULLs, empty values and every base64 padding. (tests/run.sh builds
    the extension; without it this says so rather than passing.)"""
    import os
    import random

    from cdcserver.dump import rawrows

    assert rawrows.compiled is not None, "the C extension was not built (pip install -e .)"
    rnd = random.Random(1)

    def prefixed(n: int) -> bytes:
        if n < 0xFB:
            return bytes([n])
        width = 2 if n < 1 << 16 else 3 if n < 1 << 24 else 8
        return bytes([{2: 0xFC, 3: 0xFD, 8: 0xFE}[width]]) + n.to_bytes(width, "little")

    for _ in range(2000):
        columns = rnd.randint(1, 8)
        payload = b"".join(b"\xfb" if rnd.random() < 0.2 else
                           prefixed(n := rnd.choice([0, 1, 2, 3, 4, 250, 251, 300, 70000]))
                           + os.urandom(n) for _ in range(columns))
        assert rawrows.compiled.encode_row(payload, columns) == \
            rawrows._row(memoryview(payload), columns)
    with pytest.raises(ValueError, match="after its 1 columns"):
        rawrows.compiled.encode_row(b"\x01ab", 1)

    # whole insert lines, encoded without the GIL: the same as the rows joined in Python,
    # whatever the buffer's end cuts off (a packet cut short waits for more)
    for _ in range(200):
        columns = rnd.randint(1, 6)
        rows, packets = [], bytearray()
        for _ in range(rnd.randint(1, 40)):
            payload = b"".join(b"\xfb" if rnd.random() < 0.2 else
                               prefixed(n := rnd.choice([0, 1, 2, 3, 250, 251, 300]))
                               + os.urandom(n) for _ in range(columns))
            packets += len(payload).to_bytes(3, "little") + b"\x00" + payload
            rows.append(rawrows._row(memoryview(payload), columns))
        packets += b"\x05\x00\x00\x00\xfe\x00\x00\x02\x00"  # the result's end
        batch = rnd.randint(1, 50)
        received = sorted(rnd.sample(range(1, len(packets)), min(3, len(packets) - 1)))
        pos, lines, counts, state = 0, [], 0, None
        for end in [*received, len(packets)]:
            state, pos, data, count, last = rawrows.compiled.parse_lines(packets, pos, end,
                                                                         columns, batch)
            if data is not None:
                lines.append(data)
                counts += count
                assert data[last:-3] == rows[counts - 1]
            if state != rawrows.compiled.NEED_MORE:
                break
        assert state == rawrows.compiled.END and counts == len(rows)
        expected = [rawrows.INSERT_PREFIX + b",".join(rows[i:i + batch]) + b"]}\n"
                    for i in range(0, len(rows), batch)]
        # the pieces may cut lines differently where the data ended, never a row in two
        assert b"".join(lines).replace(b"]}\n" + rawrows.INSERT_PREFIX, b",") == \
            b"".join(expected).replace(b"]}\n" + rawrows.INSERT_PREFIX, b",")
        assert all(piece.startswith(rawrows.INSERT_PREFIX) and piece.endswith(b"]}\n")
                   for data in lines for piece in data.splitlines(keepends=True))
        assert all(piece.count(b"],[") < batch for data in lines
                   for piece in data.splitlines(keepends=True))
    with pytest.raises(ValueError, match="outside the buffer"):
        rawrows.compiled.parse_lines(b"abc", 0, 4, 1, 1)


def test_a_chunked_dump_buffer_spills_to_a_file_and_drains_in_order(tmp_path) -> None:
    """What a reader holds before its range's turn: pieces in memory, then a temporary file
    past its limit; drained in the order written, empty after."""
    from cdcserver.dump.rangebuffer import RangeBuffer

    buffer = RangeBuffer(10, str(tmp_path))
    pieces = [b"abc", b"defgh", b"ijklmnop", b"q"]  # the third passes the limit
    for piece in pieces:
        buffer.write(piece)
    assert buffer.tell() == 17 and buffer.spill is not None and not buffer.pieces
    out: list[bytes] = []
    buffer.drain(out.append)
    assert b"".join(out) == b"".join(pieces) and buffer.tell() == 0
    buffer.write(b"rs")  # in memory again
    out.clear()
    buffer.drain(out.append)
    assert out == [b"rs"] and buffer.spill is None
    buffer.close()


def test_several_service_endpoints_and_when_to_wait() -> None:
    from mariadb_cdc_client.endpoints import Endpoints, parse_endpoints

    assert parse_endpoints("cdc1, cdc2:4002,[::1]:4003,::1", 4001) == [
        ("cdc1", 4001), ("cdc2", 4002), ("::1", 4003), ("::1", 4001)]
    with pytest.raises(ValueError, match="HOST:PORT"):
        parse_endpoints("cdc1:http", 4001)
    with pytest.raises(ValueError, match="no server"):
        parse_endpoints(" , ", 4001)
    endpoints = Endpoints.of("a,b,c", 1)
    # a failure moves to the next at once; a wait only after every one failed in a row
    assert [endpoints.failed() for _ in range(6)] == [False, False, True] * 2
    assert endpoints.current == ("a", 1)
    endpoints.failed()
    endpoints.succeeded()  # b delivered: a new round starts from it
    assert [endpoints.failed() for _ in range(3)] == [False, False, True]
    assert Endpoints.of("solo", 9).failed() is True  # one instance: always back off


def test_writers_past_the_open_file_limit_are_parked_and_reopen_to_write(tmp_path) -> None:
    """At most ``limit`` table files stay open; a parked one reopens to write, fsyncs by
    opening its file, and rolls back as before."""
    import json as _json
    import os

    from cdcserver.store.avrofile import OpenFiles, VersionFileWriter

    schema = _json.dumps({"type": "record", "name": "r", "fields": [{"name": "b",
                                                                     "type": "bytes"}]})
    files = OpenFiles(2)
    writers = [VersionFileWriter.create(str(tmp_path / f"w{i}.avro"), schema, "null", files)
               for i in range(4)]
    assert [w.fd >= 0 for w in writers] == [False, False, True, True] and len(files) == 2
    first = writers[0]
    first.buffer += b"\x02ab"
    first.count = 1
    first.commit()  # reopens it; the least recently used open one (w2) is parked
    assert first.fd >= 0 and writers[2].fd < 0 and len(files) == 2
    assert os.path.getsize(first.path) == first.size == first.committed
    writers[2].fsync()  # parked and dirty: made durable through its path
    assert writers[2].fd < 0
    writers[1].buffer += b"\x02cd"
    writers[1].count = 1
    writers[1].end_block()
    grown = writers[1].size
    writers[1].park()
    writers[1].rollback()  # cut back to what was committed, reopening to do it
    assert grown > writers[1].size == writers[1].committed == os.path.getsize(writers[1].path)
    for writer in writers:
        writer.close()
    assert len(files) == 0


# -- the replication connection's packet reader ----------------------------------------------

def _framed(payload: bytes, seq: int = 0) -> bytes:
    """MySQL packets for one payload: 16 MiB - 1 pieces, then the rest (maybe empty)."""
    out = bytearray()
    for start in range(0, len(payload) + 1, 0xFFFFFF):
        piece = payload[start:start + 0xFFFFFF]
        out += len(piece).to_bytes(3, "little") + bytes([seq % 256]) + piece
        seq += 1
        if len(piece) < 0xFFFFFF:
            break
    return bytes(out)


class _PymysqlStandIn:  # the members the reader takes from pymysql's connection
    def __init__(self, sock: socket.socket, read_timeout: float | None = None) -> None:
        self._sock = sock
        self._rfile = sock.makefile("rb")
        self._read_timeout = read_timeout
        self._current_timeout = None  # what pymysql's last write left: its write_timeout


def test_the_packet_reader_frames_joins_and_ends_like_pymysql():
    from cdcserver.replication.connection import _Packets

    payloads = [b"\x00" + bytes([i % 251]) * size
                for i, size in enumerate([0, 10, 4000, 70_000, 1 << 20, 0xFFFFFF - 1,
                                          0xFFFFFF, 20 << 20, 3])]
    wire = b"".join(_framed(p) for p in payloads) + _framed(b"\xfe\x00\x00\x02\x00")
    here, there = socket.socketpair()
    with here, there:
        cuts = [*range(0, len(wire), 65_531), len(wire)]  # packets cut anywhere
        sender = threading.Thread(target=lambda: [there.sendall(wire[a:b])
                                                  for a, b in itertools.pairwise(cuts)])
        sender.start()
        try:
            got = list(_Packets(_PymysqlStandIn(here)))
        finally:
            sender.join()
    assert [len(p) for p in got] == [len(p) for p in payloads] and got == payloads


def test_the_packet_reader_raises_the_servers_error_and_a_closed_connection():
    from cdcserver.core.errors import BinlogPurged, SourceUnavailable
    from cdcserver.replication.connection import _Packets

    error = b"\xff" + (1236).to_bytes(2, "little") + b"#HY000" + \
        b"Could not find GTID state requested by slave in any binlog files"
    here, there = socket.socketpair()
    with here, there:
        there.sendall(_framed(b"\x00event") + _framed(error))
        packets = iter(_Packets(_PymysqlStandIn(here)))
        assert next(packets) == b"\x00event"
        with pytest.raises(BinlogPurged, match="1236"):
            next(packets)
    here, there = socket.socketpair()
    with here:
        there.sendall(_framed(b"\x00event")[:7])
        there.close()
        with pytest.raises(SourceUnavailable, match="closed"):
            list(_Packets(_PymysqlStandIn(here)))


def test_the_packet_reader_gives_up_on_a_source_that_went_silent():
    # pymysql applies read_timeout only in its own reader; its last write (the dump
    # command) leaves the socket waiting for ever, so a partitioned or half-open source
    # went unnoticed until the reader applied the timeout itself.
    from cdcserver.core.errors import SourceUnavailable
    from cdcserver.replication.connection import _Packets

    here, there = socket.socketpair()
    with here, there:
        here.settimeout(None)
        there.sendall(_framed(b"\x00event"))
        packets = iter(_Packets(_PymysqlStandIn(here, read_timeout=0.3)))
        assert next(packets) == b"\x00event"
        started = time.monotonic()
        with pytest.raises(SourceUnavailable, match=r"not even a heartbeat, for 0\.3 s"):
            next(packets)
        assert time.monotonic() - started < 5




# -- UTF-8 validity in the C paths ------------------------------------------------------------

def _string_block(values: list[bytes]) -> bytes:
    from cdcserver.store.encoder import varint

    return b"".join(b"\x02" + varint(len(v)) + v for v in values)  # union branch 1: string


@pytest.mark.parametrize("bad", [b"\xff", b"\xc3", b"\xc0\xaf", b"\xed\xa0\x80",
                                 b"\xf4\x90\x80\x80", b"\xe2\x82", b"\x80"])
def test_the_c_renderer_refuses_invalid_utf8_at_every_offset_and_renders_valid_text(bad):
    """Invalid sequences after 0 to 17 ASCII bytes (the validator reads eight ASCII bytes at a
    time, then byte by byte): the C renderer leaves the block to Python (None), exactly as
    Python's strict decoder refuses it; valid text with the same prefixes renders as the
    Python renderer does."""
    from cdcserver.protocol.render import compile_block_renderer, compile_renderer
    from cdcserver.store import transcoder

    if not transcoder.available():
        pytest.skip("the compiled extensions are not built (or CDC_PURE_PYTHON is set)")
    schema = json.dumps({"type": "record", "name": "t", "database": "db", "table": "t",
                         "version": 1, "fields": [{"name": "s", "type": ["null", "string"]}]})
    renderer = compile_block_renderer(schema)
    assert renderer is not None
    render = compile_renderer(schema)
    for prefix in range(18):
        for suffix in (b"", b"abc", b"a" * 9):
            value = b"x" * prefix + bad + suffix
            with pytest.raises(UnicodeDecodeError):
                value.decode("utf-8")
            assert renderer.render(_string_block([value]), 1) is None, (prefix, suffix)
            for good in ("é", "€", "🎉", "plain"):
                text = "x" * prefix + good + suffix.decode()
                block = _string_block([b"ok", text.encode()])
                assert renderer.render(block, 2) == render({"s": "ok"}) + render({"s": text})


def test_the_maxscale_dialect_writes_no_err_and_no_brace_in_strings_c_and_python_alike():
    """Every way ``err`` can be written (any case, at a value's start and end, overlapping,
    beside braces and escapes, the ``e`` an escape's last hex digit: ``\\u001e``), and a key
    holding it: the C renderer writes what the
    Python renderer does, the JSON is the same value, and the bytes hold neither the
    letters in any case nor a brace inside a string. A value in pieces (bigjson) too, cut
    at every place."""
    from cdcserver.protocol.bigjson import _escaper
    from cdcserver.protocol.dialect import JsonStyle, maxscale_safe
    from cdcserver.protocol.render import compile_block_renderer, compile_renderer
    from cdcserver.store import transcoder
    from mariadb_cdc_client.format.wire import Dialect

    style = JsonStyle(Dialect.MAXSCALE)
    texts = ["err", "ERR", "eRr", "Err", "eerr", "errr", "xerrx", "e", "er", "rr", "e\\rr",
             "e\nrr", "{err}", "é€err🎉", "Terrace", "server error", "ERROR_code", "",
             "\x1err", "\x0eRR", "\x1er", "r\x1e", "\x1e\x0err", "\x1eR" + "r" * 5]
    texts += [a + b for a, b in itertools.product(["e", "E", "er", "x"], ["rr", "r", "R!"])]
    schema = json.dumps({"type": "record", "name": "t", "database": "db", "table": "t",
                         "version": 1, "fields": [{"name": "error", "type": ["null", "string"]}]})
    render = compile_renderer(schema, style)
    lines = b"".join(render({"error": t}) for t in texts)
    assert "err" not in lines.decode().lower() and b'"er\\u0072or": ' in lines
    assert [json.loads(line)["error"] for line in lines.splitlines()] == texts
    assert all("{" not in line[1:-1] and "}" not in line[1:-1]
               for line in lines.decode().splitlines())
    if transcoder.available():
        renderer = compile_block_renderer(schema, style)
        assert renderer is not None
        assert renderer.render(_string_block([t.encode() for t in texts]), len(texts)) == lines
    for text in texts:
        whole = maxscale_safe(json.dumps(text, ensure_ascii=False))[1:-1]
        for cut in range(len(text) + 1):
            escape = _escaper(style)
            assert escape(text[:cut]) + escape(text[cut:]) == whole, (text, cut)


def test_a_rename_stored_by_0_1_0_is_sent_as_a_reference_a_client_can_request():
    """0.1.0 stored a rename's other name unquoted (``shop.my table``, which REQUEST-DATA
    refuses); the schema line names it as a reference in both dialects."""
    from cdcserver.protocol.dialect import schema_line
    from mariadb_cdc_client.format.names import parse_table
    from mariadb_cdc_client.format.wire import Dialect

    avsc = {"type": "record", "name": "ChangeRecord", "fields": [],
            "ddl": {"kind": "create", "statement": "RENAME TABLE `my table` TO t",
                    "note": "renamed from shop.my table", "renamed_from": "shop.my table"}}
    for dialect in (Dialect.EXACT, Dialect.MAXSCALE):
        ddl = json.loads(schema_line(avsc, (), dialect))["ddl"]
        assert ddl["renamed_from"] == "shop.`my table`"
        assert (parse_table(ddl["renamed_from"]).database,
                parse_table(ddl["renamed_from"]).table) == ("shop", "my table")
    assert avsc["ddl"]["renamed_from"] == "shop.my table"  # (the stored schema is left alone)


# -- the client's framing of a bounded AVRO read ----------------------------------------------

def test_a_bounded_avro_reply_split_anywhere_frames_into_the_same_schemas_and_blocks():
    """Three versions' container files (header, many small blocks; the third one block of
    over 200 KB, bigger than a receive buffer) and the end line, fed in pieces cut at random:
    every chunk holds whole blocks, in order, byte for byte, with their record counts; each
    version's schema comes before its blocks; and the chunks given out stay intact while
    the rest is received (each is a view of the buffer it arrived in)."""
    import random

    from mariadb_cdc_client.format.avro import parse_header
    from mariadb_cdc_client.ranges import Blocks, Schema, _BoundedStream

    def container(version: int, rows: int, width: int = 50, interval: int = 300
                  ) -> tuple[bytes, int]:
        schema = {"type": "record", "name": "t", "version": version,
                  "fields": [{"name": "id", "type": "long"}, {"name": "s", "type": "string"}]}
        out = io.BytesIO()
        fastavro.writer(out, schema, ({"id": i, "s": "x" * (i % width)} for i in range(rows)),
                        sync_interval=interval)
        data = out.getvalue()
        return data, parse_header(data).size

    versions = [container(1, 700), container(2, 300),
                container(3, 1000, width=600, interval=1 << 20)]
    reply = b"".join(data for data, _ in versions) + b'{"end": "0-1-9", "records": 2000}\n'
    rng = random.Random(5)
    for chunk_size in (1, 4096, 1 << 20):
        cuts = sorted(rng.sample(range(1, len(reply)), 60))
        stream, items = _BoundedStream(chunk_size), []
        for a, b in zip([0, *cuts], [*cuts, len(reply)], strict=True):
            items.extend(stream.feed(reply[a:b]))
        assert stream.end == {"end": "0-1-9", "records": 2000}
        schemas = [i for i in items if isinstance(i, Schema)]
        assert [s.avsc["version"] for s in schemas] == [1, 2, 3]
        ats = [items.index(s) for s in schemas] + [len(items)]
        blocks = [[i for i in items[a:b] if isinstance(i, Blocks)]
                  for a, b in itertools.pairwise(ats)]
        for part, (data, head) in zip(blocks, versions, strict=True):
            assert b"".join(b.data for b in part) == data[head:]
        assert [sum(b.count for b in part) for part in blocks] == [700, 300, 1000]
        assert len(blocks[2]) == 1 and len(blocks[2][0].data) > 200_000
        if chunk_size == 1:
            assert len(blocks[0]) > 5  # chunks are cut at whole blocks past the size

    # a reader that lets each chunk go: the same few buffers are received into again
    stream, data, buffers, chunks = _BoundedStream(4096), bytearray(), {}, 0
    for a in range(0, len(reply), 5000):
        for item in stream.feed(reply[a:a + 5000]):
            if isinstance(item, Blocks):
                assert isinstance(item.data, memoryview)
                buffers[id(item.data.obj)] = item.data.obj  # the buffer, not a view of it
                data += item.data
                item.data.release()
                chunks += 1
    assert data == b"".join(d[head:] for d, head in versions)
    assert chunks > 8 and len(buffers) <= 3
