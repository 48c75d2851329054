"""The tiering plug-in the scheduler calls at its hooks: `match` (a waiting request's prefix in the host or disk
tier, or the load already bringing its next block: one load per block, no convoy), `allocated` (its load's blocks
are given: pin and record), `loads_done` and `step_done` (write newly complete device blocks through to the host
tier; blocks seen twice go on to disk). Also the measured prefill rate the cost check weighs a load against, and the
tiers' events and counters. Holds no reference to the scheduler or the core; pure: no torch, no I/O (the runner's
tier methods move the bytes)."""

import logging
from dataclasses import dataclass
from typing import Protocol

from engines.base.events import KvTier
from engines.core.block_manager import BlockManager
from engines.core.loads import KvLoad, LoadDone
from engines.core.sequence import Sequence
from engines.core.step import SchedulerOutput
from engines.core.tiers.kv_tiers import DiskWrite, KvTiers, Onboard, TierReport, TierSpec, beats_recompute

log = logging.getLogger(__name__)
PREFILL_EWMA = 0.2  # weight of the newest step in the measured prefill rate
MIN_PREFILL_TOKENS = 64  # steps with fewer prompt tokens say little about the prefill rate
Completed = tuple[int, int, int, tuple[int, ...]]  # (block id, parent hash, hash, tokens)


class TierRunner(Protocol):
    """A runner's `tiers`: what it moves below its device pool. Onboarding loads go through the runner's
    start_load/poll_loads like any KV load (their source is an `Onboard`)."""

    tier_spec: TierSpec
    bytes_per_s: dict[KvTier, float]  # measured load bandwidth per tier; 0 while unknown
    prefill_tokens_per_s: float  # a prior for the cost check until the core has measured; 0: none

    def offload(self, copies: list[tuple[int, int]]) -> None: ...
    def write_disk(self, writes: list[DiskWrite]) -> None: ...
    def drop_disk(self, block_hashes: list[int]) -> None: ...
    def poll_tiers(self) -> TierReport: ...
    def restored_disk_blocks(self) -> list[tuple[int, int, tuple[int, ...]]]: ...


@dataclass(frozen=True, slots=True)
class TierMatch:
    """What the tiers offer a waiting request: load `source` after its device hits `hits`, or (`load_id` set)
    wait for the load in flight that brings its next block."""

    hits: list[int]
    source: Onboard | None = None
    load_id: str | None = None


@dataclass(slots=True)
class _Onboarding:
    source: Onboard
    block_ids: tuple[int, ...]
    started_s: float
    is_hit: bool  # its tokens are prefix hits of the request's first admission (not one after a preemption)


