"""The baseline the planner must beat: the cheapest static (prefill, decode) pair whose replay in the simulator
meets the attainment target, found by search over replays against the engine's truth, never by the planner's
model. Pure: `evaluate` (a replay) is handed in, so the search itself tests without a simulator."""

from collections.abc import Callable
from dataclasses import dataclass, field

Pair = tuple[int, int]  # (prefill, decode) replicas


class SearchError(ValueError):
    """No pair within the bounds meets the target: the baseline does not exist."""


@dataclass(slots=True)
class StaticSearch:
    """Replays (prefill, decode) pairs until the cheapest one meeting `target` is known.

    NOTE: assumes attainment never falls when a replica is added to either pool. For each prefill count, in
    ascending order, a binary search finds the fewest decode workers that meet the target; that count can only
    fall as prefill grows, so it bounds the next search, and the walk stops once more prefill cannot be cheaper.
    """

    evaluate: Callable[[Pair], float]  # a pair's SLA attainment
    prefill: tuple[int, int]  # (min, max); (0, 0): aggregated serving, decode workers only
    decode: tuple[int, int]
    target: float = 0.95
    tried: dict[Pair, float] = field(default_factory=dict)
    # NOTE: when given, every decode count a prefill count may need is replayed at once (in parallel): more
    # replays, fewer rounds; the answer is the same
    evaluate_many: Callable[[list[Pair]], list[float]] | None = None

    def meets(self, pair: Pair) -> bool:
        if pair not in self.tried:
            self.tried[pair] = self.evaluate(pair)
        return self.tried[pair] >= self.target

    def cheapest(self) -> Pair:
        (p_min, p_max), (d_min, d_max) = self.prefill, self.decode
        best: Pair | None = None
        for p in range(p_min, p_max + 1):
            if best is not None and p + d_min >= sum(best):
                break
            d_top = min(best[1], sum(best) - p - 1) if best is not None else d_max  # only cheaper counts
            if d_top < d_min:
                break
            self._prefetch([(p, d) for d in range(d_min, d_top + 1)])
            if not self.meets((p, d_top)):
                continue
            d = self._fewest_decode(p, d_min, d_top)
            if best is None or p + d < sum(best):
                best = (p, d)
        if best is None:
            raise SearchError(
                f"no static pair with prefill in {self.prefill} and decode in {self.decode} "
                f"meets {self.target:.0%} attainment"
            )
        return best

    def _prefetch(self, pairs: list[Pair]) -> None:
        todo = [pair for pair in pairs if pair not in self.tried]
        if self.evaluate_many is not None and todo:
            self.tried.update(zip(todo, self.evaluate_many(todo)))

    def _fewest_decode(self, p: int, lo: int, hi: int) -> int:
        """The fewest decode workers in [lo, hi] meeting the target with `p` prefill; (p, hi) is known to."""
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if self.meets((p, mid)) else (mid + 1, hi)
        return lo

    def report(self) -> list[dict]:
        """Every pair replayed, in the order tried, for the JSON."""
        return [{"prefill": p, "decode": d, "sla_attainment": a} for (p, d), a in self.tried.items()]
