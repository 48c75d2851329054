"""The kv policy scored over arrays: every worker of a group costed at once with numpy from the registry's
`GroupArrays`, the `SlotIndex`'s per-slot prefix depths and `RecentRoutes`. The same cost, tie-break and choice as
`KvAwarePolicy` (whose per-view path it inherits for the cases it declines). Pure: no I/O, no transport.
"""
from collections.abc import Sequence

import numpy as np

from engines.base.block_hash import chain_block_hashes
from engines.base.events import KvTier
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

    def choose_arrays(self, request: RouteInput, group: GroupArrays) -> tuple[str, int] | None:
        """(the chosen worker_id, its cached prompt tokens), recorded as a recent route; None: declined."""
        block_size = group.block_size or self.config.block_size
        if group.block_size < 0 or self.config.temperature > 0 or self.tier_weights[KvTier.DEVICE] != 1.0:
            return None
        hashes = self.prompt_hashes(request, block_size)
        overlap = self._overlap(hashes, group)
        if overlap is None:
            return None
        num_prompt = -(-len(request.token_ids) // block_size)
        prefill = group.queued_tokens / block_size + num_prompt - self.config.overlap_weight * overlap
        cost = np.maximum(prefill, 0.0) + self.config.inflight_weight * group.inflight_tokens / block_size
        cost[group.expires_at <= self._clock()] = np.inf
        row = _argmin(cost, group.inflight_tokens)
        if row is None:
            return None
        worker_id = group.worker_ids[row]
        self.predicted.record(hashes, worker_id)
        return worker_id, int(overlap[row]) * block_size

    def prompt_hashes(self, request: RouteInput, block_size: int) -> Sequence[int]:
        """The gateway's hashes when it sent them for this block size, else hashed here (the one function)."""
        if request.block_hashes and request.hash_block_size == block_size:
            return request.block_hashes
        return chain_block_hashes(request.token_ids, block_size, request.hash_root)

    def _overlap(self, hashes: Sequence[int], group: GroupArrays) -> np.ndarray | None:
        """Per row: the longer of the events' cached prefix and the router's recent routes, in blocks."""
        overlap = np.zeros(len(group.worker_ids))
        if self.config.use_events:
            depths = self.index.depths(hashes)
            if depths is None:
                return None
            if group.index_epoch != self.index.epoch:
                group.index_slots, group.index_epoch = self.index.slots_for(group.worker_ids), self.index.epoch
            overlap[:] = depths[group.index_slots]
        for worker_id, num_blocks in self.predicted.overlap(hashes).items():
            row = group.row_of.get(worker_id)
            if row is not None and num_blocks > overlap[row]:
                overlap[row] = num_blocks
        return overlap


def _argmin(cost: np.ndarray, inflight_tokens: np.ndarray) -> int | None:
    """The lowest cost; ties to fewer in-flight tokens, then the first row (the smaller worker_id). None: all inf."""
    best = cost.min(initial=np.inf)
    if best == np.inf:
        return None
    ties = np.flatnonzero(cost == best)
    if len(ties) == 1:
        return int(ties[0])
    return int(ties[np.argmin(inflight_tokens[ties])])
