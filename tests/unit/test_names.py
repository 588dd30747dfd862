"""The quoting grammar of table references (client/names.py, protocol.md "Table names"), and
the commands that take one: every name MariaDB allows round-trips, ordinary names stay bare
(MaxScale's bytes), and a name sent wrongly gets an error that says how to quote it."""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from mariadb_cdc_client.format.names import (
    BadTableRef,
    TableRef,
    parse_table,
    quote_name,
    read_table,
    split_list,
    table_ref,
)
from mariadb_cdc_client.format.wire import (
    Code,
    DataRequest,
    DumpRequest,
    ProtocolError,
    RangeQuery,
    error_line,
    parse_list_dumps,
    parse_query_range,
    parse_request_data,
    parse_request_dump,
)

ODD = ["my db", "a.b", "a`b", "``", 'say "hi"', "a,b", "é ☃", "x\ny", "cr\r", "tab\tx",
       "\u2028", " lead", "\xa0nb", "x\x7fy", "\x00", "a/b\\c", "-", "000001", ".", "`", '"',
       "a`.`b", "LIMIT", "0-1-5", "`quoted`", '"json"', "ends.", "a\u3000b", "日本語 表"]

# MariaDB's identifiers: any character of the Basic Multilingual Plane but NUL (the grammar
# carries NUL too) and no surrogate (they are not characters).
names = st.text(st.characters(codec="utf-8", max_codepoint=0xFFFF), max_size=20)


@pytest.mark.parametrize("name", ODD)
def test_odd_names_round_trip_in_every_position(name: str):
    for database, table in ((name, "t"), ("db", name), (name, name)):
        ref = table_ref(database, table)
        assert "\n" not in ref and "\r" not in ref, "a reference fits on one command line"
        parsed = parse_table(ref)
        assert (parsed.database, parsed.table, parsed.version) == (database, table, None)
        assert parse_table(f"{ref}.000042", version=True).version == 42
        read, rest = read_table(f"{ref}  AFTER 0-1-5", version=True)
        assert (read.database, read.table, rest) == (database, table, "AFTER 0-1-5")
        assert split_list(f"{ref}, shop.orders,{ref}") == [ref, "shop.orders", ref]


@given(names, names)
@example("", "")
def test_any_pair_of_names_round_trips_through_every_command(database: str, table: str):
    ref = table_ref(database, table)
    assert "\n" not in ref and "\r" not in ref
    assert (parse_table(ref).database, parse_table(ref).table) == (database, table)
    data = DataRequest(database, table, 3, None, "0-1-5", "0-1-9")
    assert parse_request_data(data.line().partition(" ")[2]) == data
    query = RangeQuery(database, table, "0-1-5", 10, "0-1-9")
    assert parse_query_range(query.line().partition(" ")[2]) == query
    dump = DumpRequest.of((database, table), follow=True)
    parsed = parse_request_dump(dump.line().partition(" ")[2])
    assert parsed == dump and parsed.table == (database, table)
    assert parse_list_dumps(ref) == (database, table)


def test_ordinary_names_are_maxscales_bytes():
    assert table_ref("shop", "orders") == "shop.orders"
    assert table_ref("db-1", "$t_2") == "db-1.$t_2"
    assert table_ref("café", "naïve") == "café.naïve"  # Unicode letters need no quotes
    assert DataRequest("shop", "orders", 2, "0-1-5").line() == \
        "REQUEST-DATA shop.orders.000002 0-1-5"
    assert RangeQuery("shop", "orders", "", 5).line() == "QUERY-RANGE shop.orders LIMIT 5"
    assert DumpRequest.of(("shop", "orders")).line() == "REQUEST-DUMP shop.orders"
    request = parse_request_data("shop.orders 0-1-5")
    assert (request.database, request.table, request.gtid) == ("shop", "orders", "0-1-5")


def test_quoting_forms():
    assert quote_name("my db") == "`my db`"
    assert quote_name("a`b") == "`a``b`"
    assert quote_name("") == "``"
    assert quote_name("x\ny") == '"x\\ny"'  # a control character: a JSON string
    assert quote_name("x\x85y\u2028") == '"x\\u0085y\\u2028"'
    # Either form reads back, and a bare name may hold a quote that does not start it.
    assert parse_table('"my db"."t\\u0020x"') == TableRef("my db", "t x", None, True)
    assert parse_table("a`b.c\"d") == TableRef("a`b", 'c"d')
    assert split_list('shop.*, `my, db`.*,"a,\\"b".c ,,') == ["shop.*", "`my, db`.*",
                                                           '"a,\\"b".c']


def _refused(parse, argument: str) -> ProtocolError:  # type: ignore[no-untyped-def]
    with pytest.raises(ProtocolError) as info:
        parse(argument)
    return info.value


