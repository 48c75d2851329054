"""The kv cost of every row of a worker group in one compiled loop, and the pick: the same float operations, in the
same order, and the same tie-break as `KvAwarePolicy` (so the picks are identical). Pure: no I/O, no Python objects.
"""
import functools

import numba
import numpy as np


@numba.njit(cache=True)
def pick_row(depths, slots, predicted, queued_tokens, inflight_tokens, expires_at, now, num_prompt, block_size,
             overlap_weight, inflight_weight):
    """(the cheapest live row, its cached blocks), or (-1, 0) when every row's lease has lapsed.

    Per row: `overlap = max(depths[slots[row]], predicted[row])` blocks;
    `cost = max(queued / block_size + num_prompt - overlap_weight * overlap, 0) + inflight_weight * inflight /
    block_size`. Ties go to fewer in-flight tokens, then to the first row (the smaller worker_id)."""
    best, best_overlap = -1, 0
    best_cost, best_inflight = np.inf, 0.0
    for row in range(slots.shape[0]):
        if expires_at[row] <= now:
            continue
        overlap = max(depths[slots[row]], predicted[row])
        prefill = queued_tokens[row] / block_size + num_prompt - overlap_weight * overlap
        cost = (prefill if prefill > 0.0 else 0.0) + inflight_weight * inflight_tokens[row] / block_size
        if best < 0 or cost < best_cost or (cost == best_cost and inflight_tokens[row] < best_inflight):
            best, best_overlap, best_cost, best_inflight = row, overlap, cost, inflight_tokens[row]
    return best, best_overlap


@functools.cache
def compile_kernels() -> None:
    """Compile (or load from numba's cache) `pick_row` now, so no live decision waits for it."""
    one = np.zeros(1)
    pick_row(np.zeros(1, np.int64), np.zeros(1, np.intp), np.zeros(1, np.int64), one, one, one, 0.0, 1, 1, 1.0, 1.0)
