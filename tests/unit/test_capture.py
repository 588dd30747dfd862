"""``[capture] include`` and ``exclude``: the patterns, and what a filter lets through."""

from __future__ import annotations

import pytest

from cdcserver.core.capture import CaptureFilter, TablePattern, parse_patterns
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


def test_commas_inside_quotes_do_not_split_the_list():
    assert [p.text for p in parse_patterns('`a,b`.*, c.d')] == ["`a,b`.*", "c.d"]


def test_a_bad_pattern_is_a_configuration_error_naming_the_setting(tmp_path):
    path = tmp_path / "cdc.toml"
    path.write_text('[capture]\ninclude = "shop"\n')
    with pytest.raises(ConfigError, match=r"capture\.include.*db\.table patterns"):
        Config.load(str(path))
