"""How often a planner run changed its mind: scale direction changes per role (up after down, or down after up),
and the most of them inside any window of a given length. Pure: decisions in, counts out."""

from collections import defaultdict


def direction_changes(decisions: list[dict]) -> dict[str, list[float]]:
    """Per role, the times at which a decision scaled the opposite way from that role's previous one."""
    last: dict[str, int] = {}
    out: dict[str, list[float]] = defaultdict(list)
    for d in decisions:
        sign = (d["to"] > d["from"]) - (d["to"] < d["from"])
        if not sign:
            continue
        role = d["role"]
        if last.get(role, sign) != sign:
            out[role].append(d["t_s"])
        last[role] = sign
    return dict(out)


def most_in_window(times: list[float], window_s: float) -> int:
    """The most of `times` (ascending) inside any half-open window of `window_s` seconds."""
    most, first = 0, 0
    for last, t in enumerate(times):
        while t - times[first] >= window_s:
            first += 1
        most = max(most, last - first + 1)
    return most


def stability(decisions: list[dict], window_s: float) -> dict:
    """Direction changes per role, and the most any role made inside one window of `window_s` (simulated) s."""
    changes = direction_changes(decisions)
    return {
        "direction_changes": {role: len(times) for role, times in changes.items()},
        "window_s": window_s,
        "max_changes_per_window": max((most_in_window(t, window_s) for t in changes.values()), default=0),
    }
