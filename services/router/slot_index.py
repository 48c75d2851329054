"""The prefix index with each hash's holders also kept as a bitmask over worker slots (a compiled `MaskTable`), so a
prompt's longest cached prefix on every worker at once is one call with no Python work per block or per worker.
Pure: no I/O, no transport; hashes come only from engines/base/block_hash.py.
"""

from collections.abc import Iterable, Sequence

import numpy as np

from engines.base.events import KvEvent, KvSnapshot
from services.router.mask_table import MaskTable, compile_kernels
from services.router.prefix_index import CachedPrefix, PrefixIndex

_MAX_PENDING_TOUCHES = 4096  # decisions whose LRU touch waits for the next event (a bound on what they hold)


class SlotIndex(PrefixIndex):
    """A `PrefixIndex` whose hashes also map to masks of the slots holding them (in any tier). A worker gets a slot
    when its first block is stored and frees it when it is forgotten; `epoch` changes whenever any worker's slot
    does, so callers may cache `slots_for`.

    NOTE: `depths` defers its LRU touch (a move per block in a 1M-entry OrderedDict) to the next call that reads or
    changes the LRU order (`apply`, `resync`, `match`), or to `flush_touches` (the servicer's, after its reply),
    replayed in order, so eviction is exactly as if each touch had been made at once."""

    def __init__(self, max_entries: int = 1_000_000):
        super().__init__(max_entries)
        compile_kernels()
        self._table = MaskTable()
        self._slot: dict[str, int] = {}  # worker_id -> its slot
        self._free: list[int] = list(range(self._table.num_slots - 1, -1, -1))
        self._touches: list[tuple[Sequence[int], int]] = []  # (a prompt's hashes, its deepest cached block)
        self._stored: list[int] = []  # the blocks of the STORED event being applied, set in the masks at its end
        self._storing = ""  # whose event that is
        self.epoch = 0

    @property
    def capacity(self) -> int:
        return self._table.num_slots

    def masked_hashes(self) -> set[int]:
        """Every hash some slot holds (the same set as the index's)."""
        return set(self._table.keys())

    def slots_for(self, worker_ids: Sequence[str]) -> np.ndarray:
        """Each worker's slot, or `capacity` (the always-zero last entry of `depths`) for one holding nothing."""
        unknown = self.capacity
        return np.array([self._slot.get(w, unknown) for w in worker_ids], np.intp)

    def depths(self, block_hashes: Sequence[int]) -> np.ndarray | None:
        """Per slot (and a final 0 for `capacity`): how many leading blocks of the prompt it holds; touches them as
        `match` does (deferred). None when one of the prompt's blocks is held in a host or disk tier somewhere:
        `match` then counts tiers (the rare, slower path)."""
        out = np.zeros(self.capacity + 1, np.int64)
        keys = np.fromiter(block_hashes, np.uint64, len(block_hashes))
        return out if self.touch_later(block_hashes, self._table.depths(keys, out)) else None

    def kernel_args(self) -> tuple[np.ndarray, np.uint64, np.uint64]:
        """The mask table's arrays, for a compiled caller that computes `depths` itself (then calls `touch_later`)."""
        return self._table.kernel_args()

    def touch_later(self, block_hashes: Sequence[int], deepest: int) -> bool:
        """After depths were read: defer their LRU touch; False (nothing touched) when one of the prompt's blocks is
        held in a host or disk tier somewhere, so the depths must not be used (`match` counts tiers)."""
        if deepest:
            if self._offloaded and not self._offloaded.isdisjoint(block_hashes):
                return False  # NOTE: also where the offloaded block lies past every prefix: the per-view path decides
            if len(self._touches) >= _MAX_PENDING_TOUCHES:
                self.flush_touches()
            self._touches.append((block_hashes, deepest))
        return True

    def flush_touches(self) -> None:
        """Make the LRU touches `depths` deferred, oldest first."""
        touches, self._touches = self._touches, []
        for block_hashes, deepest in touches:
            self._touch(block_hashes[:deepest])

    def apply(self, worker_id: str, events: Iterable[KvEvent]) -> bool:
        self.flush_touches()
        return super().apply(worker_id, events)

    def resync(self, worker_id: str, snapshot: KvSnapshot) -> None:
        self.flush_touches()
        super().resync(worker_id, snapshot)

    def match(self, block_hashes: Sequence[int]) -> dict[str, CachedPrefix]:
        self.flush_touches()
        return super().match(block_hashes)

    def remove_worker(self, worker_id: str) -> bool:
        slot = self._slot.get(worker_id)
        if slot is not None:
            held = self._blocks.get(worker_id, ())
            self._table.clear(held, [slot] * len(held))
        known = super().remove_worker(worker_id)
        if slot is not None:
            del self._slot[worker_id]
            self._free.append(slot)
            self.epoch += 1
        return known

    # ---- the masks follow `_holders`, a STORED event's blocks in one call ----

    def _apply_one(self, worker_id: str, event: KvEvent) -> None:
        self._storing = worker_id
        super()._apply_one(worker_id, event)
        self._set_stored(worker_id)

    def _store(self, worker_id: str, block_hash: int, bit: int) -> None:
        super()._store(worker_id, block_hash, bit)
        self._stored.append(block_hash)

    def _set_stored(self, worker_id: str) -> None:
        if self._stored:
            stored, self._stored = self._stored, []
            self._table.set(stored, self._slot_of(worker_id))

    def _unstore(self, worker_id: str, block_hash: int, bit: int) -> None:
        super()._unstore(worker_id, block_hash, bit)
        holders = self._holders.get(block_hash)
        slot = self._slot.get(worker_id)
        if slot is not None and (holders is None or worker_id not in holders):
            self._table.clear([block_hash], [slot])

    def _evict(self) -> None:
        if len(self._holders) <= self.max_entries:
            return
        # NOTE: only a STORED event evicts, and its own blocks may be among the evicted: their bits go in first
        self._set_stored(self._storing)
        keys, slots = [], []
        while len(self._holders) > self.max_entries:
            block_hash, holders = self._holders.popitem(last=False)
            self._offloaded.discard(block_hash)
            for worker_id in holders:
                self._blocks[worker_id].discard(block_hash)
                keys.append(block_hash)
                slots.append(self._slot[worker_id])
        self._table.clear(keys, slots)

    def _slot_of(self, worker_id: str) -> int:
        slot = self._slot.get(worker_id)
        if slot is None:
            if not self._free:
                old = self.capacity
                self._table.widen()
                self._free = list(range(self.capacity - 1, old - 1, -1))
            slot = self._slot[worker_id] = self._free.pop()
            self.epoch += 1
        return slot
