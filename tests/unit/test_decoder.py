"""The event decoder on built binlog events: MySQL's flavor (no MySQL server can be installed
here), compressed MySQL transactions, binary JSON, and the guards that stop replication."""

from __future__ import annotations

import struct

import pytest

from cdcserver.core.changes import Abort, Begin, Commit, Ddl, Rows
from cdcserver.core.errors import UndecodableEvent
from cdcserver.core.gtid import Gtid, GtidState
from cdcserver.mariadb.charsets import CollationTable
from cdcserver.mariadb.constants import ColumnType as T
from cdcserver.replication.decoder import EventDecoder
from cdcserver.replication.mysqljson import binary_json_to_text
from cdcserver.schema.history import SchemaHistory
from tests.binlog_builder import Builder

UUID = "3e11fa47-71ca-11e1-9e33-c80aa9429562"
INT_COLUMN = (T.LONG, b"", "id")


def _decode(packets: list[bytes], *, history: SchemaHistory | None = None,
            start: GtidState | None = None) -> tuple[EventDecoder, list[object]]:
    decoder = EventDecoder(CollationTable.defaults(), start or GtidState(), checksums=True,
                           history=history)
    out: list[object] = []
    for packet in packets:
        decoder.feed(packet, out)  # type: ignore[arg-type]
    return decoder, out


