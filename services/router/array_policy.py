"""The kv policy scored over arrays: every worker of a group costed in one compiled loop (`pick_row`) from the
registry's `GroupArrays`, the `SlotIndex`'s per-slot prefix depths and `RecentRoutes`. The same cost, tie-break and choice as
`KvAwarePolicy` (whose per-view path it inherits for the cases it declines). Pure: no I/O, no transport.
"""
from collections.abc import Sequence

import numpy as np

from engines.base.block_hash import chain_block_hashes
from engines.base.events import KvTier
from services.router.array_scoring import compile_kernels, pick_row
from services.router.kv_policy import Clock, KvAwarePolicy, KvPolicyConfig, Rng
from services.router.load_arrays import GroupArrays
from services.router.recent_routes import RecentRoutes
from services.router.slot_index import SlotIndex
from services.router.types import RouteInput


class ArrayKvPolicy(KvAwarePolicy):
    """`KvAwarePolicy` with a `SlotIndex` and `RecentRoutes`, and `choose_arrays` for the common case: one block
    size in the group, argmin (no temperature), and a cached prefix held on device only. Anything else: None, and
    the caller takes the per-view path (`choose`), which sees the same index and the same recent routes."""

    def __init__(self, index: SlotIndex, clock: Clock, rng: Rng | None = None,
                 config: KvPolicyConfig = KvPolicyConfig(), tier_weights: dict[KvTier, float] | None = None):
        super().__init__(index, clock, rng, config, tier_weights)
        self.index: SlotIndex = index
        self.predicted = RecentRoutes(clock, config.predict_ttl_s)
        self._clock = clock
        compile_kernels()

    def choose_arrays(self, request: RouteInput, group: GroupArrays) -> tuple[str, int] | None:
        """(the chosen worker_id, its cached prompt tokens), recorded as a recent route; None: declined."""
        block_size = group.block_size or self.config.block_size
        if group.block_size < 0 or self.config.temperature > 0 or self.tier_weights[KvTier.DEVICE] != 1.0:
            return None
        hashes = self.prompt_hashes(request, block_size)
        depths = self.index.depths(hashes) if self.config.use_events else np.zeros(self.index.capacity + 1, np.int64)
        if depths is None:
            return None
        if group.index_epoch != self.index.epoch:
            group.index_slots, group.index_epoch = self.index.slots_for(group.worker_ids), self.index.epoch
        predicted = np.zeros(len(group.worker_ids), np.int64)
        for worker_id, num_blocks in self.predicted.overlap(hashes).items():
            row = group.row_of.get(worker_id)
            if row is not None:
                predicted[row] = num_blocks
        num_prompt = -(-len(request.token_ids) // block_size)
        row, overlap = pick_row(depths, group.index_slots, predicted, group.queued_tokens, group.inflight_tokens,
                                group.expires_at, float(self._clock()), num_prompt, block_size,
                                float(self.config.overlap_weight), float(self.config.inflight_weight))
        if row < 0:
            return None
        worker_id = group.worker_ids[row]
        self.predicted.record(hashes, worker_id)
        return worker_id, int(overlap) * block_size

    def prompt_hashes(self, request: RouteInput, block_size: int) -> Sequence[int]:
        """The gateway's hashes when it sent them for this block size, else hashed here (the one function)."""
        if request.block_hashes and request.hash_block_size == block_size:
            return request.block_hashes
        return chain_block_hashes(request.token_ids, block_size, request.hash_root)
