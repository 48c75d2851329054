"""One (model, role) group of the registry's workers as arrays, row i the i-th worker by worker_id: lease expiry,
prompt tokens in flight, uncached tokens likely still queued, what the busy check reads. What the array-scored kv
policy reads instead of a `WorkerView` per worker. Pure: no I/O; the registry owns it and marks rows dirty as they
change.
"""

from dataclasses import dataclass, field

import numpy as np

# the rows of `GroupArrays.state`, one field of every worker each (what the compiled decision indexes)
EXPIRES_AT, INFLIGHT, QUEUED, NUM_SEQS, MAX_NUM_SEQS, KV_USED = range(6)
NUM_FIELDS = 6


@dataclass(slots=True)
class GroupArrays:
    worker_ids: list[str]
    block_size: int  # the group's one KV block size; 0: none says; -1: they differ
    # NOTE: one [NUM_FIELDS, rows] float64 block, so the compiled decision takes the group's state as one argument;
    # the named arrays below are views of its rows
    state: np.ndarray
    expires_at: np.ndarray  # [rows]: the registry's clock
    inflight_tokens: np.ndarray  # [rows]: `WorkerView.num_inflight_tokens`
    queued_tokens: np.ndarray  # [rows]: `WorkerView.num_queued_prefill_tokens`
    num_seqs: np.ndarray  # [rows]: running + waiting + routed since the last load report (`load_of`'s sum)
    max_num_seqs: np.ndarray  # [rows]: `WorkerView.max_num_seqs`
    kv_used: np.ndarray  # [rows]: the share of its KV blocks in use (0 when it reports none)
    row_of: dict[str, int] = field(default_factory=dict)
    index_slots: np.ndarray | None = None  # each row's slot in a SlotIndex (cached by the policy)
    index_epoch: int = -1  # the SlotIndex epoch `index_slots` was read at
    predicted: np.ndarray | None = None  # [rows] int64 scratch: each row's blocks routed to it lately (the policy's)
    recent_slots: np.ndarray | None = None  # each row's slot in the policy's `RecentRoutes` table (cached by it)
    recent_epoch: int = -1  # the `RecentRoutes.slot_epoch` `recent_slots` was read at

    @classmethod
    def empty(cls, worker_ids: list[str], block_size: int) -> "GroupArrays":
        n = len(worker_ids)
        state = np.zeros((NUM_FIELDS, n))
        expires_at, inflight_tokens, queued_tokens, num_seqs, max_num_seqs, kv_used = state
        return cls(
            worker_ids,
            block_size,
            state,
            expires_at,
            inflight_tokens,
            queued_tokens,
            num_seqs,
            max_num_seqs,
            kv_used,
            {w: i for i, w in enumerate(worker_ids)},
            predicted=np.zeros(n, np.int64),
        )

    def set_row(
        self,
        row: int,
        expires_at: float,
        inflight_tokens: int,
        queued_tokens: int,
        num_seqs: int,
        max_num_seqs: int,
        kv_used: float,
    ) -> None:
        # NOTE: one store per field: a column assignment from a tuple costs twice as much
        self.expires_at[row] = expires_at
        self.inflight_tokens[row] = inflight_tokens
        self.queued_tokens[row] = queued_tokens
        self.num_seqs[row] = num_seqs
        self.max_num_seqs[row] = max_num_seqs
        self.kv_used[row] = kv_used


def common_block_size(sizes: list[int]) -> int:
    """The one block size all of a group's layouts name (0: none names one, or no workers), or -1 when they differ."""
    if not sizes:
        return 0
    return sizes[0] if all(s == sizes[0] for s in sizes) else -1
