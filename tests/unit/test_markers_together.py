"""Repairs read at one watermark go as one: :func:`together` names their causes, and
:func:`named` reads them back (the replay filter counts a recorded name by what it names)."""

from __future__ import annotations

from cdcserver.reread.markers import MAX_CAUSES, OTHERS, named, together


def test_repairs_read_together_name_each_transaction_once():
    markers, cause = together([([], "0-1-3"), ([], "0-1-4, 0-1-3"), ([], "0-1-5")])
    assert markers == []
    assert named(cause) == ["0-1-3", "0-1-4", "0-1-5"]


def test_more_causes_than_a_name_holds_end_in_others():
    repairs = [([], f"0-1-{n}") for n in range(MAX_CAUSES + 3)]
    _, cause = together(repairs)
    assert named(cause) == [f"0-1-{n}" for n in range(MAX_CAUSES)] + [OTHERS]


def test_a_merged_name_that_already_ended_in_others_keeps_it_last():
    _, cause = together([([], f"0-1-1, {OTHERS}"), ([], "0-1-2")])
    assert named(cause) == ["0-1-1", "0-1-2", OTHERS]
