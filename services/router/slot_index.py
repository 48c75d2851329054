"""The prefix index with each hash's holders also kept as a bitmask over worker slots, so a prompt's longest cached
prefix on every worker at once is a few C calls (dict lookups by `map`, numpy over the masks) instead of Python work
per block and per worker. Pure: no I/O, no transport; hashes come only from engines/base/block_hash.py.
"""
from collections import deque
from collections.abc import Sequence
from itertools import repeat

import numpy as np

from services.router.prefix_index import PrefixIndex

_INITIAL_WIDTH = 8  # bytes per mask: 64 worker slots before the masks are widened (always a multiple of 8)


class SlotIndex(PrefixIndex):
    """A `PrefixIndex` whose hashes also map to `width`-byte little-endian masks of the slots holding them (in any
    tier). A worker gets a slot when its first block is stored and frees it when it is forgotten; `epoch` changes
    whenever any worker's slot does, so callers may cache `slots_for`."""

    def __init__(self, max_entries: int = 1_000_000):
        super().__init__(max_entries)
        self._masks: dict[int, bytes] = {}  # hash -> holders' slot bits (the same keys as `_holders`)
        self._slot: dict[str, int] = {}  # worker_id -> its slot
        self._free: list[int] = []
        self.width = _INITIAL_WIDTH
        self.epoch = 0
        self._zeros = np.zeros(self.capacity + 1, np.int64)
        self._empty = bytes(self.width)  # what `depths` reads for a hash nobody holds

    @property
    def capacity(self) -> int:
        return 8 * self.width

    def slots_for(self, worker_ids: Sequence[str]) -> np.ndarray:
        """Each worker's slot, or `capacity` (the always-zero last entry of `depths`) for one holding nothing."""
        unknown = self.capacity
        return np.array([self._slot.get(w, unknown) for w in worker_ids], np.intp)

    def depths(self, block_hashes: Sequence[int]) -> np.ndarray | None:
        """Per slot (and a final 0 for `capacity`): how many leading blocks of the prompt it holds; touches them as
        `match` does. None when one of the prompt's blocks is held in a host or disk tier somewhere: `match`
        then counts tiers (the rare, slower path)."""
        # NOTE: an unknown hash reads as an empty mask, so the running AND ends every prefix there: no Python
        # search for the first miss
        masks = list(map(self._masks.get, block_hashes, repeat(self._empty, len(block_hashes))))
        if not masks or masks[0] is self._empty:
            return self._zeros
        if self._offloaded and not self._offloaded.isdisjoint(block_hashes):
            return None  # NOTE: also where the offloaded block lies past every prefix: the per-view path decides
        words = np.frombuffer(b"".join(masks), "<u8").reshape(len(masks), self.width // 8)
        # NOTE: a running AND, so a worker that dropped out of the chain never counts deeper blocks (as `walk`)
        held = np.unpackbits(np.bitwise_and.accumulate(words, axis=0).view(np.uint8), axis=1, bitorder="little")
        out = np.zeros(self.capacity + 1, np.int64)
        out[:-1] = held.sum(axis=0, dtype=np.uint32)  # [slots]
        deepest = int(out.max())
        deque(map(self._holders.move_to_end, reversed(block_hashes[:deepest])), maxlen=0)
        return out

    def remove_worker(self, worker_id: str) -> bool:
        slot = self._slot.get(worker_id)
        if slot is not None:
            for block_hash in self._blocks.get(worker_id, ()):
                self._set_bit(block_hash, slot, False)
        known = super().remove_worker(worker_id)
        if slot is not None:
            del self._slot[worker_id]
            self._free.append(slot)
            self.epoch += 1
        return known

    # ---- the masks follow `_holders` ----

    def _store(self, worker_id: str, block_hash: int, bit: int) -> None:
        super()._store(worker_id, block_hash, bit)
        self._set_bit(block_hash, self._slot_of(worker_id), True)

    def _unstore(self, worker_id: str, block_hash: int, bit: int) -> None:
        super()._unstore(worker_id, block_hash, bit)
        holders = self._holders.get(block_hash)
        slot = self._slot.get(worker_id)
        if holders is not None and worker_id not in holders and slot is not None:
            self._set_bit(block_hash, slot, False)

    def _drop_if_empty(self, block_hash: int, holders: dict[str, int]) -> None:
        super()._drop_if_empty(block_hash, holders)
        if not holders:
            self._masks.pop(block_hash, None)

    def _evict(self) -> None:
        while len(self._holders) > self.max_entries:
            block_hash, holders = self._holders.popitem(last=False)
            self._offloaded.discard(block_hash)
            self._masks.pop(block_hash, None)
            for worker_id in holders:
                self._blocks[worker_id].discard(block_hash)

    def _slot_of(self, worker_id: str) -> int:
        slot = self._slot.get(worker_id)
        if slot is None:
            if not self._free:
                self._widen()
            slot = self._slot[worker_id] = self._free.pop()
            self.epoch += 1
        return slot

    def _widen(self) -> None:
        """Room for more workers: every mask grows (rare: the width doubles each time)."""
        old = self.capacity
        extra = bytes(self.width) if self._slot else b""
        self.width = self.width * 2 if self._slot else self.width
        if extra:
            self._masks = {h: m + extra for h, m in self._masks.items()}
        self._free = list(range(self.capacity - 1, (old if self._slot else 0) - 1, -1))
        self._zeros = np.zeros(self.capacity + 1, np.int64)
        self._empty = bytes(self.width)  # what `depths` reads for a hash nobody holds
        self.epoch += 1

    def _set_bit(self, block_hash: int, slot: int, on: bool) -> None:
        mask = self._masks.get(block_hash)
        if mask is None:
            if not on:
                return
            mask = bytes(self.width)
        byte, flag = slot >> 3, 1 << (slot & 7)
        if bool(mask[byte] & flag) == on:
            return
        edited = bytearray(mask)
        edited[byte] ^= flag
        self._masks[block_hash] = bytes(edited)