class Tiering:
    def __init__(self, runner: TierRunner, block_manager: BlockManager, clock):
        """`runner`: the runner's `tiers` object."""
        self.runner, self.bm, self.clock = runner, block_manager, clock
        self.tiers = KvTiers(runner.tier_spec, block_manager.block_size)
        self.prefill_tokens_per_s = runner.prefill_tokens_per_s
        self._onboarding: dict[str, _Onboarding] = {}  # load id -> what it brings
        self._step_started_s = 0.0
        self.tiers.restore_disk(runner.restored_disk_blocks())  # a warm restart: announced as STORED on disk
        self._flush()

    # -- the match hook ----------------------------------------------------------------------
    def match(self, seq: Sequence) -> TierMatch | None:
        """The tier blocks that go on `seq`'s device prefix hits (only tiers whose load beats recomputing), or
        the load in flight already bringing its next block; None when the tiers hold nothing for it."""
        bs = self.bm.block_size
        hits = self.bm.get_computed_blocks(seq)  # NOTE: extends seq.block_hashes up to `stop`
        start, stop = len(hits), (seq.num_tokens - 1) // bs
        for block_hash in seq.block_hashes[:start]:
            self.tiers.see(block_hash)
        load_id = self.tiers.in_flight.get(seq.block_hashes[start]) if start < stop else None
        if load_id is not None:
            return TierMatch(hits, load_id=load_id)
        found = self.tiers.match(seq.block_hashes, seq.token_ids, start, stop, self._worth_loading())
        return TierMatch(hits, Onboard(tuple(found))) if found else None

    # -- the after-allocation hook -----------------------------------------------------------
    def allocated(self, seq: Sequence, load: KvLoad) -> None:
        """`load` (an `Onboard` source) has its destination blocks: pin what it reads, so that no other load
        brings them again and no eviction drops them before the copy."""
        source = load.source
        assert isinstance(source, Onboard)  # NOTE: the scheduler allocates tier loads with the match's source
        self.tiers.pin_load(load.req_id, source.blocks)
        for b in source.blocks:
            self.tiers.see(b.block_hash)
        self._onboarding[load.req_id] = _Onboarding(source, load.block_ids, self.clock(), not seq.was_admitted)
        self._flush()

    def _worth_loading(self) -> frozenset[KvTier]:
        """The cost check: the tiers whose load of a block beats recomputing its tokens."""
        spec, rate = self.tiers.spec, self.prefill_tokens_per_s
        return frozenset(
            t
            for t in (KvTier.HOST, KvTier.DISK)
            if beats_recompute(spec.block_bytes, self.bm.block_size, self.runner.bytes_per_s[t], rate)
        )

    # -- after a load ------------------------------------------------------------------------
    def loads_done(self, done: list[LoadDone]) -> None:
        """Count and unpin finished onboarding loads, write their blocks through to host (from disk)."""
        for result in done:
            entry = self._onboarding.pop(result.req_id, None)
            if entry is not None:
                self.tiers.load_done(
                    result.req_id, entry.source, result.ok, self.clock() - entry.started_s, entry.is_hit
                )
                if result.ok:
                    self._write_through(
                        [
                            (b, s.parent_hash, s.block_hash, s.token_ids)
                            for b, s in zip(entry.block_ids, entry.source.blocks)
                        ],
                        seen=False,
                    )
        self.poll()

    # -- after a step ------------------------------------------------------------------------
    def step_started(self) -> None:
        self._step_started_s = self.clock()

    def completed(self, out: SchedulerOutput) -> list[Completed]:
        """Device blocks the step completes (call before the commit frees finished requests' blocks)."""
        bs, blocks, found = self.bm.block_size, self.bm.blocks, []
        for s in out.scheduled:
            seq = s.seq
            for i in range(s.start // bs, min((s.start + s.num_new_tokens) // bs, len(seq.block_table))):
                block = blocks[seq.block_table[i]]
                if block.block_hash is not None:
                    found.append((block.block_id, block.parent_hash, block.block_hash, block.token_ids))
        return found

    def step_done(self, out: SchedulerOutput, completed: list[Completed]) -> None:
        self._write_through(completed, seen=True)
        num_prompt = sum(
            min(s.num_new_tokens, s.seq.num_prompt_tokens - s.start)
            for s in out.scheduled
            if s.start < s.seq.num_prompt_tokens
        )
        seconds = self.clock() - self._step_started_s
        if num_prompt >= MIN_PREFILL_TOKENS and seconds > 0:
            rate, old = num_prompt / seconds, self.prefill_tokens_per_s
            self.prefill_tokens_per_s = rate if old <= 0 else (1 - PREFILL_EWMA) * old + PREFILL_EWMA * rate
        self.poll()

    def _write_through(self, blocks: list[Completed], seen: bool) -> None:
        copies = self.tiers.offload(blocks, seen)
        if copies:
            self.runner.offload(copies)
        self._flush()

    # -- the rest ----------------------------------------------------------------------------
    def poll(self) -> None:
        report = self.runner.poll_tiers()
        for block_hash, ok in report.disk_written:
            self.tiers.disk_written(block_hash, ok)
        self.tiers.counters.num_disk_refused += report.num_refused
        if report.corrupt:
            log.warning("KV disk tier: %d corrupt block(s) dropped; their tokens are recomputed", len(report.corrupt))
            self.tiers.drop(KvTier.DISK, report.corrupt)
        self._flush()

    def clear(self) -> None:
        self.tiers.clear()
        self._flush()

    def drain(self) -> dict[KvTier, tuple[list[tuple[int, int]], list[int]]]:
        return self.tiers.drain()

    def stats(self) -> dict:
        """The EngineStats fields of the tiers."""
        t, c = self.tiers, self.tiers.counters
        return dict(
            num_host_blocks_total=t.host.num_slots,
            num_host_blocks_used=len(t.host),
            num_disk_blocks_total=t.disk.num_slots,
            num_disk_blocks_used=len(t.disk),
            kv_block_bytes=t.spec.block_bytes,
            prefix_hits_host=c.hit_tokens[KvTier.HOST],
            prefix_hits_disk=c.hit_tokens[KvTier.DISK],
            num_blocks_offloaded_host=c.num_host_offloaded,
            num_blocks_offloaded_disk=c.num_disk_written,
            num_blocks_onboarded_host=c.onboarded_blocks[KvTier.HOST],
            num_blocks_onboarded_disk=c.onboarded_blocks[KvTier.DISK],
            num_onboards=c.num_onboards,
            onboard_seconds=c.onboard_s,
            num_disk_write_errors=c.num_disk_errors,
            num_disk_blocks_refused=c.num_disk_refused,
            prefill_tokens_per_s=self.prefill_tokens_per_s,
            kv_host_bytes_per_s=self.runner.bytes_per_s[KvTier.HOST],
            kv_disk_bytes_per_s=self.runner.bytes_per_s[KvTier.DISK],
        )

    def _flush(self) -> None:
        writes = self.tiers.take_disk_writes()
        if writes:
            self.runner.write_disk(writes)
        drops = self.tiers.take_disk_drops()
        if drops:
            self.runner.drop_disk(drops)
