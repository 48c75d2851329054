"""The KV tiers below the device pool as the engine core sees them: write-through of completed device blocks into
the host tier (deduplicated by block hash), disk admission of blocks seen twice, the prefix walk over host and
disk, the cost check (load a tier only where that beats recomputing), pins on what a copy in flight reads, and
per-tier events and counters. Pure: no torch, no I/O; the runner moves the bytes."""

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from engines.base.block_hash import NONE_HASH
from engines.base.events import KvTier
from engines.core.loads import BytesLoads, KvLoad, LoadDone
from engines.core.tiers.tier_pool import TierBlock, TierPool

MAX_DISK_WRITES_IN_FLIGHT = 256  # host slots a slow disk may pin at once; later sightings admit the rest


@dataclass(frozen=True, slots=True)
class TierSpec:
    """What a runner keeps below its device pool, in blocks of every layer (the unit a copy moves)."""

    num_host_blocks: int = 0
    num_disk_blocks: int = 0
    block_bytes: int = 0
    disk_min_seen: int = 2  # a block goes to disk only once it was computed or hit this many times

    def __post_init__(self) -> None:
        if min(self.num_host_blocks, self.num_disk_blocks, self.block_bytes) < 0 or self.disk_min_seen < 1:
            raise ValueError(f"bad tier spec {self}")
        if self.num_disk_blocks and not self.num_host_blocks:
            raise ValueError("the disk tier is fed from the host tier: give the host tier room too")

    @property
    def is_enabled(self) -> bool:
        return self.num_host_blocks > 0


@dataclass(frozen=True, slots=True)
class OnboardBlock:
    """One block an onboarding load reads: its tier, its host slot (disk: -1) and what it must hold."""

    tier: KvTier
    slot: int
    block_hash: int
    parent_hash: int
    token_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Onboard:
    """The source of an onboarding KvLoad: one entry per destination block, in token order."""

    blocks: tuple[OnboardBlock, ...]


@dataclass(frozen=True, slots=True)
class DiskWrite:
    """Copy a host slot's block to disk (the slot stays pinned until the runner acknowledges the write)."""

    block_hash: int
    parent_hash: int
    token_ids: tuple[int, ...]
    host_slot: int


@dataclass(slots=True)
class TierCounters:
    """Totals since start, per lower tier where it says so (what metrics export)."""

    hit_tokens: dict[KvTier, int] = field(default_factory=lambda: {KvTier.HOST: 0, KvTier.DISK: 0})
    onboarded_blocks: dict[KvTier, int] = field(default_factory=lambda: {KvTier.HOST: 0, KvTier.DISK: 0})
    num_host_offloaded: int = 0  # device -> host copies
    num_disk_written: int = 0  # host -> disk writes that succeeded
    num_disk_errors: int = 0
    num_disk_refused: int = 0  # files the disk tier refused: planted, another worker's, tampered or corrupt
    num_onboards: int = 0  # loads that ended well, and their summed latency
    onboard_s: float = 0.0


def beats_recompute(block_bytes: int, block_size: int, bytes_per_s: float, prefill_tokens_per_s: float) -> bool:
    """Loading a block takes less time than recomputing its tokens; with a figure not measured yet, assume so."""
    if bytes_per_s <= 0 or prefill_tokens_per_s <= 0:
        return True
    return block_bytes / bytes_per_s < block_size / prefill_tokens_per_s