def _row(*ints: int) -> bytes:
    return bytes((len(ints) + 7) // 8) + b"".join(struct.pack("<i", i) for i in ints)


def _mysql_prelude(b: Builder) -> list[bytes]:
    return [b.rotate("binlog.000007"), b.format_description()]


def test_a_mysql_transaction_gtid_begin_rows_xid():
    b = Builder(mariadb=False)
    packets = [*_mysql_prelude(b), b.mysql_gtid(UUID, 42), b.query("BEGIN"),
               b.table_map(7, "db", "t", [INT_COLUMN]), b.write_rows(7, 1, [_row(5)], v2=True),
               b.xid()]
    decoder, out = _decode(packets)
    begin, rows, commit = out
    assert isinstance(begin, Begin) and begin.gtid == Gtid(0, 1, 42, UUID)
    assert isinstance(rows, Rows) and rows.rows == [(5,)]
    assert isinstance(commit, Commit) and commit.position.file == "binlog.000007"
    assert commit.position.pos == b.pos
    assert str(commit.position.gtid_state) == f"{UUID}:1-42"
    assert decoder.mariadb is False


def test_mysql_anonymous_gtids_are_numbered_by_position():
    b = Builder(mariadb=False)
    prelude = _mysql_prelude(b)
    at = b.pos  # where the transaction starts
    gtid_event = b.mysql_gtid("", 0, anonymous=True)
    packets = [*prelude, gtid_event, b.query("BEGIN"), b.table_map(7, "db", "t", [INT_COLUMN]),
               b.write_rows(7, 1, [_row(1)], v2=True), b.xid()]
    _, out = _decode(packets)
    begin = out[0]
    assert isinstance(begin, Begin) and begin.gtid.sequence == (7 << 32) | at


def test_mysql_ddl_is_a_transaction_of_its_own():
    b = Builder(mariadb=False)
    packets = [*_mysql_prelude(b), b.mysql_gtid(UUID, 9),
               b.query("CREATE TABLE t (id INT PRIMARY KEY, j JSON)")]
    _, out = _decode(packets, history=SchemaHistory(None))
    begin, ddl, commit = out
    assert isinstance(begin, Begin) and begin.standalone
    assert isinstance(ddl, Ddl) and ddl.kind == "create" and ddl.changes[0].table == "t"
    assert isinstance(commit, Commit)


@pytest.mark.parametrize("zstd", [True, False])
def test_mysql_compressed_transaction_payload(zstd: bool):
    b = Builder(mariadb=False)
    prelude = [*_mysql_prelude(b), b.mysql_gtid(UUID, 3)]
    inner = [b.query("BEGIN", inner=True, log_pos=0),
             b.table_map(7, "db", "t", [INT_COLUMN], inner=True, log_pos=0),
             b.write_rows(7, 1, [_row(1), _row(2)], v2=True, inner=True, log_pos=0),
             b.xid(inner=True, log_pos=0)]
    payload = b.transaction_payload(inner, zstd=zstd)
    _, out = _decode([*prelude, payload])
    assert [type(c).__name__ for c in out] == ["Begin", "Rows", "Commit"]
    assert out[1].rows == [(1,), (2,)]  # type: ignore[attr-defined]
    assert out[2].position.pos == b.pos  # type: ignore[attr-defined]  # after the payload


def test_year_counts_in_mariadb_signedness_only():
    columns = [(T.YEAR, b"", "y"), (T.LONG, b"", "a"), (T.LONG, b"", "b")]
    for mariadb, flags in ((True, [True, False, True]), (False, [False, True])):
        b = Builder(mariadb=mariadb)
        prelude = [b.rotate("bin.000001"), b.format_description()]
        gtid = b.mariadb_gtid(0, 1) if mariadb else b.mysql_gtid(UUID, 1)
        rows = bytes(1) + bytes([24]) + struct.pack("<i", -1) + struct.pack("<I", 4294967295)
        packets = [*prelude, gtid, *([] if mariadb else [b.query("BEGIN")]),
                   b.table_map(3, "db", "t", columns, unsigned=flags),
                   b.write_rows(3, 3, [rows], v2=not mariadb), b.xid()]
        _, out = _decode(packets)
        assert out[1].rows == [(1924, -1, 4294967295)], mariadb  # type: ignore[attr-defined]


def _rollback_group(b: Builder) -> list[bytes]:
    return [b.rotate("bin.000001"), b.format_description(), b.mariadb_gtid(0, 5),
            b.table_map(3, "db", "t", [INT_COLUMN]), b.write_rows(3, 1, [_row(1)], v2=False),
            b.query("ROLLBACK")]


def test_a_rollback_of_transactional_rows_discards_them_and_advances():
    history = SchemaHistory(None)
    history.apply("CREATE TABLE t (id INT) ENGINE=InnoDB", "db", None)
    decoder, out = _decode(_rollback_group(Builder(mariadb=True)), history=history)
    assert [type(c).__name__ for c in out] == ["Begin", "Rows", "Abort", "Begin", "Commit"]
    assert isinstance(out[2], Abort)
    assert decoder.gtid_state.covers(Gtid(0, 1, 5))


def test_a_rollback_of_rows_not_known_transactional_reads_their_table_again():
    history = SchemaHistory(None)
    history.apply("CREATE TABLE t (id INT) ENGINE=MyISAM", "db", None)
    decoder, out = _decode(_rollback_group(Builder(mariadb=True)), history=history)
    assert [type(c).__name__ for c in out] == ["Begin", "Rows", "Abort", "Begin", "Rowless",
                                               "Commit"]
    assert (out[4].database, out[4].table) == ("db", "t")  # type: ignore[union-attr]
    assert decoder.gtid_state.covers(Gtid(0, 1, 5))


def test_unknown_events_stop_replication_unless_ignorable():
    b = Builder(mariadb=True)
    prelude = [b.rotate("bin.000001"), b.format_description()]
    _, out = _decode([*prelude, b.event(0x7F, b"whatever", flags=0x80)])
    assert out == []
    with pytest.raises(UndecodableEvent, match="unknown binlog event type 0x7f"):
        _decode([*prelude, b.event(0x7F, b"whatever")])


def test_a_corrupt_event_fails_its_checksum():
    b = Builder(mariadb=True)
    packets = [b.rotate("bin.000001"), b.format_description(), b.mariadb_gtid(0, 1)]
    packets[-1] = packets[-1][:-6] + b"\xff" + packets[-1][-5:]
    with pytest.raises(UndecodableEvent, match="checksum mismatch"):
        _decode(packets)


def test_missing_names_without_history_stop_replication():
    b = Builder(mariadb=True)
    packet = b.table_map(3, "db", "t", [INT_COLUMN])
    named = packet[: -len(b"\x04\x03\x02id") - 4]  # drop the COLUMN_NAME field and the CRC
    import zlib

    unnamed_event = named[1:]
    size = len(unnamed_event) + 4
    unnamed_event = unnamed_event[:9] + size.to_bytes(4, "little") + unnamed_event[13:]
    unnamed = b"\x00" + unnamed_event + (zlib.crc32(unnamed_event) & 0xFFFFFFFF).to_bytes(4,
                                                                                          "little")
    with pytest.raises(UndecodableEvent, match="binlog_row_metadata=FULL"):
        _decode([b.rotate("bin.000001"), b.format_description(), b.mariadb_gtid(0, 1), unnamed])
    history = SchemaHistory(None)
    history.apply("CREATE TABLE t (id INT)", "db", None)
    _, out = _decode([b.rotate("bin.000001"), b.format_description(), b.mariadb_gtid(0, 2),
                      unnamed, b.write_rows(3, 1, [_row(9)], v2=False), b.xid()],
                     history=history)
    assert out[1].layout.columns[0].name == "id"  # type: ignore[attr-defined]


# -- MySQL binary JSON ---------------------------------------------------------------------

def _jstring(text: str) -> bytes:
    data = text.encode()
    assert len(data) < 128
    return bytes([len(data)]) + data


def test_mysql_binary_json():
    # {"a": 1, "bb": [true, null, "x", 2.5]} in the small format, laid out as MySQL does.
    array_values = [(0x04, struct.pack("<H", 1)), (0x04, struct.pack("<H", 0))]
    string = _jstring("x")
    double = struct.pack("<d", 2.5)
    header = 4 + 4 * 3
    array = struct.pack("<HH", 4, header + len(string) + len(double))
    array += bytes([0x04]) + struct.pack("<H", 1) + bytes([0x04]) + struct.pack("<H", 0)
    array += bytes([0x0C]) + struct.pack("<H", header)
    array += bytes([0x0B]) + struct.pack("<H", header + len(string)) + string + double
    keys_at = 4 + 2 * 4 + 2 * 3
    values_at = keys_at + 3
    obj = struct.pack("<HH", 2, values_at + len(array))
    obj += struct.pack("<HH", keys_at, 1) + struct.pack("<HH", keys_at + 1, 2)
    obj += bytes([0x05]) + struct.pack("<h", 1) + bytes([0x02]) + struct.pack("<H", values_at)
    obj += b"abb" + array
    assert array_values
    assert binary_json_to_text(b"\x00" + obj) == '{"a": 1, "bb": [true, null, "x", 2.5]}'
    assert binary_json_to_text(b"\x0c" + _jstring("é")) == '"é"'
    assert binary_json_to_text(b"\x04\x02") == "false"
    decimal = bytes([T.NEWDECIMAL, 9, 14, 4]) + bytes.fromhex("810DFB38D204D2")
    assert binary_json_to_text(b"\x0f" + decimal) == "1234567890.1234"
    with pytest.raises(ValueError, match="truncated"):
        binary_json_to_text(b"\x0c" + bytes([10]) + b"short")
