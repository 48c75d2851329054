"""The router's own recent decisions, held per worker: worker -> {block hash: expires at}, mirrored in a compiled
table (`RecentTable`) that answers a group's overlap in one call (`overlap_rows`). `overlap` (the per-view path's)
is a binary search per worker that holds the prompt's first block (an index of each recorded prompt's first block).
The same answers as `ApproximateIndex` (hash -> {worker: expires at}). A route may be recorded later (after the
reply): any read makes pending records first, so no answer differs.

Pure: no I/O, no transport; time is injected.
"""

from collections.abc import Callable, Sequence
from itertools import repeat

import numpy as np

from services.router.recent_table import RecentTable, compile_kernels

Clock = Callable[[], float]
_MAX_PENDING = 4096  # routes `record_later` holds at most before it records them


class RecentRoutes:
    """A prompt is recorded with all its ancestors under one expiry, and a later record refreshes them, so along a
    chain a worker's expiry never grows with depth: its live prefix is found by binary search.

    NOTE: at most `max_entries` hashes per worker; past that the worker keeps its newest half, cut by expiry, so a
    kept block's ancestors are always kept too. NOTE: a prompt's first block hash is never a later block's (each
    hash chains its parent), so the workers that hold a prompt's first block are among those listed under it."""

    def __init__(self, clock: Clock, ttl_s: float = 120.0, max_entries: int = 100_000):
        if ttl_s <= 0 or max_entries < 2:
            raise ValueError(f"need ttl_s > 0 and max_entries >= 2, got {ttl_s} and {max_entries}")
        self._clock = clock
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._until: dict[str, dict[int, float]] = {}  # worker_id -> {hash: expires at}
        self._pending: list[tuple[Sequence[int], str, float]] = []  # `record_later`'s routes, oldest first
        # a recorded prompt's first hash -> the workers it went to, and back; a listed worker holds that hash
        self._by_first: dict[int, dict[str, None]] = {}
        self._firsts: dict[str, set[int]] = {}
        # the compiled mirror of `_until`: each worker holding entries has a slot there (never reused)
        self._table = RecentTable()
        self._slot_of: dict[str, int] = {}
        self._next_slot = 0
        self.slot_epoch = 0  # bumped when a worker gains or loses its slot (`slots_for` answers change)
        compile_kernels()

    def __len__(self) -> int:
        self.flush()
        return sum(len(d) for d in self._until.values())

    def record(self, block_hashes: Sequence[int], worker_id: str) -> None:
        self.flush()
        self._record(block_hashes, worker_id, self._clock() + self.ttl_s)

    def record_later(self, block_hashes: Sequence[int], worker_id: str) -> None:
        """`record`, with the expiry of now, made by `flush` or by the next call that reads (so answers are alike)."""
        if len(self._pending) >= _MAX_PENDING:
            self.flush()
        self._pending.append((block_hashes, worker_id, self._clock() + self.ttl_s))

    def flush(self) -> None:
        """Make the pending records, oldest first."""
        while self._pending:
            pending, self._pending = self._pending, []
            for block_hashes, worker_id, until in pending:
                self._record(block_hashes, worker_id, until)

    def overlap(self, block_hashes: Sequence[int]) -> dict[str, int]:
        """Per worker: the leading blocks routed to it within the TTL (workers with none are absent)."""
        self.flush()
        if not block_hashes:
            return {}
        now, first, counts = self._clock(), block_hashes[0], {}
        for worker_id in self._by_first.get(first, ()):
            entries = self._until[worker_id]
            if entries.get(first, 0.0) > now:
                counts[worker_id] = _live_prefix(entries, block_hashes, now)
        return dict(sorted(counts.items()))

    def overlap_into(self, block_hashes: Sequence[int], row_of: dict[str, int], out: np.ndarray) -> None:
        """`overlap` written as out[row_of[worker]] (0 for the rest; workers not in `row_of` are left out)."""
        row_slots = np.full(len(out), -1, np.int64)
        for worker_id, row in row_of.items():
            row_slots[row] = self._slot_of.get(worker_id, -1)
        self.overlap_rows(np.fromiter(block_hashes, np.uint64, len(block_hashes)), row_slots, out)

    def overlap_rows(self, keys: np.ndarray, row_slots: np.ndarray, out: np.ndarray) -> None:
        """`overlap` of the prompt's hashes `keys` written as out[row], one compiled call; `row_slots` from
        `slots_for` at the current `slot_epoch`."""
        self.flush()
        self._table.overlap_rows(keys, row_slots, self._clock(), out)

    def slots_for(self, worker_ids: Sequence[str]) -> np.ndarray:
        """Each worker's slot in the compiled table (-1: it holds nothing), for `overlap_rows`."""
        slot_of = self._slot_of
        return np.fromiter((slot_of.get(w, -1) for w in worker_ids), np.int64, len(worker_ids))

    def expire(self) -> None:
        """Drop every lapsed decision."""
        self.flush()
        now = self._clock()
        for worker_id, entries in list(self._until.items()):
            live = {h: t for h, t in entries.items() if t > now}
            self._drop(worker_id, [h for h, t in entries.items() if t <= now])
            if live:
                self._until[worker_id] = live
            else:
                del self._until[worker_id]
                self._release(worker_id)
            self._unlist(worker_id)

    def remove_worker(self, worker_id: str) -> None:
        self.flush()
        self._drop(worker_id, list(self._until.pop(worker_id, {})))
        self._release(worker_id)
        self._unlist(worker_id)

    def _record(self, block_hashes: Sequence[int], worker_id: str, until: float) -> None:
        entries = self._until.setdefault(worker_id, {})
        entries.update(zip(block_hashes, repeat(until)))
        if block_hashes:
            self._by_first.setdefault(block_hashes[0], {})[worker_id] = None
            self._firsts.setdefault(worker_id, set()).add(block_hashes[0])
        self._mirror(block_hashes, worker_id, until)
        if len(entries) > self.max_entries:
            kept = self._until[worker_id] = self._newest(entries, self.max_entries // 2)
            self._drop(worker_id, [h for h in entries if h not in kept])
            self._unlist(worker_id)

    def _mirror(self, block_hashes: Sequence[int], worker_id: str, until: float) -> None:
        """The record in the compiled table (rebuilt from the dicts when it would pass its load)."""
        if (slot := self._slot_of.get(worker_id)) is None:
            slot = self._slot_of[worker_id] = self._next_slot
            self._next_slot += 1
            self.slot_epoch += 1
        if self._table.full_after(len(block_hashes)):
            self._table.rebuild(
                [
                    (self._slot_of[w], _keys(d), np.fromiter(d.values(), np.float64, len(d)))
                    for w, d in self._until.items()
                ]
            )
            return
        self._table.put(_keys(block_hashes), slot, np.full(len(block_hashes), until))

    def _drop(self, worker_id: str, block_hashes: list[int]) -> None:
        if block_hashes and (slot := self._slot_of.get(worker_id)) is not None:
            self._table.drop(_keys(block_hashes), slot)

    def _release(self, worker_id: str) -> None:
        """`worker_id` holds nothing now: it loses its slot (all its rows were dropped first)."""
        if self._slot_of.pop(worker_id, None) is not None:
            self.slot_epoch += 1

    def _unlist(self, worker_id: str) -> None:
        """Take `worker_id` off the first hashes it no longer holds (all of them when it holds none)."""
        held = self._until.get(worker_id, {})
        firsts = self._firsts.get(worker_id, set())
        for first in [h for h in firsts if h not in held]:
            firsts.discard(first)
            workers = self._by_first[first]
            del workers[worker_id]
            if not workers:
                del self._by_first[first]
        if not firsts:
            self._firsts.pop(worker_id, None)

    def _newest(self, entries: dict[int, float], keep: int) -> dict[int, float]:
        cut = sorted(entries.values(), reverse=True)[keep - 1]
        now = self._clock()
        return {h: t for h, t in entries.items() if t >= cut and t > now}


def _keys(block_hashes) -> np.ndarray:
    return np.fromiter(block_hashes, np.uint64, len(block_hashes))


def _live_prefix(entries: dict[int, float], block_hashes: Sequence[int], now: float) -> int:
    """How many leading `block_hashes` are live in `entries`, given the first is (expiry never grows with depth)."""
    lo, hi = 1, len(block_hashes)  # the live prefix's length is in [lo, hi]
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if entries.get(block_hashes[mid - 1], 0.0) > now:
            lo = mid
        else:
            hi = mid - 1
    return lo