class KvTiers:
    def __init__(self, spec: TierSpec, block_size: int):
        self.spec, self.block_size = spec, block_size
        self.host = TierPool(KvTier.HOST, spec.num_host_blocks)
        self.disk = TierPool(KvTier.DISK, spec.num_disk_blocks)
        self.is_disk_writable = spec.num_disk_blocks > 0
        self.counters = TierCounters()
        self._seen: OrderedDict[int, int] = OrderedDict()  # block hash -> sightings (bounded, LRU)
        self._max_seen = max(1024, 4 * (spec.num_host_blocks + spec.num_disk_blocks))
        self._writing: dict[int, TierBlock] = {}  # hash -> the pinned host block a disk write reads
        self._disk_writes: list[DiskWrite] = []
        self._disk_drops: list[int] = []  # disk blocks evicted: their files go
        self._loads: dict[str, list[TierBlock]] = {}  # load id -> the tier blocks it pinned
        self.in_flight: dict[int, str] = {}  # block hash -> the load onboarding it

    # -- write-through -----------------------------------------------------------------------
    def offload(
        self, blocks: Iterable[tuple[int, int, int, tuple[int, ...]]], seen: bool = True
    ) -> list[tuple[int, int]]:
        """Device blocks whose KV is now complete, as (block id, parent hash, hash, tokens): the (block id,
        host slot) copies to make. A hash the host holds is only touched; with `seen`, each block counts as a
        sighting (a block computed; not one just onboarded, already counted when it was found)."""
        copies = []
        for block_id, parent, block_hash, tokens in blocks:
            if block_hash in self.host:
                self.host.touch(block_hash)
            elif self.host.num_slots:
                block, _ = self.host.put(parent, block_hash, tokens)
                if block is not None:
                    copies.append((block_id, block.slot))
                    self.counters.num_host_offloaded += 1
            if seen:
                self.see(block_hash)
        return copies

    def see(self, block_hash: int) -> None:
        """Count a sighting (computed or hit); the `disk_min_seen`-th admits a host-held block to disk."""
        count = self._seen.pop(block_hash, 0) + 1
        self._seen[block_hash] = count
        while len(self._seen) > self._max_seen:
            self._seen.popitem(last=False)
        if count >= self.spec.disk_min_seen:
            self._maybe_write_disk(block_hash)

    def take_disk_writes(self) -> list[DiskWrite]:
        writes, self._disk_writes = self._disk_writes, []
        return writes

    def disk_written(self, block_hash: int, ok: bool) -> None:
        """The runner's word on one DiskWrite. A failed write stops writes to disk (full or unwritable)."""
        host_block = self._writing.pop(block_hash, None)
        if host_block is not None:
            host_block.num_pins -= 1
        if not ok:
            self.is_disk_writable = False
            self.counters.num_disk_errors += 1
            return
        if host_block is None:  # cleared meanwhile: the file belongs to nothing
            self._disk_drops.append(block_hash)
            return
        block, evicted = self.disk.put(host_block.parent_hash, block_hash, host_block.token_ids)
        self._disk_drops += [b.block_hash for b in evicted]
        if block is None:
            self._disk_drops.append(block_hash)
        else:
            self.counters.num_disk_written += 1

    def take_disk_drops(self) -> list[int]:
        drops, self._disk_drops = self._disk_drops, []
        return drops

    def restore_disk(self, blocks: Iterable[tuple[int, int, tuple[int, ...]]]) -> None:
        """Index blocks a previous run left on disk, as (hash, parent hash, tokens), oldest first."""
        for block_hash, parent, tokens in blocks:
            _, evicted = self.disk.put(parent, block_hash, tokens)
            self._disk_drops += [b.block_hash for b in evicted]

    # -- onboarding --------------------------------------------------------------------------
    def match(
        self,
        block_hashes: Sequence[int],
        token_ids: Sequence[int],
        start: int,
        stop: int,
        tiers: frozenset[KvTier] = frozenset((KvTier.HOST, KvTier.DISK)),
    ) -> list[OnboardBlock]:
        """Blocks `start`..`stop`-1 of a prompt held by the host tier, else by disk (each only if in `tiers`),
        up to the first miss or block a load is already onboarding."""
        bs, found = self.block_size, []
        for i in range(start, stop):
            block_hash = block_hashes[i]
            if block_hash in self.in_flight:
                break
            tokens = tuple(token_ids[i * bs : (i + 1) * bs])
            parent = block_hashes[i - 1] if i else NONE_HASH
            block = self.host.get(block_hash, parent, tokens) if KvTier.HOST in tiers else None
            tier = KvTier.HOST
            if block is None and KvTier.DISK in tiers:
                block, tier = self.disk.get(block_hash, parent, tokens), KvTier.DISK
            if block is None:
                break
            found.append(OnboardBlock(tier, block.slot if tier is KvTier.HOST else -1, block_hash, parent, tokens))
        return found

    def pin_load(self, load_id: str, blocks: Sequence[OnboardBlock]) -> None:
        """A load reads `blocks`: none of them is evicted, and another request needing one waits on this load."""
        pinned = []
        for b in blocks:
            tier_block = (self.host if b.tier is KvTier.HOST else self.disk).blocks[b.block_hash]
            tier_block.num_pins += 1
            pinned.append(tier_block)
            self.in_flight[b.block_hash] = load_id
        self._loads[load_id] = pinned

    def load_done(self, load_id: str, source: Onboard, ok: bool, seconds: float, is_hit: bool = True) -> None:
        """A load ended; with `is_hit`, its tokens count as prefix hits of their tier (not for a request that
        onboards again after a preemption: its hits were counted once)."""
        for tier_block in self._loads.pop(load_id, ()):
            tier_block.num_pins -= 1
        for b in source.blocks:
            if self.in_flight.get(b.block_hash) == load_id:
                del self.in_flight[b.block_hash]
            if ok:
                self.counters.onboarded_blocks[b.tier] += 1
                self.counters.hit_tokens[b.tier] += self.block_size if is_hit else 0
                (self.host if b.tier is KvTier.HOST else self.disk).touch(b.block_hash)
        if ok:
            self.counters.num_onboards += 1
            self.counters.onboard_s += seconds

    def drop(self, tier: KvTier, block_hashes: Iterable[int]) -> None:
        """Forget blocks a runner found unreadable (a corrupt or foreign disk file it already removed)."""
        pool = self.host if tier is KvTier.HOST else self.disk
        for block_hash in block_hashes:
            pool.remove(block_hash)

    # -- the rest ----------------------------------------------------------------------------
    def clear(self) -> None:
        """Forget every host and disk block (the prefix cache was reset); their disk files go."""
        self._disk_drops += [b.block_hash for b in self.disk.clear()]
        self.host.clear()
        self._writing.clear()
        self._disk_writes = []

    def drain(self) -> dict[KvTier, tuple[list[tuple[int, int]], list[int]]]:
        return {KvTier.HOST: self.host.drain(), KvTier.DISK: self.disk.drain()}

    def _maybe_write_disk(self, block_hash: int) -> None:
        if (
            not self.is_disk_writable
            or block_hash in self.disk
            or block_hash in self._writing
            or len(self._writing) >= MAX_DISK_WRITES_IN_FLIGHT
        ):
            return
        host_block = self.host.blocks.get(block_hash)
        if host_block is None:
            return
        host_block.num_pins += 1
        self._writing[block_hash] = host_block
        self._disk_writes.append(DiskWrite(block_hash, host_block.parent_hash, host_block.token_ids, host_block.slot))


@dataclass(frozen=True, slots=True)
class TierReport:
    """What a runner's tiers did since the last poll: disk writes acknowledged, blocks found unreadable."""

    disk_written: list[tuple[int, bool]] = field(default_factory=list)  # (hash, ok)
    corrupt: list[int] = field(default_factory=list)  # disk blocks whose files failed their checks (removed)
    num_refused: int = 0  # disk files refused (planted, foreign, tampered or corrupt) since the last poll


class TieredLoads(BytesLoads):
    """Runner methods: onboarding loads (an `Onboard` source) go to the runner's `tiers`; other loads as BytesLoads."""

    tiers = None

    def start_load(self, load: KvLoad) -> None:
        if isinstance(load.source, Onboard) and self.tiers is not None:
            return self.tiers.start_load(load)
        return super().start_load(load)

    def poll_loads(self) -> list[LoadDone]:
        return (self.tiers.poll_loads() if self.tiers is not None else []) + super().poll_loads()
