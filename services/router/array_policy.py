"""The kv policy scored over arrays: every worker of a group costed in one compiled call (`decide_row`, which also
reads the prompt's prefix depths from the `SlotIndex`'s mask table and runs the busy check) from the registry's
`GroupArrays` and `RecentRoutes` (whose compiled table gives every row's recent-route overlap in one more call).
The same cost, tie-break and choice as `KvAwarePolicy` (whose per-view path it inherits for the cases it declines).
Pure: no I/O, no transport.
"""

from collections.abc import Sequence

import numpy as np

from engines.base.block_hash import chain_block_hashes, num_blocks_for
from engines.base.events import KvTier
from services.router.array_scoring import compile_kernels, decide_row
from services.router.kv_policy import Clock, KvAwarePolicy, KvPolicyConfig, Rng
from services.router.load_arrays import GroupArrays
from services.router.recent_routes import RecentRoutes
from services.router.slot_index import SlotIndex
from services.router.types import RouteInput

_NO_KEYS = np.zeros(0, np.uint64)


class ArrayKvPolicy(KvAwarePolicy):
    """`KvAwarePolicy` with a `SlotIndex` and `RecentRoutes`, and `choose_arrays` for the common case: one block
    size in the group, argmin (no temperature), a cached prefix held on device only, and not every worker busy.
    Anything else: None, and the caller takes the per-view path (`choose`), which sees the same index and the same
    recent routes. NOTE: `choose_arrays` records its route in `predicted` later (`flush_deferred`, or the next read
    of it), so the decision returns first; no answer differs."""

    predicted: RecentRoutes

    def __init__(
        self,
        index: SlotIndex,
        clock: Clock,
        rng: Rng | None = None,
        config: KvPolicyConfig = KvPolicyConfig(),
        tier_weights: dict[KvTier, float] | None = None,
    ):
        super().__init__(index, clock, rng, config, tier_weights)
        self.index: SlotIndex = index
        self.predicted = RecentRoutes(clock, config.predict_ttl_s)
        self._clock = clock
        self._depths = np.zeros(index.capacity + 1, np.int64)  # the compiled call's scratch, reused
        compile_kernels()

    def choose_arrays(
        self, request: RouteInput, group: GroupArrays, busy_load: float = 0.0, busy_kv: float = 0.0
    ) -> tuple[str, int] | None:
        """(the chosen worker_id, its cached prompt tokens); None: declined, or every live worker is past a busy
        threshold (`BusyThresholds`' meaning; 0 turns a check off)."""
        block_size = group.block_size or self.config.block_size
        if group.block_size < 0 or self.config.temperature > 0 or self.tier_weights[KvTier.DEVICE] != 1.0:
            return None
        hashes = self.prompt_hashes(request, block_size)
        if group.index_epoch != self.index.epoch or len(self._depths) <= self.index.capacity:
            group.index_slots, group.index_epoch = self.index.slots_for(group.worker_ids), self.index.epoch
            self._depths = np.zeros(self.index.capacity + 1, np.int64)
        prompt_keys = np.fromiter(hashes, np.uint64, len(hashes))
        keys = prompt_keys if self.config.use_events else _NO_KEYS
        self.recent_overlap_into(prompt_keys, group)
        row, overlap, deepest = decide_row(
            *self.index.kernel_args(),
            keys,
            self._depths,
            group.index_slots,
            group.predicted,
            group.state,
            float(busy_load),
            float(busy_kv),
            float(self._clock()),
            num_blocks_for(len(request.token_ids), block_size),
            block_size,
            float(self.config.overlap_weight),
            float(self.config.inflight_weight),
        )
        if row < 0 or not self.index.touch_later(hashes, deepest):
            return None
        worker_id = group.worker_ids[row]
        self.predicted.record_later(hashes, worker_id)
        return worker_id, int(overlap) * block_size

    def recent_overlap_into(self, prompt_keys: np.ndarray, group: GroupArrays) -> None:
        """Each row's recent-route overlap into `group.predicted` (one compiled call)."""
        self.predicted.flush()  # NOTE: first, as a pending record may give a worker its slot
        if group.recent_epoch != self.predicted.slot_epoch:
            group.recent_slots = self.predicted.slots_for(group.worker_ids)
            group.recent_epoch = self.predicted.slot_epoch
        assert group.recent_slots is not None and group.predicted is not None  # NOTE: set just above, and by `empty`
        self.predicted.overlap_rows(prompt_keys, group.recent_slots, group.predicted)

    def flush_deferred(self) -> None:
        """The work `choose_arrays` left for after its reply: the index's LRU touches, the recent routes."""
        self.index.flush_touches()
        self.predicted.flush()

    def prompt_hashes(self, request: RouteInput, block_size: int) -> Sequence[int]:
        """The gateway's hashes when it sent them for this block size, else hashed here (the one function)."""
        if request.block_hashes and request.hash_block_size == block_size:
            return request.block_hashes
        return chain_block_hashes(request.token_ids, block_size, request.hash_root)