@pytest.mark.parametrize(("argument", "code", "message"), [
    # the report: a name with a space, sent bare, is not "not a GTID"
    ("t_x.sp ace", Code.BAD_SYNTAX, "a name containing a space must be quoted: t_x.`sp ace`"),
    ("my db.t", Code.BAD_SYNTAX, "a name containing a space must be quoted: `my db`.t"),
    ("my db.my t.000002 AFTER 0-1-5", Code.BAD_SYNTAX,
     "a name containing a space must be quoted: `my db`.`my t`.000002"),
    ("db.my table UNTIL 0-1-5", Code.BAD_SYNTAX,
     "a name containing a space must be quoted: db.`my table`"),
    ("db.a.b", Code.NO_FILE, "a name containing a dot must be quoted, as in db.`a.b`"),
    ("db.t.3", Code.NO_FILE, "a version has six digits (db.t.000003)"),
    # past the 4,300 digits Python's int() takes: a refusal, not an internal error
    ("db.t." + "5" * 5000, Code.NO_FILE, "a version has six digits, 000001 to 999999"),
    ("db.t." + "0" * 5000 + "3", Code.NO_FILE, "a version has six digits (db.t.000003)"),
    ("db.t 1-2", Code.BAD_SYNTAX, "not a GTID: '1-2'"),
    # a malformed GTID is named as one (what MaxScale's grammar puts after the table), with
    # the quoting advice second, in case the word was the end of a name
    ("shop.orders not-a-gtid", Code.BAD_SYNTAX,
     "not a GTID: 'not-a-gtid' (expected domain-server-seq); if it is part of the table's "
     "name, a name containing a space must be quoted: shop.`orders not-a-gtid`"),
    ("shop.orders abc-1-2", Code.BAD_SYNTAX, "not a GTID: 'abc-1-2'"),
    ("shop.orders 0-1", Code.BAD_SYNTAX, "not a GTID: '0-1'"),
    ("shop.orders uuid:1", Code.BAD_SYNTAX, "not a GTID: 'uuid:1'"),
    ("db.my cafe1", Code.BAD_SYNTAX, "a name containing a space must be quoted: db.`my cafe1`"),
    ("`my db.t", Code.BAD_SYNTAX, "unbalanced backquote"),
    ('"my\tdb".t', Code.BAD_SYNTAX, "bad JSON string"),
    ('"\\ud800".t', Code.BAD_SYNTAX, "lone UTF-16 surrogate"),
    ("db.`t`x", Code.BAD_SYNTAX, "expected a space after db.`t`, not 'x'"),
    ("db. 0-1-5", Code.NO_FILE, "the table name is missing"),
    ("`my db`.t x", Code.BAD_SYNTAX, "expected REQUEST-DATA"),
])
def test_request_data_errors_name_the_cause(argument: str, code: Code, message: str):
    error = _refused(parse_request_data, argument)
    assert (error.code, message in error.message) == (code, True), error.message


def test_other_commands_name_the_cause():
    for parse, argument in ((parse_query_range, "my db.t AFTER 0-1-5 LIMIT 3"),
                            (parse_request_dump, "my db.t FOLLOW"),
                            (parse_list_dumps, "my db.t")):
        error = _refused(parse, argument)
        assert (error.code, error.message) == (
            Code.BAD_SYNTAX, "a name containing a space must be quoted: `my db`.t")
    for limit in ("0", "²"):  # a Unicode digit is no number here
        error = _refused(parse_query_range, f"db.t LIMIT {limit}")
        assert error.message == f"LIMIT is a positive number, not {limit!r}"
    assert parse_query_range("db.t LIMIT " + "9" * 5000).limit == 10 ** 18  # everything
    assert parse_query_range("db.t LIMIT " + "0" * 5000 + "7").limit == 7
    error = _refused(parse_request_dump, "../x.dump")
    assert error.code == Code.NO_FILE and error.message.startswith("not a dump name")
    assert "takes no version" in _refused(parse_list_dumps, "db.t.000001").message
    with pytest.raises(BadTableRef) as info:
        parse_table("my db.t")
    assert str(info.value) == "a name containing a space must be quoted: `my db`.t"


def test_an_error_line_keeps_the_spaces_of_a_name_it_quotes():
    assert error_line(Code.NO_FILE, "unknown table `a  b`.t\nsecond line") == \
        b"ERR NO-FILE unknown table `a  b`.t second line\n"


def test_scheduled_dump_patterns_take_quoted_names():
    """``[dump] tables`` and ``cdcserver dump``'s tables: references as the protocol writes
    them, ``db.*`` every table, a quoted ``*`` the table of that name."""
    from cdcserver.core.errors import SourceError
    from cdcserver.dump.dumper import _table_or_all
    from mariadb_cdc_client.format.names import split_list

    patterns = split_list("shop.*, `shop.v1`.t,shop.`a,b`, shop.`*`")
    assert [_table_or_all(p) for p in patterns] == [
        ("shop", None), ("shop.v1", "t"), ("shop", "a,b"), ("shop", "*")]
    for bad in ("shop", "shop.v1.t", "a.b c.d"):
        with pytest.raises(SourceError, match=r"expected db\.table or db\.\*"):
            _table_or_all(bad)
