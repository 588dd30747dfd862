"""``[capture] include`` and ``exclude``: the patterns, and what a filter lets through."""

from __future__ import annotations

import hashlib

import pytest

from cdcserver.core.capture import (
    CaptureFilter,
    ColumnRules,
    TablePattern,
    parse_column_patterns,
    parse_patterns,
    value_function,
)
from cdcserver.core.config import Config, ConfigError
from cdcserver.core.names import TableName

T = TableName


@pytest.mark.parametrize(("pattern", "table", "matches"), [
    ("shop.*", T("shop", "orders"), True),
    ("shop.*", T("shopping", "orders"), False),
    ("*.audit_*", T("crm", "audit_log"), True),
    ("*.audit_*", T("crm", "audits"), False),
    ("*", T("any", "thing"), True),
    ("crm.customers", T("crm", "customers"), True),
    ("crm.customers", T("crm", "Customers"), False),  # names compare exactly, as on Linux
    ("`my.db`.t", T("my.db", "t"), True),
    ("`my.db`.t", T("my", "db.t"), False),
    ('"a,b".*', T("a,b", "x"), True),
    ("`sh*p`.t", T("shop", "t"), False),  # a quoted name is exact, its * a character
    ("`sh*p`.t", T("sh*p", "t"), True),
    ("db.x.y", None, ValueError),
])
def test_a_pattern_matches_what_it_says(pattern: str, table: TableName | None,
                                        matches: object):
    if matches is ValueError:
        with pytest.raises(ValueError, match=r"one db\.table pattern"):
            TablePattern.parse(pattern)
        return
    assert table is not None
    assert TablePattern.parse(pattern).matches(table) is matches


def test_include_then_exclude_and_the_system_schemas_stay_out():
    capture = CaptureFilter.parse("mysql.time_zone", include="shop.*, crm.customers",
                                  exclude="shop.sessions")
    assert capture.captures("shop", "orders") and capture.captures("crm", "customers")
    assert capture.why_not(T("crm", "leads")) == "[capture] include does not select it"
    assert capture.why_not(T("shop", "sessions")) == \
        "[capture] exclude leaves it out (shop.sessions)"
    assert capture.captures("mysql", "time_zone")  # named in system_tables, not by include
    assert not capture.captures("mysql", "db") and not capture.captures("mysql", "global_priv")
    everything = CaptureFilter.parse("", exclude="audit.*")
    assert everything.captures("shop", "orders") and not everything.captures("audit", "log")
    assert "system schemas" in str(everything.why_not(T("sys", "x")))
    quoted = CaptureFilter.parse("mysql.`a,b`, sys.`x.y`,mysql.plain")
    assert quoted.system_tables == {T("mysql", "a,b"), T("sys", "x.y"), T("mysql", "plain")}


def test_commas_inside_quotes_do_not_split_the_list():
    assert [p.text for p in parse_patterns('`a,b`.*, c.d')] == ["`a,b`.*", "c.d"]


def test_a_bad_pattern_is_a_configuration_error_naming_the_setting(tmp_path):
    path = tmp_path / "cdc.toml"
    path.write_text('[capture]\ninclude = "shop"\n')
    with pytest.raises(ConfigError, match=r"capture\.include.*db\.table patterns"):
        Config.load(str(path))


@pytest.mark.parametrize(("pattern", "table", "column", "rule"), [
    ("shop.users.email", T("shop", "users"), "email", "hash"),
    ("shop.users.email", T("shop", "users"), "EMAIL", "hash"),  # column names ignore case
    ("shop.users.email", T("shop", "Users"), "email", None),  # table names do not
    ("*.*.ssn", T("hr", "staff"), "ssn", "hash"),
    ("shop.*.card_*", T("shop", "cards"), "card_number", "hash"),
    ("`a.b`.t.`c:1`", T("a.b", "t"), "c:1", "hash"),
    ("`a.b`.t.`c:1`", T("a", "b.t"), "c:1", None),
])
def test_a_column_pattern_names_the_columns_it_says(pattern: str, table: TableName,
                                                    column: str, rule: str | None):
    rules = ColumnRules(hash=parse_column_patterns(pattern), salt=b"s")
    assert rules.rule(table, column) == rule


def test_exclude_wins_over_hash_and_hash_over_mask_and_a_mask_keeps_n_characters():
    rules = ColumnRules(parse_column_patterns("s.t.a"), parse_column_patterns("s.t.a, s.t.b"),
                        parse_column_patterns("s.t.*:3, s.x.`y:2`", keep=True), b"salt")
    t = T("s", "t")
    assert [rules.rule(t, c) for c in ("a", "b", "c")] == ["exclude", "hash", "mask:3"]
    assert rules.rule(T("s", "x"), "y:2") == "mask:0"  # ":2" inside the quotes is the name
    assert value_function("mask:3", None)("héllo wörld") == "hél***"
    assert value_function("mask:3", None)(b"\x00\x01\x02\x03") == b"\x00\x01\x02***"
    assert value_function("mask:0", None)("") == "***"
    assert value_function("hash", b"salt")("é") == hashlib.sha256("salté".encode()).hexdigest()
    assert value_function("hash", b"salt")(None) is None


@pytest.mark.parametrize("text", ["shop.users", "shop.users.email.x", "shop..email", ""])
def test_a_bad_column_pattern_is_refused(text: str):
    with pytest.raises(ValueError):
        if not parse_column_patterns(text):
            raise ValueError("empty")


def test_a_bad_column_pattern_is_a_configuration_error_naming_the_setting(tmp_path):
    path = tmp_path / "cdc.toml"
    path.write_text('[capture]\ncolumns_mask = "shop.users"\n')
    with pytest.raises(ConfigError, match=r"capture\.columns_mask.*db\.table\.column"):
        Config.load(str(path))
