"""SimWorker: the real Scheduler, BlockManager and Sequence stepping in virtual time, each step's duration
taken from a TimingProfile instead of a model. Tokens are deterministic; KV events are real.

No clock, no sleeping, no I/O: the caller (the DES or SimEngine) owns time.
"""
from dataclasses import dataclass

from engines.base.events import KvEvent, KvEventLog
from engines.base.types import FinishReason, SamplingParams
from engines.native.block_manager import BlockManager
from engines.native.scheduler import Scheduler, SchedulerConfig, SchedulerOutput
from engines.native.sequence import Sequence
from engines.sim.profile import TimingProfile

VOCAB_SIZE = 32000


def next_token(seq: Sequence) -> int:
    """A deterministic token: depends only on the sequence's length (never an EOS: eos ids are empty)."""
    return (seq.num_tokens * 7919 + 17) % VOCAB_SIZE


def is_decode(num_new_tokens: int, start: int, seq: Sequence) -> bool:
    return num_new_tokens == 1 and start >= seq.num_prompt_tokens


@dataclass(slots=True)
class StepPlan:
    """One scheduled step and what it costs; `end_step` commits it."""

    out: SchedulerOutput
    duration_s: float
    num_prefill_tokens: int
    num_decodes: int


@dataclass(frozen=True, slots=True)
class StepResult:
    emitted: list[Sequence]  # sequences that got one new token this step
    finished: list[Sequence]
    events: list[KvEvent]


class SimWorker:
    def __init__(self, worker_id: str, profile: TimingProfile, enable_prefix_caching: bool = True):
        self.worker_id = worker_id
        self.profile = profile
        self.block_manager = BlockManager(profile.num_blocks, profile.block_size, enable_prefix_caching)
        config = SchedulerConfig(profile.max_num_seqs, profile.max_num_batched_tokens, enable_chunked_prefill=True)
        self.scheduler = Scheduler(config, self.block_manager)
        self.event_log = KvEventLog()
        self.busy_s = 0.0  # virtual time spent in steps
        self.num_steps = 0
        self.num_generated_tokens = 0
        self.num_prompt_tokens_computed = 0

    # -- requests ----------------------------------------------------------------------------
    def make_seq(self, req_id: str, token_ids: list[int], max_tokens: int) -> Sequence:
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        return Sequence(req_id=req_id, token_ids=token_ids, num_prompt_tokens=len(token_ids), params=params)

    def add(self, seq: Sequence) -> None:
        self.scheduler.add(seq)

    def import_kv(self, seq: Sequence, num_tokens: int) -> bool:
        """Place KV for the first `num_tokens` computed elsewhere; False (compute it here) when no room."""
        if not self.block_manager.allocate_slots(seq, num_tokens):
            return False
        seq.num_computed_tokens = num_tokens
        seq.num_cached_tokens = num_tokens
        return True

    def abort(self, seq: Sequence) -> None:
        seq.finish_reason = FinishReason.ABORT
        self.scheduler.finish(seq)

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    @property
    def active_fraction(self) -> float:
        bm = self.block_manager
        return (bm.num_blocks - bm.num_free_blocks) / bm.num_blocks

    # -- the step ----------------------------------------------------------------------------
    def begin_step(self) -> StepPlan | None:
        """Schedule the next step and price it; None when nothing can run."""
        out = self.scheduler.schedule()
        if not out.scheduled:
            return None
        num_decodes = sum(1 for s in out.scheduled if is_decode(s.num_new_tokens, s.start, s.seq))
        num_prefill = out.num_tokens - num_decodes
        duration = self.profile.step_s(num_prefill, num_decodes, self.active_fraction)
        return StepPlan(out, duration, num_prefill, num_decodes)

    def end_step(self, plan: StepPlan) -> StepResult:
        """Commit a step: computed tokens advance, sampling sequences get a token, finished ones leave."""
        emitted, finished = [], []
        for s in plan.out.scheduled:
            seq = s.seq
            seq.num_computed_tokens = s.start + s.num_new_tokens
            if seq.num_computed_tokens == seq.num_tokens and not seq.is_finished:
                seq.append_token(next_token(seq))
                emitted.append(seq)
                if seq.is_finished:
                    self.scheduler.finish(seq)
                    finished.append(seq)
        self.busy_s += plan.duration_s
        self.num_steps += 1
        self.num_generated_tokens += len(emitted)
        self.num_prompt_tokens_computed += plan.num_prefill_tokens
        return StepResult(emitted, finished, self.drain_events())

    def drain_events(self) -> list[KvEvent]:
        drained = self.block_manager.drain_events()
        cleared = [self.event_log.cleared()] if drained.cleared else []
        if not drained.stored and not drained.removed:
            return cleared
        return cleared + self.event_log.record(((p, h) for p, h, _ in drained.stored), drained.removed)
