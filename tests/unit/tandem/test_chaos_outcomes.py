"""Chaos verdicts: each record classified as a client would judge it; recovery, first token and peak concurrency
from the records; the table and JSON of a run."""

import json
import math

from tandem.chaos.client import Record
from tandem.chaos.outcomes import (
    COMPLETED,
    CORRUPTED,
    FAILED_CLEANLY,
    LEFT,
    LOST,
    UNCLEAN,
    Check,
    classify,
    first_token_after_s,
    max_in_flight,
    recovery_s,
    summarize,
)
from tandem.chaos.report import table, write_json


def rec(**kw) -> Record:
    base = dict(
        index=0,
        behaviour="normal",
        start_s=0.0,
        end_s=1.0,
        status=200,
        has_ended=True,
        is_done=True,
        finish_reason="length",
        num_tokens=4,
        text="abcd",
        first_token_s=0.5,
    )
    return Record(**{**base, **kw})


def test_a_whole_stream_completes_and_a_wrong_one_is_corrupt():
    assert classify(rec(), 4, "abcd") == COMPLETED
    assert classify(rec(text="abd"), 4, "abcd") == CORRUPTED  # a gap
    assert classify(rec(num_tokens=5), 4, "abcd") == CORRUPTED  # a repeat


def test_no_answer_a_hang_or_a_silent_end_is_lost():
    assert classify(rec(timed_out=True), 4) == LOST
    assert classify(rec(transport_error="ConnectionResetError"), 4) == LOST
    assert classify(rec(has_ended=False), 4) == LOST
    assert classify(rec(is_done=False), 4) == LOST
    assert classify(rec(has_left=True, has_ended=False), 4) == LEFT


def test_errors_are_clean_only_with_a_body_and_retry_after_where_due():
    error = {"message": "busy", "type": "service_unavailable_error"}
    assert classify(rec(status=503, error=error, retry_after="1", is_done=False), 4) == FAILED_CLEANLY
    assert classify(rec(status=503, error=error, is_done=False), 4) == UNCLEAN  # no Retry-After
    assert classify(rec(status=500, error={"message": "x", "type": "internal_error"}), 4) == UNCLEAN
    assert classify(rec(status=400, error=None, is_done=False), 4) == UNCLEAN  # no body
    assert classify(rec(status=200, error=error), 4) == FAILED_CLEANLY  # an error event mid-stream


def test_recovery_first_token_and_peak():
    records = [
        rec(start_s=0.0, end_s=2.0),
        rec(start_s=1.0, end_s=3.0, first_token_s=1.4),
        rec(start_s=1.5, end_s=1.6, status=503, error={"message": "m", "type": "t"}),
        rec(start_s=2.5, end_s=4.0, first_token_s=2.6),
    ]
    outcomes = [(r, classify(r, 4, "abcd")) for r in records]
    assert recovery_s(outcomes, 1.0) == 0.5 and recovery_s(outcomes[:2], 1.0) == 0.0
    assert math.isclose(first_token_after_s(records, 1.0), 0.4)
    assert math.isnan(first_token_after_s(records, 3.0))
    assert max_in_flight(records) == 3


def test_a_run_with_any_loss_fails_and_is_reported(tmp_path):
    good = summarize("kill-decode", "g", [(rec(), COMPLETED)], 1.0, 2, 0.0)
    bad = summarize("kill-router", "g", [(rec(), COMPLETED), (rec(timed_out=True), LOST)], 1.0, 0, 0.0)
    checked = summarize("drain", "g", [], 1.0, 0, 0.0)
    checked.checks = [Check("exited 0", False, "code 1")]
    assert good.passed and not bad.passed and not checked.passed
    text = table([good, bad, checked])
    assert text.splitlines()[0].split()[:3] == ["scenario", "sent", "completed"]
    assert "FAIL drain: exited 0 (code 1)" in text
    write_json([good, bad], tmp_path / "c.json", 3.0, True)
    doc = json.loads((tmp_path / "c.json").read_text())
    assert doc["passed"] is False and [s["counts"]["lost"] for s in doc["scenarios"]] == [0, 1]
    assert doc["scenarios"][0]["migrated"] == 2 and doc["scenarios"][1]["first_token_after_s"] == 0.5
