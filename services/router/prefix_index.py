"""The router's prefix index: block hash -> the workers holding it (and in which tiers), fed by each worker's
KV events with gap detection, queried for the longest cached prefix per worker.

Pure: no I/O, no transport. Block hashes come only from engines/base/block_hash.py.
"""

from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import NamedTuple

from engines.base.events import KvEvent, KvEventKind, KvSnapshot, KvTier

TIER_BITS = {KvTier.DEVICE: 1, KvTier.HOST: 2, KvTier.DISK: 4}
_DEVICE_BIT = TIER_BITS[KvTier.DEVICE]
_TIER_OF_BIT = {bit: tier for tier, bit in TIER_BITS.items()}


def best_tier(mask: int) -> KvTier:
    """The fastest tier in a non-empty tier mask."""
    return _TIER_OF_BIT[mask & -mask]


def walk(
    entries: Mapping[int, Mapping[str, object]],
    block_hashes: Sequence[int],
    on_block: Callable[[int, Mapping, set[str]], None] | None = None,
) -> tuple[dict[str, int], int]:
    """The walk along a prompt's chained hashes: per worker holding its first block, how many leading blocks it
    holds, and how deep the walk went. `on_block(hash, holders, active)` sees each block while someone holds it.

    NOTE: hashes are chained, so per block one dict lookup and one set comparison in C suffice; Python work per
    worker only where holders drop out (the costly part of routing a long prompt among many workers).
    """
    active: set[str] = set()
    ends: dict[str, int] = {}  # worker_id -> its prefix length, once it dropped out
    depth = 0
    for depth, block_hash in enumerate(block_hashes):
        holders = entries.get(block_hash)
        if holders is None:
            break
        if depth == 0:
            active = set(holders)
        elif len(holders) != len(active) or not active <= holders.keys():
            gone = active - holders.keys()
            ends.update(dict.fromkeys(gone, depth))
            active -= gone
            if not active:
                break
        if on_block is not None:
            on_block(block_hash, holders, active)
    else:
        depth = len(block_hashes)
    ends.update(dict.fromkeys(active, depth))
    return ends, depth


class CachedPrefix(NamedTuple):
    """One worker's longest cached prefix of a prompt: its blocks, by the fastest tier each sits in."""

    num_blocks: int
    num_host: int = 0
    num_disk: int = 0

    @property
    def num_device(self) -> int:
        return self.num_blocks - self.num_host - self.num_disk


