"""Continuous-batching scheduler, the one owner of the request queues (waiting, running, loading, parked, and imports
waiting for blocks): a per-step token budget shared by decodes and (chunked) prefills, prefix-cache hits, imports
and tier loads on admission,
preemption by recompute, and committing a step's sampled tokens (`update_from_output`), with speculative
decoding's proposals verified in the same batch. No torch, no I/O, no clock."""

import itertools
import logging
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engines.base.engine_configs import BatchConfig
from engines.base.types import FinishReason
from engines.core.block_manager import BlockManager
from engines.core.loads import KvLoad, KvSource, LoadDone, Loading
from engines.core.sequence import Sequence, SequenceStatus
from engines.core.speculative import Proposer, SpecConfig, Speculator
from engines.core.step import ScheduledSeq, SchedulerOutput, StepTokens

if TYPE_CHECKING:
    from engines.core.tiers.tiering import Tiering

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    batch: BatchConfig = BatchConfig()  # max_num_seqs, the step's token budget, chunked prefill, prefix caching
    spec: SpecConfig = SpecConfig()


class Scheduler:
    """The one owner of the request queues: `waiting`, `running`, `loading` (KV loads in flight and the sequences
    they fill), `parked` (requests waiting for a tier load another request started) and `importing` (requests whose
    KV comes from elsewhere, waiting for blocks to load it into). Nothing else writes them; the tiering plug-in is
    called at its hooks and holds no reference back."""

    def __init__(
        self,
        config: SchedulerConfig,
        block_manager: BlockManager,
        proposer: Proposer | None = None,
        tiering: "Tiering | None" = None,
    ):
        self.config = config
        self.block_manager = block_manager
        self.tiering = tiering
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.loading: dict[str, Loading] = {}  # load id -> the load in flight and the sequences it fills
        self.parked: dict[str, list[Sequence]] = {}  # load id -> requests that look again when it ends
        self.importing: deque[tuple[Sequence, KvSource]] = deque()  # imports waiting for free blocks, in order
        self.new_loads: list[KvLoad] = []  # tier loads planned by `schedule`, for the core to start
        self.num_preemptions = 0
        self.prefix_queries = 0  # prompt tokens looked up in the prefix cache on admission
        self.prefix_hits = 0
        self.num_prompt_tokens_computed = 0
        self.num_generated_tokens = 0
        self.num_held = 0
        self.speculator = Speculator(config.spec, proposer) if config.spec.is_enabled else None

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def num_waiting(self) -> int:
        """Requests not running: queued, waiting for blocks to import into, loading KV, or parked on another
        request's load."""
        return (
            len(self.waiting)
            + len(self.importing)
            + sum(len(e.seqs) for e in self.loading.values())
            + sum(len(seqs) for seqs in self.parked.values())
        )

    # -- imports (KV computed elsewhere) ------------------------------------------------------
    def add_import(self, seq: Sequence, source: KvSource) -> None:
        """`seq` is LOADING (out of the queues) until blocks for its KV from `source` are free and its load starts."""
        seq.status = SequenceStatus.LOADING
        self.importing.append((seq, source))

    def next_import(self) -> tuple[Sequence, KvSource] | None:
        """The first import waiting for blocks, when it may start now (`_can_start_import`); None otherwise. Its
        load's start (`start_loading`) takes it out of the queue."""
        if not self.importing or not self._can_start_import(self.importing[0][0]):
            return None
        return self.importing[0]

    def drop_import(self, seq: Sequence) -> None:
        """`seq`, an import whose load has not started (its source went bad, or it was aborted), is finished."""
        self.importing = deque(p for p in self.importing if p[0] is not seq)
        seq.status = SequenceStatus.FINISHED

    def abort_loading(self, seq: Sequence) -> None:
        """An aborted LOADING sequence: one holding no blocks yet (an import waiting for them, or parked on a tier
        load) is finished now; one whose load is in flight keeps its blocks until `loads_done` sees the load end."""
        if not seq.block_table:  # NOTE: its blocks are still being written otherwise
            self.drop_import(seq)

    def _can_start_import(self, seq: Sequence) -> bool:
        """Start an import only when no queued sequence waits for blocks and the free blocks hold all the request
        may grow to: loaded blocks that cannot run would otherwise starve the queue (and preempted ones) for good."""
        if self.waiting:
            return False
        final = min(seq.num_prompt_tokens + seq.params.max_tokens, seq.max_model_len)
        return self.block_manager.num_blocks_for(final) <= self.block_manager.num_free_blocks

    def schedule(self) -> SchedulerOutput:
        """The next step. With tiers, waiting requests whose prefix a lower tier holds first get their loads
        planned (`new_loads`, for the core to start); a request that must wait for room to load is not admitted
        by computing what the tier holds."""
        stop_at = None
        if self.tiering is not None:
            stop_at = self._onboard_waiting()
            self.tiering.step_started()
        out = self._schedule(stop_at)
        if not out.scheduled and not self.running and self._holder_first():
            out = self._schedule(None)
        return out

    def _schedule(self, stop_at: Sequence | None) -> SchedulerOutput:
        """One pass; admission stops at `stop_at` (a waiting request that must not be admitted yet)."""
        out = SchedulerOutput()
        budget = self._schedule_running(out, self.config.batch.max_num_batched_tokens)
        if not out.preempted:  # NOTE: admitting while preempting would thrash
            self._schedule_waiting(out, budget, stop_at)
        out.num_blocks_used = self.block_manager.num_blocks - self.block_manager.num_free_blocks
        return out

    def update_from_output(self, out: SchedulerOutput, sampled: list[StepTokens]) -> list[Sequence]:
        """Commit a step: computed tokens advance, each sampling sequence gets its token(s) (`sampled`, in
        `out.sampling` order), finished ones leave. Returns the sequences that got a token."""
        # NOTE: the blocks the step completed are read before finished requests free them
        tiering = self.tiering
        completed = tiering.completed(out) if tiering is not None else None
        emitted = self._commit(out, sampled)
        if tiering is not None and completed is not None:
            tiering.step_done(out, completed)
        return emitted

    def _commit(self, out: SchedulerOutput, sampled: list[StepTokens]) -> list[Sequence]:
        for s in out.scheduled:
            seq = s.seq
            seq.num_computed_tokens = s.start + s.num_new_tokens - len(s.spec_token_ids)
            if s.start < seq.num_prompt_tokens:
                self.num_prompt_tokens_computed += min(s.num_new_tokens, seq.num_prompt_tokens - s.start)
        emitted = []
        for s, tokens in zip(out.sampling, sampled, strict=True):
            seq = s.seq
            if seq.is_finished:  # NOTE: aborted between schedule and commit; its blocks are gone
                continue
            num_before = seq.num_tokens
            for token_id, logprob in tokens if isinstance(tokens, list) else (tokens,):
                seq.append_token(token_id)
                if logprob is not None:
                    seq.pending_logprobs.append(logprob)
                if seq.is_finished:  # NOTE: accepted tokens past a stop or max_tokens are dropped
                    break
            self.num_generated_tokens += seq.num_tokens - num_before
            if s.spec_token_ids:
                self._settle_spec(s, seq.num_tokens - num_before)
            if seq.is_finished:
                self.finish(seq)
            emitted.append(seq)
        return emitted

    def _settle_spec(self, s: ScheduledSeq, num_appended: int) -> None:
        """After verification: the KV of the accepted tokens stays, the blocks past them go back (their KV, of
        rejected proposals, is never read: nothing was registered past the sequence's own tokens)."""
        seq = s.seq
        assert self.speculator is not None  # NOTE: only a speculating scheduler verifies proposals
        self.speculator.record(seq.spec, len(s.spec_token_ids), min(num_appended, len(s.spec_token_ids) + 1) - 1)
        seq.num_computed_tokens = seq.num_tokens - 1
        if not seq.is_finished:
            self.block_manager.truncate(seq, self.block_manager.num_blocks_for(seq.num_tokens))

    def finish(self, seq: Sequence) -> None:
        """Take a finished or aborted sequence out; a prefilled one keeps its blocks, held for export."""
        if self.speculator is not None:
            self.speculator.proposer.forget(seq.req_id)
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status is SequenceStatus.WAITING:
            self.waiting.remove(seq)
        if seq.finish_reason is FinishReason.PREFILLED and seq.block_table:
            seq.status = SequenceStatus.HELD
            self.num_held += 1
        else:
            self.release(seq)

    def release(self, seq: Sequence) -> None:
        """Free a finished sequence's blocks (a held one's when its KV was pulled, dropped or expired)."""
        if seq.status is SequenceStatus.HELD:
            self.num_held -= 1
        self.block_manager.free(seq)
        seq.status = SequenceStatus.FINISHED

    # -- KV loads ----------------------------------------------------------------------------
    def allocate_load(self, seq: Sequence, num_tokens: int, source: object) -> KvLoad | None:
        """Blocks for `seq`'s next `num_tokens` tokens, left out of the prefix cache until the load fills them,
        and the load that fills them; None, with nothing changed, when the blocks are not there."""
        start, bm = seq.num_computed_tokens, self.block_manager
        if start % bm.block_size:
            raise ValueError(f"a load starts at a block boundary, not at token {start}")
        if not bm.allocate_slots(seq, num_tokens, cache=False):
            return None
        blocks = seq.block_table[start // bm.block_size : bm.num_blocks_for(start + num_tokens)]
        return KvLoad(seq.req_id, tuple(blocks), num_tokens, source)

    def start_loading(self, seq: Sequence, load: KvLoad) -> None:
        """`seq` is LOADING (out of the queues, never scheduled or preempted) until `loads_done` sees `load` end."""
        self._take_out(seq)
        self.loading[load.req_id] = Loading(load, seq.num_computed_tokens, [seq])

    def join_loading(self, seq: Sequence, load_id: str) -> None:
        """`seq` (already holding the load's blocks) waits on a load in flight instead of starting another."""
        self._take_out(seq)
        self.loading[load_id].seqs.append(seq)

    def loads_done(self, done: list[LoadDone]) -> None:
        """Apply the loads that ended: loaded sequences queue with their tokens computed; a failed load frees
        its blocks and the sequence computes the tokens itself; an aborted one lets its blocks go now. Then
        the tiers count theirs, and the requests parked on each load look again."""
        for result in done:
            entry = self.loading.pop(result.req_id, None)
            if entry is None:
                continue
            if not result.ok:
                log.warning("KV load for %s failed (%s); computing its tokens instead", result.req_id, result.error)
            for seq in entry.seqs:
                self._loaded(seq, entry, result.ok)
        if self.tiering is None:
            return
        self.tiering.loads_done(done)
        for result in done:
            for seq in reversed(self.parked.pop(result.req_id, [])):
                if not seq.is_finished:  # NOTE: aborted parked requests hold no blocks: nothing to free
                    seq.may_onboard = result.ok
                    self.requeue(seq)

    def requeue(self, seq: Sequence) -> None:
        """Back to waiting after a load: ahead of every waiting request that holds no blocks, so that requests
        holding loaded blocks are admitted first (behind a head that cannot get blocks they would wait for good)."""
        seq.status = SequenceStatus.WAITING
        i = next((i for i, w in enumerate(self.waiting) if not w.block_table), len(self.waiting))
        self.waiting.insert(i, seq)

    def _take_out(self, seq: Sequence) -> None:
        if seq.status is SequenceStatus.WAITING and seq in self.waiting:
            self.waiting.remove(seq)
        elif self.importing and self.importing[0][0] is seq:  # NOTE: an import starts in order, from the head
            self.importing.popleft()
        seq.status = SequenceStatus.LOADING

    def _loaded(self, seq: Sequence, entry: Loading, ok: bool) -> None:
        bm = self.block_manager
        if seq.is_finished:  # aborted while loading
            bm.free(seq)
            seq.status = SequenceStatus.FINISHED
            return
        if ok:
            seq.num_computed_tokens = entry.start + entry.load.num_tokens
            if not seq.was_admitted:  # NOTE: loaded again after a preemption: counted the first time
                seq.num_cached_tokens += entry.load.num_tokens
            bm.cache_blocks(seq, seq.num_computed_tokens)
        else:  # NOTE: the blocks before the load stay; the tokens it was to fill are computed here
            bm.truncate(seq, entry.start // bm.block_size)
        self.requeue(seq)

    def _holder_first(self) -> bool:
        """Nothing runs and the head cannot get blocks: put the first waiting request that holds loaded blocks at
        the head (behind a head waiting for blocks it holds, it would wait for good)."""
        holder = next((seq for seq in self.waiting if seq.block_table), None)
        if holder is None or holder is self.waiting[0]:
            return False
        self.waiting.remove(holder)
        self.waiting.appendleft(holder)
        return True

    # -- tier loads (the tiering plug-in's match and after-allocation hooks) -------------------
    def _onboard_waiting(self) -> Sequence | None:
        """Look once at each request the scheduler may admit next: plan its load from a lower tier, or park it on
        the load of its next block. Stops at the first that cannot get blocks for its load (admission order) and
        returns it: it must not be admitted by computing what a lower tier holds, unless nothing runs, loads or
        holds loaded blocks (then no blocks would ever come free for it)."""
        room = self.config.batch.max_num_seqs - len(self.running)
        reserved = self._outstanding()
        for seq in list(itertools.islice(self.waiting, max(room, 0))):
            if seq.may_onboard and seq.num_computed_tokens == 0:
                after = self._maybe_onboard(seq, reserved)
                if after is None:
                    return seq if self._blocks_will_free() else None
                reserved = after
        return None

    def _maybe_onboard(self, seq: Sequence, reserved: int) -> int | None:
        """Plan `seq`'s tier load if it fits; the blocks then promised to requests holding loaded blocks, or None
        when its load must wait for room."""
        seq.may_onboard = False
        tiering = self.tiering
        assert tiering is not None  # NOTE: only a tiered scheduler marks requests that may onboard
        match = tiering.match(seq)
        if match is None:
            return reserved
        if match.load_id is not None:
            self._take_out(seq)
            self.parked.setdefault(match.load_id, []).append(seq)
            return reserved
        bm, source = self.block_manager, match.source
        assert source is not None  # NOTE: a match without a load in flight offers a source
        num_revived = sum(1 for b in match.hits if bm.blocks[b].ref_count == 0)
        # NOTE: a loaded request waits with its blocks held: load only if its whole prompt then fits beside every
        # other such request's (and one more block per running request), or waiting requests could hold the pool
        # among them with nothing left to run
        need = bm.num_blocks_for(seq.num_tokens) - len(match.hits)
        if num_revived + need > bm.num_free_blocks - len(self.running) - reserved:
            seq.may_onboard = True
            return None
        bm.allocate_slots(seq, 0, match.hits)
        if not seq.was_admitted:  # NOTE: a preempted request onboarding again was counted the first time
            seq.num_cached_tokens += len(match.hits) * bm.block_size
        load = self.allocate_load(seq, len(source.blocks) * bm.block_size, source)
        assert load is not None  # NOTE: the room check above counted its blocks
        tiering.allocated(seq, load)
        self.start_loading(seq, load)
        self.new_loads.append(load)
        return reserved + need - len(source.blocks)

    def take_new_loads(self) -> list[KvLoad]:
        """The tier loads `schedule` planned since the last call, for the core to start (in order)."""
        loads, self.new_loads = self.new_loads, []
        return loads

    def _blocks_will_free(self) -> bool:
        """Something runs, loads, or waits holding loaded blocks (admitted first, it runs and frees them)."""
        return bool(self.running or self.loading or any(s.block_table for s in self.waiting))

    def _outstanding(self) -> int:
        """Blocks the requests holding loaded (or loading) blocks, not yet running, still need for their prompts."""
        bm = self.block_manager
        holding = [s for entry in self.loading.values() for s in entry.seqs]
        holding += [s for s in self.waiting if s.block_table]
        return sum(max(bm.num_blocks_for(s.num_tokens) - len(s.block_table), 0) for s in holding)

    # -- internals ---------------------------------------------------------------------------
    def _schedule_running(self, out: SchedulerOutput, budget: int) -> int:
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            num_new = min(seq.num_uncomputed_tokens, budget)
            start = seq.num_computed_tokens
            spec = self._maybe_propose(seq, budget)
            if spec and self.block_manager.allocate_slots(seq, 1 + len(spec)):
                out.scheduled.append(ScheduledSeq(seq, 1 + len(spec), start, spec))
                budget -= 1 + len(spec)
                i += 1
                continue
            while not self.block_manager.allocate_slots(seq, num_new):
                victim = self.running.pop()  # the latest admitted goes first
                self._preempt(victim, out)
                if victim is seq:
                    return budget
            out.scheduled.append(ScheduledSeq(seq, num_new, start))
            budget -= num_new
            i += 1
        return budget

    def _maybe_propose(self, seq: Sequence, budget: int) -> tuple[int, ...]:
        """Tokens to verify with `seq`'s next decode: only a decoding, unconstrained sequence speculates, and never
        past its budget, its max_tokens or the model's length (one token more comes with every verification)."""
        if self.speculator is None or seq.num_uncomputed_tokens != 1 or seq.hold_kv or seq.params.structured:
            return ()
        room = min(seq.params.max_tokens - seq.num_output_tokens, seq.max_model_len - seq.num_tokens, budget) - 1
        return self.speculator.propose(
            seq.req_id, seq.token_ids, seq.spec, room, len(self.running), seq.params.is_greedy
        )

    def _schedule_waiting(self, out: SchedulerOutput, budget: int, stop_at: Sequence | None) -> None:
        while self.waiting and budget > 0 and len(self.running) < self.config.batch.max_num_seqs:
            seq = self.waiting[0]
            if seq is stop_at:
                return
            computed = self.block_manager.get_computed_blocks(seq) if seq.num_computed_tokens == 0 else []
            num_cached = len(computed) * self.block_manager.block_size
            num_new = seq.num_tokens - seq.num_computed_tokens - num_cached
            if num_new > budget and not self.config.batch.enable_chunked_prefill:
                return
            num_new = min(num_new, budget)
            start = seq.num_computed_tokens + num_cached
            if not self.block_manager.allocate_slots(seq, num_new, computed):
                return
            self._count_prefix(seq, num_cached)
            self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            out.scheduled.append(ScheduledSeq(seq, num_new, start))
            budget -= num_new

    def _count_prefix(self, seq: Sequence, num_cached: int) -> None:
        if not seq.was_admitted:  # a preempted sequence coming back is not a new query
            seq.was_admitted = True
            self.prefix_queries += seq.num_prompt_tokens
            self.prefix_hits += num_cached + seq.num_cached_tokens
            seq.num_cached_tokens += num_cached

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        self.block_manager.free(seq)
        seq.reset_for_recompute()
        self.waiting.appendleft(seq)
        out.preempted.append(seq)
        self.num_preemptions += 1
