"""EngineCore: one engine's requests over a Runner — add, run the scheduler's steps, emit deltas, hold and export
KV, start KV loads, record KV events, count stats; the Scheduler alone moves requests between its queues. Synchronous
and single-threaded; the engine loop (loop.py) or the cluster simulator (virtual time) drives it. No torch, no I/O."""

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from engines.base.engine_configs import BatchConfig, TransferConfig
from engines.base.errors import EngineBusyError, InvalidRequestError, RequestNotFoundError
from engines.base.events import KvEvent, KvEventLog, KvTier
from engines.base.requests import check_importable, check_kv_prefix, check_token_ids, validate_request
from engines.base.structured import refuse_structured
from engines.base.types import EngineRequest, EngineStats, FinishReason, KvExport, RequestOutput, SamplingParams
from engines.core.block_manager import BlockManager
from engines.core.loads import KvSource, LoadDone
from engines.core.runner import PendingStep, Runner, RunnerInfo
from engines.core.scheduler import Scheduler, SchedulerConfig
from engines.core.sequence import Sequence, SequenceStatus
from engines.core.speculative import Proposer, SpecConfig
from engines.core.step import SchedulerOutput, StepTokens
from engines.core.tiers.tiering import Tiering

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CoreConfig:
    # the scheduler's limits, chunked prefill and prefix caching (max_model_len: the runner's)
    batch: BatchConfig = BatchConfig()
    transfer: TransferConfig = TransferConfig()  # held_kv_ttl_s: a prefilled request's blocks are freed if not taken
    spec: SpecConfig = SpecConfig()  # speculative decoding (off by default)


def validate(request: EngineRequest, info: RunnerInfo) -> None:
    """Raise InvalidRequestError (or KvLayoutMismatchError) for anything an engine of `info` cannot serve."""
    validate_request(request, info.max_model_len)
    check_token_ids(request.all_token_ids, info.vocab_size)
    check_shaping(request.params, info)
    if not info.can_constrain:
        refuse_structured(request.params.structured)
    if isinstance(request.kv, KvExport):
        check_importable(info.kv_layout, request.kv)
        check_kv_prefix(request.kv.token_ids, request.all_token_ids)


def check_shaping(params: SamplingParams, info: RunnerInfo) -> None:
    """Logit-shaping parameters need logits, and biased token ids must be in the vocabulary."""
    refused = params.shaping_fields() if info.no_logits else ()
    if refused:
        raise InvalidRequestError(
            f"the {info.no_logits} engine draws tokens without logits and cannot honour "
            f"{', '.join(refused)}; send {refused[0]} only to a native or trtllm engine"
        )
    if params.logit_bias and params.logit_bias[-1][0] >= info.vocab_size:
        raise InvalidRequestError(
            f"logit_bias token ids must be in [0, {info.vocab_size}), got {params.logit_bias[-1][0]}"
        )