class PrefixIndex:
    """Hashes are chained, so holding hash i implies holding the whole prefix up to block i: a flat map
    walked in prompt order is the radix tree. At most `max_entries` hashes; the least recently touched go.

    NOTE: a worker whose events skipped a seq is `stale`: its later events are ignored until `resync`
    replaces its blocks with a snapshot. Its old blocks still count meanwhile (an estimate, never a lie
    about output: the engine confirms every hit itself).
    """

    def __init__(self, max_entries: int = 1_000_000):
        if max_entries < 1:
            raise ValueError(f"max_entries must be >= 1, got {max_entries}")
        self.max_entries = max_entries
        self._holders: OrderedDict[int, dict[str, int]] = OrderedDict()  # hash -> {worker_id: tier mask}
        self._blocks: dict[str, set[int]] = {}  # worker_id -> hashes it holds
        self._seq: dict[str, int] = {}  # worker_id -> last seq applied
        self._offloaded: set[int] = set()  # hashes some holder has in no device tier (the slow path of `match`)
        self.stale: set[str] = set()

    def __len__(self) -> int:
        return len(self._holders)

    def blocks_per_worker(self) -> dict[str, int]:
        """How many indexed block hashes each worker holds (what its KV events told the router)."""
        return {worker_id: len(hashes) for worker_id, hashes in sorted(self._blocks.items()) if hashes}

    def last_seq(self, worker_id: str) -> int:
        """The seq to resume the worker's stream after (0: nothing applied yet)."""
        return self._seq.get(worker_id, 0)

    def worker_ids(self) -> list[str]:
        return sorted(self._seq)

    # ---- events ----

    def apply(self, worker_id: str, events: Iterable[KvEvent]) -> bool:
        """Apply events in order; False (and the worker marked stale) at the first gap in seq.
        Events at or below the last applied seq are duplicates of a replay and skipped."""
        if worker_id in self.stale:
            return False
        for event in events:
            expected = self._seq.get(worker_id, 0) + 1
            if event.seq < expected:
                continue
            if event.seq > expected:
                self.stale.add(worker_id)
                return False
            self._apply_one(worker_id, event)
            self._seq[worker_id] = event.seq
        return True

    def resync(self, worker_id: str, snapshot: KvSnapshot) -> None:
        """Replace everything known about the worker with its snapshot."""
        self.remove_worker(worker_id)
        for event in snapshot.events:
            self._apply_one(worker_id, event)
        self._seq[worker_id] = snapshot.seq

    def remove_worker(self, worker_id: str) -> bool:
        """Forget a worker that left, died or must resync; True when it was known."""
        self.stale.discard(worker_id)
        known = self._seq.pop(worker_id, None) is not None
        for block_hash in self._blocks.pop(worker_id, set()):
            holders = self._holders.get(block_hash)
            if holders is not None:
                holders.pop(worker_id, None)
                self._drop_if_empty(block_hash, holders)
        return known

    def retain_workers(self, live_worker_ids: Iterable[str]) -> list[str]:
        """Forget every worker not in `live_worker_ids` (the registry's sweep); returns them, sorted."""
        live = set(live_worker_ids)
        gone = sorted(w for w in set(self._seq) | set(self._blocks) if w not in live)
        for worker_id in gone:
            self.remove_worker(worker_id)
        return gone

    # ---- queries ----

    def match(self, block_hashes: Sequence[int]) -> dict[str, CachedPrefix]:
        """Per worker holding the first block: its longest cached prefix of the prompt, sorted by worker_id;
        offloaded blocks are counted by tier where the walk meets them."""
        slow: dict[str, list[int]] = {}  # worker_id -> [host, disk] blocks
        offloaded = self._offloaded

        def count_offloaded(block_hash: int, holders: Mapping, active: set[str]) -> None:
            if block_hash in offloaded:
                self._count_offloaded(holders, active, slow)

        ends, depth = walk(self._holders, block_hashes, count_offloaded if offloaded else None)
        self._touch(block_hashes[:depth])
        return {w: CachedPrefix(n, *slow.get(w, (0, 0))) for w, n in sorted(ends.items())}

    def flush_touches(self) -> None:
        """Make any LRU touch a query deferred (none here: `match` touches at once; `SlotIndex.depths` defers)."""

    def overlap(self, block_hashes: Sequence[int]) -> dict[str, int]:
        """Per worker: how many leading blocks of the prompt it holds (workers holding none are absent)."""
        return {w: prefix.num_blocks for w, prefix in self.match(block_hashes).items()}

    # ---- internals ----

    @staticmethod
    def _count_offloaded(holders: Mapping[str, int], active: set[str], slow: dict[str, list[int]]) -> None:
        for worker_id in active:
            tier = best_tier(holders[worker_id])
            if tier is not KvTier.DEVICE:
                slow.setdefault(worker_id, [0, 0])[0 if tier is KvTier.HOST else 1] += 1

    def _apply_one(self, worker_id: str, event: KvEvent) -> None:
        if event.kind is KvEventKind.STORED:
            self._touch([event.parent_hash])
            # NOTE: children first, so parents are touched last and a chain is evicted from its leaves
            for block_hash in reversed(event.block_hashes):
                self._store(worker_id, block_hash, TIER_BITS[event.tier])
            self._evict()
        elif event.kind is KvEventKind.REMOVED:
            for block_hash in event.block_hashes:
                self._unstore(worker_id, block_hash, TIER_BITS[event.tier])
        elif event.kind is KvEventKind.CLEARED:
            seq = self._seq.get(worker_id)
            self.remove_worker(worker_id)
            if seq is not None:
                self._seq[worker_id] = seq

    def _store(self, worker_id: str, block_hash: int, bit: int) -> None:
        holders = self._holders.setdefault(block_hash, {})
        holders[worker_id] = holders.get(worker_id, 0) | bit
        self._holders.move_to_end(block_hash)
        self._blocks.setdefault(worker_id, set()).add(block_hash)
        if not holders[worker_id] & _DEVICE_BIT:
            self._offloaded.add(block_hash)

    def _unstore(self, worker_id: str, block_hash: int, bit: int) -> None:
        holders = self._holders.get(block_hash)
        if holders is None or worker_id not in holders:
            return
        holders[worker_id] &= ~bit
        if not holders[worker_id]:
            del holders[worker_id]
            self._blocks[worker_id].discard(block_hash)
        elif not holders[worker_id] & _DEVICE_BIT:
            self._offloaded.add(block_hash)
        self._drop_if_empty(block_hash, holders)

    def _drop_if_empty(self, block_hash: int, holders: dict[str, int]) -> None:
        """Forget a hash nobody holds; a hash whose holders changed leaves `_offloaded` once all are on device."""
        if not holders:
            del self._holders[block_hash]
            self._offloaded.discard(block_hash)
        elif block_hash in self._offloaded and all(m & _DEVICE_BIT for m in holders.values()):
            self._offloaded.discard(block_hash)

    def _touch(self, block_hashes: Sequence[int]) -> None:
        for block_hash in reversed(block_hashes):  # parents end up most recent
            if block_hash in self._holders:
                self._holders.move_to_end(block_hash)

    def _evict(self) -> None:
        while len(self._holders) > self.max_entries:
            block_hash, holders = self._holders.popitem(last=False)
            self._offloaded.discard(block_hash)
            for worker_id in holders:
                self._blocks[worker_id].discard(block_hash)
