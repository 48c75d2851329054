"""Continuous-batching scheduler: a per-step token budget shared by decodes and (chunked) prefills,
prefix-cache hits on admission, preemption by recompute, and committing a step's sampled tokens
(`update_from_output`), with speculative decoding's proposals verified in the same batch. No torch, no I/O, no clock."""
from collections import deque
from dataclasses import dataclass, field

from engines.base.types import FinishReason, TokenLogprob
from engines.core.block_manager import BlockManager
from engines.core.sequence import Sequence, SequenceStatus
from engines.core.speculative import Proposer, SpecConfig, Speculator

# what a runner returns per sampling sequence, in `SchedulerOutput.sampling` order: one token, or for a sequence
# that verified proposed tokens, the tokens it accepted (the agreeing proposals and one more)
Sampled = tuple[int, TokenLogprob | None]
StepTokens = Sampled | list[Sampled]


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    enable_chunked_prefill: bool = True
    spec: SpecConfig = SpecConfig()


@dataclass(frozen=True, slots=True)
class ScheduledSeq:
    seq: Sequence
    num_new_tokens: int  # tokens computed this step, from seq.num_computed_tokens on (proposed ones included)
    start: int  # seq.num_computed_tokens when scheduled
    spec_token_ids: tuple[int, ...] = ()  # proposed tokens verified after the last one; never in seq.token_ids

    @property
    def samples(self) -> bool:
        """True when this step reaches the sequence's last token, so a new token is sampled."""
        return self.start + self.num_new_tokens - len(self.spec_token_ids) == self.seq.num_tokens

    def input_ids(self) -> list[int]:
        """The token ids this step computes: the sequence's, then the proposed ones."""
        end = self.start + self.num_new_tokens - len(self.spec_token_ids)
        return self.seq.token_ids[self.start : end] + list(self.spec_token_ids)


@dataclass(slots=True)
class SchedulerOutput:
    scheduled: list[ScheduledSeq] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    num_blocks_used: int = 0  # KV blocks in use once this step's are allocated (what a timing model reads)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def sampling(self) -> list[ScheduledSeq]:
        """The scheduled sequences that sample a token this step, in schedule order."""
        return [s for s in self.scheduled if s.samples]


class Scheduler:
    def __init__(self, config: SchedulerConfig, block_manager: BlockManager, proposer: Proposer | None = None):
        self.config = config
        self.block_manager = block_manager
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
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

    def schedule(self, stop_at: Sequence | None = None) -> SchedulerOutput:
        """The next step; admission stops at `stop_at` (a waiting request that must not be admitted yet)."""
        out = SchedulerOutput()
        budget = self._schedule_running(out, self.config.max_num_batched_tokens)
        if not out.preempted:  # NOTE: admitting while preempting would thrash
            self._schedule_waiting(out, budget, stop_at)
        out.num_blocks_used = self.block_manager.num_blocks - self.block_manager.num_free_blocks
        return out

    def update_from_output(self, out: SchedulerOutput, sampled: list[StepTokens]) -> list[Sequence]:
        """Commit a step: computed tokens advance, each sampling sequence gets its token(s) (`sampled`, in
        `out.sampling` order), finished ones leave. Returns the sequences that got a token."""
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
        return self.speculator.propose(seq.req_id, seq.token_ids, seq.spec, room, len(self.running),
                                       seq.params.is_greedy)

    def _schedule_waiting(self, out: SchedulerOutput, budget: int, stop_at: Sequence | None) -> None:
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            if seq is stop_at:
                return
            computed = self.block_manager.get_computed_blocks(seq) if seq.num_computed_tokens == 0 else []
            num_cached = len(computed) * self.block_manager.block_size
            num_new = seq.num_tokens - seq.num_computed_tokens - num_cached
            if num_new > budget and not self.config.enable_chunked_prefill:
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
