"""KV events: what changed in one worker's prefix cache, numbered per worker, replayable from a bounded
ring and summarised by a snapshot when the ring no longer reaches back far enough.

Pure dataclasses: no torch, no I/O, no transport (the worker converts these to protos).
"""

from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

from engines.base.block_hash import NONE_HASH


class KvEventKind(str, Enum):
    STORED = "stored"
    REMOVED = "removed"
    CLEARED = "cleared"


class KvTier(str, Enum):
    DEVICE = "device"
    HOST = "host"
    DISK = "disk"


@dataclass(frozen=True, slots=True)
class KvEvent:
    """One change. STORED: `block_hashes` chain on `parent_hash` in order; REMOVED: they left `tier`;
    CLEARED: every block of the worker is gone. `seq` grows by one per event per worker."""

    seq: int
    kind: KvEventKind
    parent_hash: int = NONE_HASH
    block_hashes: tuple[int, ...] = ()
    tier: KvTier = KvTier.DEVICE


@dataclass(frozen=True, slots=True)
class KvSnapshot:
    """Every block a worker holds as of event `seq`, as STORED events (their `seq` is `seq` too)."""

    seq: int
    events: tuple[KvEvent, ...]


class KvEventLog:
    """Numbers one worker's events, keeps the last `max_events` for replay and the live blocks for a snapshot.

    NOTE: `seq` starts at 1; `after_seq=0` asks for everything since the worker started.
    """

    def __init__(self, max_events: int = 4096):
        if max_events < 1:
            raise ValueError(f"max_events must be >= 1, got {max_events}")
        self._ring: deque[KvEvent] = deque(maxlen=max_events)
        self._live: OrderedDict[tuple[int, KvTier], int] = OrderedDict()  # (hash, tier) -> parent hash
        self.last_seq = 0

    @property
    def num_blocks(self) -> int:
        return len(self._live)

    # ---- recording ----

    def stored(self, parent_hash: int, block_hashes: Iterable[int], tier: KvTier = KvTier.DEVICE) -> KvEvent:
        hashes = tuple(block_hashes)
        parent = parent_hash
        for block_hash in hashes:
            self._live[(block_hash, tier)] = parent
            parent = block_hash
        return self._append(KvEventKind.STORED, parent_hash, hashes, tier)

    def removed(self, block_hashes: Iterable[int], tier: KvTier = KvTier.DEVICE) -> KvEvent:
        hashes = tuple(block_hashes)
        for block_hash in hashes:
            self._live.pop((block_hash, tier), None)
        return self._append(KvEventKind.REMOVED, NONE_HASH, hashes, tier)

    def cleared(self) -> KvEvent:
        self._live.clear()
        return self._append(KvEventKind.CLEARED, NONE_HASH, (), KvTier.DEVICE)

    def record(
        self, stored: Iterable[tuple[int, int]], removed: Iterable[int], tier: KvTier = KvTier.DEVICE
    ) -> list[KvEvent]:
        """Turn a drain of (parent_hash, block_hash) pairs and removed hashes into events: removals first,
        then one STORED event per run of pairs that chain on each other."""
        events = []
        removed = tuple(removed)
        if removed:
            events.append(self.removed(removed, tier))
        for parent, hashes in _chains(stored):
            events.append(self.stored(parent, hashes, tier))
        return events

    def replay(self, event: KvEvent) -> None:
        """Apply an event another log numbered (an engine process's), keeping its seq: a mirror of that log."""
        if event.seq != self.last_seq + 1:
            raise ValueError(f"KV event {event.seq} does not follow {self.last_seq}")
        if event.kind is KvEventKind.STORED:
            self.stored(event.parent_hash, event.block_hashes, event.tier)
        elif event.kind is KvEventKind.REMOVED:
            self.removed(event.block_hashes, event.tier)
        else:
            self.cleared()

    # ---- reading ----

    def since(self, after_seq: int) -> list[KvEvent] | None:
        """Events with seq > `after_seq`; None when the ring no longer holds them all (or `after_seq` is
        from the future, e.g. the worker restarted) and the reader must take a snapshot instead."""
        if after_seq > self.last_seq:
            return None
        first = self._ring[0].seq if self._ring else self.last_seq + 1
        if after_seq < first - 1:
            return None
        return [e for e in self._ring if e.seq > after_seq]

    def snapshot(self) -> KvSnapshot:
        """The live blocks as STORED events, one per run that chains within a tier, in storage order."""
        events: list[KvEvent] = []
        for tier in KvTier:
            pairs = [(parent, h) for (h, t), parent in self._live.items() if t == tier]
            events += [
                KvEvent(self.last_seq, KvEventKind.STORED, parent, hashes, tier) for parent, hashes in _chains(pairs)
            ]
        return KvSnapshot(self.last_seq, tuple(events))

    def _append(self, kind: KvEventKind, parent_hash: int, hashes: tuple[int, ...], tier: KvTier) -> KvEvent:
        self.last_seq += 1
        event = KvEvent(self.last_seq, kind, parent_hash, hashes, tier)
        self._ring.append(event)
        return event


def _chains(pairs: Iterable[tuple[int, int]]) -> list[tuple[int, tuple[int, ...]]]:
    """Group (parent, hash) pairs into (first parent, hashes) runs where each hash chains on the last."""
    runs: list[tuple[int, list[int]]] = []
    for parent, block_hash in pairs:
        if runs and runs[-1][1][-1] == parent:
            runs[-1][1].append(block_hash)
        else:
            runs.append((parent, [block_hash]))
    return [(parent, tuple(hashes)) for parent, hashes in runs]
