"""The router's own recent decisions, held per worker: worker -> {block hash: expires at}. Recording a route is one
C-level dict update; a prompt's overlap is a binary search per worker that holds its first block. The same answers
as `ApproximateIndex` (which holds hash -> {worker: expires at} and pays Python work per block to record).

Pure: no I/O, no transport; time is injected.
"""
from collections.abc import Callable, Sequence
from itertools import repeat

Clock = Callable[[], float]


class RecentRoutes:
    """A prompt is recorded with all its ancestors under one expiry, and a later record refreshes them, so along a
    chain a worker's expiry never grows with depth: its live prefix is found by binary search.

    NOTE: at most `max_entries` hashes per worker; past that the worker keeps its newest half, cut by expiry, so a
    kept block's ancestors are always kept too."""

    def __init__(self, clock: Clock, ttl_s: float = 120.0, max_entries: int = 100_000):
        if ttl_s <= 0 or max_entries < 2:
            raise ValueError(f"need ttl_s > 0 and max_entries >= 2, got {ttl_s} and {max_entries}")
        self._clock = clock
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._until: dict[str, dict[int, float]] = {}  # worker_id -> {hash: expires at}

    def __len__(self) -> int:
        return sum(len(d) for d in self._until.values())

    def record(self, block_hashes: Sequence[int], worker_id: str) -> None:
        entries = self._until.setdefault(worker_id, {})
        entries.update(zip(block_hashes, repeat(self._clock() + self.ttl_s)))
        if len(entries) > self.max_entries:
            self._until[worker_id] = self._newest(entries, self.max_entries // 2)

    def overlap(self, block_hashes: Sequence[int]) -> dict[str, int]:
        """Per worker: the leading blocks routed to it within the TTL (workers with none are absent)."""
        if not block_hashes:
            return {}
        now, first, counts = self._clock(), block_hashes[0], {}
        for worker_id, entries in self._until.items():
            if entries.get(first, 0.0) <= now:
                continue
            lo, hi = 1, len(block_hashes)  # the live prefix's length is in [lo, hi]
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if entries.get(block_hashes[mid - 1], 0.0) > now:
                    lo = mid
                else:
                    hi = mid - 1
            counts[worker_id] = lo
        return dict(sorted(counts.items()))

    def expire(self) -> None:
        """Drop every lapsed decision."""
        now = self._clock()
        for worker_id, entries in list(self._until.items()):
            live = {h: t for h, t in entries.items() if t > now}
            if live:
                self._until[worker_id] = live
            else:
                del self._until[worker_id]

    def remove_worker(self, worker_id: str) -> None:
        self._until.pop(worker_id, None)

    def _newest(self, entries: dict[int, float], keep: int) -> dict[int, float]:
        cut = sorted(entries.values(), reverse=True)[keep - 1]
        now = self._clock()
        return {h: t for h, t in entries.items() if t >= cut and t > now}
