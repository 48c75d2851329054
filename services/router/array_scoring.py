"""One kv decision over a worker group in one compiled call: the prompt's prefix depth on every slot of the mask
table, the busy check and the kv cost of every row, and the pick, with the same float operations, in the same
order, and the same tie-break as `KvAwarePolicy` (so the picks are identical). Pure: no I/O, no Python objects.
"""

import functools

import numba
import numpy as np

from services.router.load_arrays import (
    EXPIRES_AT,
    INFLIGHT,
    KV_USED,
    MAX_NUM_SEQS,
    NUM_FIELDS,
    NUM_SEQS,
    QUEUED,
)
from services.router.mask_table import _depths

ALL_LAPSED, ALL_BUSY = -1, -2  # what `decide_row` returns as its row when it picks none


@numba.njit(cache=True)
def decide_row(
    table,
    mult,
    shift,
    keys,
    depths,
    slots,
    predicted,
    state,
    busy_load,
    busy_kv,
    now,
    num_prompt,
    block_size,
    overlap_weight,
    inflight_weight,
):
    """(the cheapest live row or ALL_LAPSED / ALL_BUSY, its cached blocks, the deepest prefix any slot holds).

    `depths` is scratch, one entry per slot and a final one for workers holding nothing; on return depths[s] is
    how many leading `keys` slot s holds. `state` is a `GroupArrays.state` ([NUM_FIELDS, rows]).
    Busy (a check is off at 0): `busy_load <= num_seqs / max_num_seqs` or `busy_kv <= kv_used`; when every live
    row is busy, none is picked. Per row: `overlap = max(depths[slots[row]], predicted[row])` blocks;
    `cost = max(queued / block_size + num_prompt - overlap_weight * overlap, 0) + inflight_weight * inflight /
    block_size`. Ties go to fewer in-flight tokens, then to the first row (the smaller worker_id)."""
    depths[:] = 0
    deepest = _depths(table, mult, shift, keys, depths)
    best, best_overlap = ALL_LAPSED, 0
    best_cost, best_inflight = np.inf, 0.0
    num_live = num_busy = 0
    for row in range(slots.shape[0]):
        if state[EXPIRES_AT, row] <= now:
            continue
        num_live += 1
        if (busy_load > 0 and busy_load <= state[NUM_SEQS, row] / state[MAX_NUM_SEQS, row]) or (
            busy_kv > 0 and busy_kv <= state[KV_USED, row]
        ):
            num_busy += 1
        overlap = max(depths[slots[row]], predicted[row])
        inflight = state[INFLIGHT, row]
        prefill = state[QUEUED, row] / block_size + num_prompt - overlap_weight * overlap
        cost = (prefill if prefill > 0.0 else 0.0) + inflight_weight * inflight / block_size
        if best < 0 or cost < best_cost or (cost == best_cost and inflight < best_inflight):
            best, best_overlap, best_cost, best_inflight = row, overlap, cost, inflight
    if num_live and num_busy == num_live:
        return ALL_BUSY, 0, deepest
    return best, best_overlap, deepest


@functools.cache
def compile_kernels() -> None:
    """Compile (or load from numba's cache) `decide_row` now, so no live decision waits for it."""
    decide_row(
        np.zeros((4, 2), np.uint64),
        np.uint64(1),
        np.uint64(62),
        np.zeros(1, np.uint64),
        np.zeros(65, np.int64),
        np.zeros(1, np.intp),
        np.zeros(1, np.int64),
        np.zeros((NUM_FIELDS, 1)),
        0.0,
        0.0,
        0.0,
        1,
        1,
        1.0,
        1.0,
    )