class EngineCore:
    def __init__(
        self,
        config: CoreConfig,
        runner: Runner,
        clock: Callable[[], float] = time.monotonic,
        proposer: Proposer | None = None,
    ):
        """`proposer`: speculative decoding's, when not the config's default (n-gram prompt lookup)."""
        self.config, self.runner, self.info, self.clock = config, runner, runner.info, clock
        if not config.batch.enable_chunked_prefill and config.batch.max_num_batched_tokens < self.info.max_model_len:
            raise ValueError(
                "without chunked prefill, max_num_batched_tokens must be >= max_model_len "
                f"({config.batch.max_num_batched_tokens} < {self.info.max_model_len})"
            )
        if config.spec.is_enabled and not self.info.can_speculate:
            raise ValueError("this engine cannot verify proposed tokens: speculative decoding needs the native engine")
        self.block_manager = BlockManager(
            self.info.num_blocks, self.info.kv_layout.block_size, config.batch.enable_prefix_caching
        )
        self.seqs: dict[str, Sequence] = {}  # live and held
        self.held: OrderedDict[str, Sequence] = OrderedDict()  # NOTE: one TTL, so insertion order is expiry order
        self.failed_loads: list[RequestOutput] = []  # outputs of imports that could not start, not yet taken
        self.kv_events = KvEventLog()
        tiers = getattr(runner, "tiers", None)  # a runner with KV tiers below its device pool
        self.tiering = (
            Tiering(tiers, self.block_manager, clock)
            if tiers is not None and tiers.tier_spec.is_enabled and config.batch.enable_prefix_caching
            else None
        )
        self.scheduler = Scheduler(
            SchedulerConfig(config.batch, config.spec),
            self.block_manager,
            proposer,
            self.tiering,
        )

    # -- commands ----------------------------------------------------------------------------
    def add(self, request: EngineRequest) -> None:
        """Enqueue a request `validate` accepted; raises InvalidRequestError for a live id."""
        if request.req_id in self.seqs:
            raise InvalidRequestError(f"request id {request.req_id!r} is already in use")
        seq = Sequence(
            req_id=request.req_id,
            token_ids=list(request.all_token_ids),
            num_prompt_tokens=len(request.prompt_token_ids),
            params=request.params,
            eos_token_ids=self.info.eos_token_ids,
            max_model_len=self.info.max_model_len,
            hold_kv=request.hold_kv,
            num_emitted_tokens=len(request.output_token_ids),
            arrival_s=self.clock(),
            hash_root=request.hash_root,
        )
        source = self._kv_source(request)
        self.seqs[seq.req_id] = seq
        if source is None:
            self.scheduler.add(seq)
            return
        self.scheduler.add_import(seq, source)
        self._start_imports()

    def _kv_source(self, request: EngineRequest) -> KvSource | None:
        """Where the request's KV computed elsewhere comes from — its KvExport bytes, or the runner's reading of a
        handle — loaded the same way into blocks allocated now, or as soon as there are enough; None: none."""
        kv = request.kv
        if isinstance(kv, bytes) and kv:
            source: KvSource = self.runner.kv_source(kv)
        elif isinstance(kv, KvExport) and kv.num_tokens:
            source = kv  # NOTE: `validate` checked it against this engine's layout
        else:
            return None
        check_kv_prefix(source.token_ids, request.all_token_ids)
        return source

    def abort(self, req_id: str) -> RequestOutput | None:
        """End a live request (its last output, ABORT) or drop held KV (None). Unknown ids are ignored."""
        seq = self.seqs.pop(req_id, None)
        if seq is None:
            return None
        if seq.status is SequenceStatus.HELD:
            del self.held[req_id]
            self.runner.release_described(req_id)  # NOTE: before the blocks can go to another request
            self.scheduler.release(seq)
            return None
        seq.finish_reason = FinishReason.ABORT
        if seq.status is SequenceStatus.LOADING:
            self.scheduler.abort_loading(seq)
            return self._output(seq)
        self.scheduler.finish(seq)
        return self._output(seq)

    def export_kv(self, req_id: str, into: str = "", offset: int = 0) -> KvExport | bytes:
        """A held request's KV as bytes, or written `into` a staging file at `offset` (the handle naming it)."""
        return self.runner.export_kv(*self._computed_kv(self._held(req_id)), into, offset)

    def _computed_kv(self, seq: Sequence) -> tuple[list[int], tuple[int, ...]]:
        """The blocks holding `seq`'s computed tokens, and those tokens."""
        num_tokens = seq.num_computed_tokens
        return seq.block_table[: self.block_manager.num_blocks_for(num_tokens)], tuple(seq.token_ids[:num_tokens])

    def release_kv(self, req_id: str) -> None:
        self._held(req_id)
        self.abort(req_id)

    def expire_held(self, now: float) -> list[str]:
        expired = []
        while self.held and next(iter(self.held.values())).held_until <= now:
            expired.append(next(iter(self.held)))
            self.abort(expired[-1])
        return expired

    def drain_kv_events(self) -> list[KvEvent]:
        """Record what the block manager changed since the last drain (steps, imports, evictions)."""
        drained = self.block_manager.drain_events()
        events = [self.kv_events.cleared()] if drained.cleared else []
        events += self.kv_events.record(
            ((parent, h) for parent, h, _ in drained.stored), drained.removed, KvTier.DEVICE
        )
        for tier, (stored, removed) in self.tiering.drain().items() if self.tiering is not None else ():
            events += self.kv_events.record(stored, removed, tier)
        return events

    def reset_prefix_cache(self) -> int:
        """Drop every cached prefix (published as a CLEARED event); refused while requests hold blocks."""
        dropped = self.block_manager.reset_prefix_cache()
        if dropped is None:
            raise EngineBusyError("the prefix cache cannot be reset while requests hold KV blocks")
        if self.tiering is not None:  # NOTE: CLEARED says every block of the worker is gone: so they must be
            self.tiering.clear()
            self.tiering.drain()
        return dropped

    # -- KV loads ----------------------------------------------------------------------------
    def start_load(self, seq: Sequence, num_tokens: int, source: object) -> bool:
        """Give `seq` blocks for its next `num_tokens` tokens and have the runner fill them from `source`; the
        sequence is LOADING (out of the queues) until `poll_loads` sees the load end. False, with nothing
        changed, when the blocks are not there; the runner's InvalidRequestError (a source it cannot read)
        leaves nothing changed either."""
        load = self.scheduler.allocate_load(seq, num_tokens, source)
        if load is None:
            return False
        try:
            self.runner.start_load(load)
        except Exception:
            self.block_manager.truncate(seq, seq.num_computed_tokens // self.block_manager.block_size)
            raise
        self.scheduler.start_loading(seq, load)
        return True

    def join_load(self, seq: Sequence, load_id: str) -> None:
        """Have `seq` (already holding the load's blocks) wait on a load in flight instead of starting another."""
        self.scheduler.join_loading(seq, load_id)

    @property
    def has_loads(self) -> bool:
        return bool(self.scheduler.loading or self.scheduler.importing)

    def _start_imports(self) -> None:
        """Start the loads of the imports the scheduler lets start now, in order."""
        while (head := self.scheduler.next_import()) is not None:
            seq, source = head
            try:
                started = self.start_load(seq, len(source.token_ids), source)
            except Exception as exc:  # NOTE: a source that went bad while it waited fails its request alone
                seq.finish_reason = FinishReason.ERROR
                self.scheduler.drop_import(seq)
                self.seqs.pop(seq.req_id, None)
                self.failed_loads.append(self._output(seq, error=f"KV load failed: {exc}"))
                continue
            if not started:
                return

    def poll_loads(self) -> list[LoadDone]:
        """Apply the loads that ended: loaded sequences queue with their tokens computed; a failed load frees
        its blocks and the sequence computes the tokens itself; an aborted one lets its blocks go now."""
        self._start_imports()  # NOTE: first, so that an import whose load ends as it starts (bytes) ends here
        done = self.runner.poll_loads() if self.scheduler.loading else []
        self.scheduler.loads_done(done)
        return done

    def _start_new_loads(self) -> None:
        """Start the tier loads the scheduler planned; one the runner refuses ends as a failed load at once (its
        request computes those tokens)."""
        failed = []
        for load in self.scheduler.take_new_loads():
            try:
                self.runner.start_load(load)
            except Exception as exc:  # a runner that cannot read it
                log.warning("onboarding %s failed to start: %r", load.req_id, exc)
                failed.append(LoadDone(load.req_id, False, repr(exc)))
        if failed:
            self.scheduler.loads_done(failed)

    # -- the step ----------------------------------------------------------------------------
    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    def schedule(self) -> SchedulerOutput | None:
        """The next step's plan; None when nothing can run."""
        out = self.scheduler.schedule()
        self._start_new_loads()
        if not out.scheduled:
            return None
        now = self.clock()
        for s in out.scheduled:
            if not s.seq.first_scheduled_s:
                s.seq.first_scheduled_s = now
        return out

    def launch(self, out: SchedulerOutput) -> PendingStep:
        return self.runner.launch(out)

    def commit(self, out: SchedulerOutput, sampled: list[StepTokens]) -> list[RequestOutput]:
        """Apply a step's tokens; the deltas of every sequence that got one."""
        return [self._emit(seq) for seq in self.scheduler.update_from_output(out, sampled)]

    def fail(self, out: SchedulerOutput, exc: BaseException) -> list[RequestOutput]:
        """A failed step fails its requests, never the engine."""
        return [self._fail(s.seq, f"engine step failed: {exc!r}") for s in out.scheduled if not s.seq.is_finished]

    def step(self) -> list[RequestOutput]:
        """One step start to finish (no overlap): what the simulator and simple callers use."""
        self.poll_loads()
        out = self.schedule()
        if out is None:
            return []
        try:
            sampled = self.launch(out).wait()
        except Exception as exc:
            return self.fail(out, exc)
        return self.commit(out, sampled)

    def stats(self) -> EngineStats:
        bm, sched = self.block_manager, self.scheduler
        return EngineStats(
            num_waiting=sched.num_waiting,
            num_running=len(sched.running),
            num_held=sched.num_held,
            num_blocks_total=bm.num_blocks,
            num_blocks_used=bm.num_blocks - bm.num_free_blocks,
            num_blocks_cached_free=bm.num_cached_free_blocks,
            block_size=bm.block_size,
            max_model_len=self.info.max_model_len,
            prefix_queries=sched.prefix_queries,
            prefix_hits=sched.prefix_hits,
            num_preemptions=sched.num_preemptions,
            num_prompt_tokens_computed=sched.num_prompt_tokens_computed,
            num_generated_tokens=sched.num_generated_tokens,
            **(self.tiering.stats() if self.tiering is not None else {}),
            **self._grammar_stats(),
            **self._spec_stats(),
        )

    def _grammar_stats(self) -> dict:
        grammar_stats = getattr(self.runner, "grammar_stats", None)  # a runner that constrains sampling
        return grammar_stats() if grammar_stats is not None else {}

    def _spec_stats(self) -> dict:
        spec = self.scheduler.speculator
        if spec is None:
            return {}
        return {
            "num_spec_proposed": spec.num_proposed,
            "num_spec_accepted": spec.num_accepted,
            "num_spec_verify_steps": spec.num_verify_steps,
        }

    # -- internals ---------------------------------------------------------------------------
    def _emit(self, seq: Sequence) -> RequestOutput:
        if seq.status is SequenceStatus.HELD:
            seq.held_until = self.clock() + self.config.transfer.held_kv_ttl_s
            self.held[seq.req_id] = seq
            return self._output(seq, kv_handle=self.runner.describe_kv(seq.req_id, *self._computed_kv(seq)))
        if seq.is_finished:
            del self.seqs[seq.req_id]
        return self._output(seq)

    def _fail(self, seq: Sequence, message: str) -> RequestOutput:
        self.block_manager.uncache_from(seq, seq.num_computed_tokens)
        seq.finish_reason = FinishReason.ERROR
        self.scheduler.finish(seq)
        self.seqs.pop(seq.req_id, None)
        return self._output(seq, error=message)

    def _output(self, seq: Sequence, error: str | None = None, kv_handle: bytes = b"") -> RequestOutput:
        new_ids, logprobs = seq.take_new_tokens()
        queue_s = seq.first_scheduled_s - seq.arrival_s if seq.first_scheduled_s else None
        return RequestOutput(
            seq.req_id,
            new_ids,
            logprobs,
            seq.finish_reason,
            seq.num_prompt_tokens,
            seq.num_cached_tokens,
            error,
            queue_s,
            kv_handle,
        )

    def _held(self, req_id: str) -> Sequence:
        seq = self.held.get(req_id)
        if seq is None:
            raise RequestNotFoundError(f"no KV held for request {req_id!r}")
        return seq
