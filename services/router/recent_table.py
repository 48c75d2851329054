"""The router's recent routes as one open-addressing table over (block hash, worker slot) -> expires at, in numpy
arrays whose probes numba compiles, so a prompt's recent-route overlap on every row of a group is one call with no
Python work per worker. Pure: no I/O; a mirror only (`RecentRoutes`' dicts stay the truth and keep it in step).
"""

import functools
import secrets

import numba
import numpy as np

_MIN_ROWS = 1 << 10
_MAX_LOAD = 0.5  # rows in use per row: linear probing stays short below this
_SLOT_MIX = np.uint64(0x9E3779B97F4A7C15)  # spreads the slots of one hash over the table


@numba.njit(cache=True, inline="always")
def _home(key, slot, mult, shift):
    # NOTE: a per-process odd multiplier, as the mask table's, so crafted block hashes cannot share a home row
    return np.int64(((key ^ (np.uint64(slot) * _SLOT_MIX)) * mult) >> shift)


@numba.njit(cache=True, inline="always")
def _row(table, mult, shift, key, slot):
    """`key`'s row on `slot`, or the empty row where it would go. NOTE: column 1 holds slot + 1 (0: empty)."""
    last, tag = table.shape[0] - 1, np.uint64(slot + 1)
    row = _home(key, slot, mult, shift)
    while table[row, 1] != 0 and not (table[row, 0] == key and table[row, 1] == tag):
        row = (row + 1) & last
    return row


@numba.njit(cache=True)
def _until(table, until, mult, shift, key, slot):
    """`key`'s expiry on `slot`, 0.0 when absent (as `dict.get(key, 0.0)`)."""
    row = _row(table, mult, shift, key, slot)
    return until[row] if table[row, 1] != 0 else 0.0


@numba.njit(cache=True)
def put(table, until, mult, shift, hashes, slot, expires_at):
    """Set every one of `hashes` on `slot` to expire at `expires_at[i]` (adding the absent); the rows added."""
    added = 0
    for i in range(hashes.shape[0]):
        row = _row(table, mult, shift, hashes[i], slot)
        if table[row, 1] == 0:
            table[row, 0], table[row, 1] = hashes[i], np.uint64(slot + 1)
            added += 1
        until[row] = expires_at[i]
    return added


@numba.njit(cache=True)
def drop(table, until, mult, shift, hashes, slot):
    """Make `hashes` absent on `slot` for reads (expiry 0.0; the row stays in use until the table is rebuilt)."""
    for i in range(hashes.shape[0]):
        row = _row(table, mult, shift, hashes[i], slot)
        if table[row, 1] != 0:
            until[row] = 0.0


@numba.njit(cache=True)
def overlap_rows(table, until, mult, shift, prompt, row_slots, now, out):
    """out[row] = how many leading `prompt` hashes were routed to row's slot and are live (0 for slot -1).

    NOTE: the same binary search as `recent_routes._live_prefix`: along a chain a worker's expiry never grows with
    depth, so the live prefix is found in log2(len(prompt)) probes per worker."""
    out[:] = 0
    n = prompt.shape[0]
    if n == 0:
        return
    for row in range(row_slots.shape[0]):
        slot = row_slots[row]
        if slot < 0 or _until(table, until, mult, shift, prompt[0], slot) <= now:
            continue
        lo, hi = 1, n
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if _until(table, until, mult, shift, prompt[mid - 1], slot) > now:
                lo = mid
            else:
                hi = mid - 1
        out[row] = lo


class RecentTable:
    """The table's arrays and its fill; `rebuild` starts it afresh (rows dropped for reads are reclaimed there)."""

    def __init__(self, min_rows: int = _MIN_ROWS):
        self.mult = np.uint64(secrets.randbits(64) | 1)
        self.min_rows = min_rows
        self.rebuilds = 0
        self._alloc(min_rows)

    def _alloc(self, rows: int) -> None:
        rows = 1 << (max(rows, self.min_rows, 2) - 1).bit_length()
        # NOTE: one row per entry (key, slot + 1, expiry's bits), so a probe reads one cache line, not three
        self.table = np.zeros((rows, 3), np.uint64)
        self.until = self.table.view(np.float64)[:, 2]
        self.shift = np.uint64(64 - (rows.bit_length() - 1))
        self.used = 0

    def full_after(self, more: int) -> bool:
        return self.used + more > _MAX_LOAD * len(self.table)

    def rebuild(self, entries: list[tuple[int, np.ndarray, np.ndarray]]) -> None:
        """Afresh, holding exactly `entries` ((slot, hashes, expires at) each), at most a quarter full."""
        self._alloc(4 * sum(len(h) for _, h, _ in entries))
        self.rebuilds += 1
        for slot, hashes, expires_at in entries:
            self.put(hashes, slot, expires_at)

    def put(self, hashes: np.ndarray, slot: int, expires_at: np.ndarray) -> None:
        self.used += put(self.table, self.until, self.mult, self.shift, hashes, slot, expires_at)

    def drop(self, hashes: np.ndarray, slot: int) -> None:
        drop(self.table, self.until, self.mult, self.shift, hashes, slot)

    def overlap_rows(self, prompt: np.ndarray, row_slots: np.ndarray, now: float, out: np.ndarray) -> None:
        overlap_rows(self.table, self.until, self.mult, self.shift, prompt, row_slots, float(now), out)


@functools.cache
def compile_kernels() -> None:
    """Compile (or load from numba's cache) the table's kernels now, so no live decision waits for them."""
    table, one = RecentTable(), np.ones(1, np.uint64)
    table.put(one, 0, np.ones(1))
    table.drop(one, 0)
    table.overlap_rows(one, np.zeros(1, np.int64), 0.0, np.zeros(1, np.int64))
