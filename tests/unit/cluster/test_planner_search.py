"""The static baseline's search finds the cheapest pair that meets the target with few replays, and the
stability measure counts scale direction changes inside a window. Pure: a made-up attainment surface."""

import itertools

import pytest

from tandem.cluster.planner_search import SearchError, StaticSearch
from tandem.cluster.planner_stability import direction_changes, most_in_window, stability


def surface(need_p: float, need_d: float, trade: float):
    """Attainment rising in both counts; `trade` lets extra prefill stand in for some decode."""
    return lambda pair: 1.0 if pair[0] >= need_p and pair[1] + trade * (pair[0] - need_p) >= need_d else 0.5


@pytest.mark.parametrize("need_p,need_d,trade", list(itertools.product((1, 2, 5), (1, 3, 9), (0.0, 0.5, 2.0))))
def test_it_finds_the_cheapest_pair_that_brute_force_finds(need_p, need_d, trade):
    evaluate = surface(need_p, need_d, trade)
    search = StaticSearch(evaluate, (1, 12), (1, 12))
    best = search.cheapest()
    brute = min(sum(p) for p in itertools.product(range(1, 13), range(1, 13)) if evaluate(p) >= 0.95)
    assert sum(best) == brute and evaluate(best) >= 0.95
    assert len(search.tried) <= 30  # far fewer than the 144 pairs


def test_aggregated_serving_searches_decode_only_and_no_pair_is_an_error():
    search = StaticSearch(lambda pair: 1.0 if pair[1] >= 7 else 0.0, (0, 0), (1, 16))
    assert search.cheapest() == (0, 7) and all(p == 0 for p, _ in search.tried)
    assert [t["decode"] for t in search.report()][0] == 16
    with pytest.raises(SearchError, match="no static pair"):
        StaticSearch(lambda pair: 0.9, (1, 3), (1, 3)).cheapest()


def decision(t: float, frm: int, to: int, role: str = "decode") -> dict:
    return {"t_s": t, "role": role, "from": frm, "to": to}


def test_direction_changes_count_reversals_per_role():
    decisions = [
        decision(0, 1, 2),
        decision(10, 2, 3),
        decision(20, 3, 2),
        decision(30, 2, 1),
        decision(40, 1, 2),
        decision(15, 1, 2, "prefill"),
    ]
    assert direction_changes(decisions) == {"decode": [20, 40]}
    assert stability(decisions, 300.0) == {
        "direction_changes": {"decode": 2},
        "window_s": 300.0,
        "max_changes_per_window": 2,
    }
    assert stability(decisions, 20.0)["max_changes_per_window"] == 1  # 20 and 40 are 20 s apart: two windows


def test_most_in_window():
    assert most_in_window([], 5.0) == 0
    assert most_in_window([0, 1, 2, 10, 11], 5.0) == 3
    assert most_in_window([0, 5, 10], 5.0) == 1


def test_replaying_each_prefill_counts_candidates_at_once_finds_the_same_pair_in_fewer_rounds():
    evaluate = surface(3, 5, 0.5)
    rounds: list[list] = []

    def many(pairs):
        rounds.append(pairs)
        return [evaluate(p) for p in pairs]

    serial, wide = StaticSearch(evaluate, (1, 8), (1, 8)), StaticSearch(evaluate, (1, 8), (1, 8), evaluate_many=many)
    assert wide.cheapest() == serial.cheapest()
    assert len(rounds) < len(serial.tried) and all(len({p for p, _ in r}) == 1 for r in rounds)
