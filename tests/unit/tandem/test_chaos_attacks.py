"""The attacks scenario's judge can fail: an attack let through, one that never ran, a lost legitimate request, no
request in one phase, or p50 TTFT under attack past 1.2x the quiet one each fail it; a clean run passes."""

import math

import pytest

from tandem.chaos.attacks import CATALOGUE, FLOOD_PREFIX, Attempt, judge, phase_ttfts, ttft_ratio
from tandem.chaos.client import Record
from tandem.chaos.outcomes import COMPLETED, LOST, ScenarioResult


def attempts(rounds: int = 2, **got: str) -> list[Attempt]:
    out = []
    for r in range(rounds):
        for name in sorted(CATALOGUE):
            out.append(Attempt(r, name, "DENIED", got.get(name, "DENIED")))
        out.append(Attempt(r, f"{FLOOD_PREFIX} (80 at once)", "429 with Retry-After", "429 with Retry-After"))
    return out


def result(completed: int = 50, lost: int = 0) -> ScenarioResult:
    counts = {COMPLETED: completed, "failed_cleanly": 0, "left": 0, LOST: lost, "corrupted": 0, "unclean": 0}
    return ScenarioResult("attacks", "goal", 20.0, counts, {"200": completed}, 0, 0.0, 0.1, 16)


QUIET, ATTACKED = [0.10, 0.11, 0.12], [0.11, 0.12, 0.13]


def failed(checks) -> list[str]:
    return [c.name for c in checks if not c.ok]


def test_a_clean_run_passes_with_the_latency_check():
    checks = judge(attempts(), result(), QUIET, ATTACKED, enforce_latency=True)
    assert not failed(checks) and len(checks) == 5


def test_an_attack_let_through_fails_it():
    checks = judge(attempts(**{"replayed KV handle": "OK"}), result(), QUIET, ATTACKED, True)
    assert failed(checks) == ["every attack refused with the right status"]
    assert "replayed KV handle: OK (expected DENIED)" in checks[0].detail


def test_an_attack_that_never_ran_fails_it():
    some = [a for a in attempts() if a.name != "expired KV handle"]
    assert failed(judge(some, result(), QUIET, ATTACKED, True)) == ["every attack of the catalogue ran"]
    no_flood = [a for a in attempts() if not a.name.startswith(FLOOD_PREFIX)]
    assert failed(judge(no_flood, result(), QUIET, ATTACKED, True)) == ["every attack of the catalogue ran"]
    assert "every attack refused with the right status" in failed(judge([], result(), QUIET, ATTACKED, True))


def test_a_lost_legitimate_request_fails_it():
    checks = judge(attempts(), result(lost=1), QUIET, ATTACKED, True)
    assert failed(checks) == ["the legitimate load lost nothing (every request completed)"]


def test_slower_under_attack_fails_it_at_full_size_only():
    slow = [0.13, 0.14, 0.15]  # p50 1.27x the quiet one
    assert failed(judge(attempts(), result(), QUIET, slow, True)) == ["p50 TTFT under attack within 20% of quiet"]
    assert not failed(judge(attempts(), result(), QUIET, slow, False))
    assert failed(judge(attempts(), result(), QUIET, [], False)) == ["requests ran in both phases"]


def test_ttfts_split_by_the_window_a_request_started_in():
    def rec(start: float, ttft: float, status: int = 200) -> Record:
        r = Record(0, "normal", start, first_token_s=start + ttft, status=status)
        r.is_done = True
        return r

    records = [rec(1.0, 0.1), rec(5.0, 0.2), rec(6.0, 0.3, status=429), rec(9.5, 0.4)]
    quiet, attacked = phase_ttfts(records, [(4.0, 8.0)])
    assert phase_ttfts(records, [(4.0, 8.0)], since_s=2.0) == ([pytest.approx(0.4)], [pytest.approx(0.2)])
    assert quiet == pytest.approx([0.1, 0.4]) and attacked == pytest.approx([0.2])
    assert math.isclose(ttft_ratio([0.1, 0.3], [0.4]), 2.0) and math.isnan(ttft_ratio([], [0.1]))
