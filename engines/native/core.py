"""EngineCore: the synchronous step loop — validate, admit, schedule, run, sample, emit deltas.
Runs on one thread; the async NativeEngine feeds it commands and drains its outputs."""
import time

from engines.base.events import KvEvent, KvEventLog, KvTier
from engines.base.requests import validate_request
from engines.base.errors import EngineBusyError, InvalidRequestError, RequestNotFoundError
from engines.base.types import EngineRequest, EngineStats, FinishReason, KvExport, RequestOutput, SamplingParams
from engines.native.block_manager import BlockManager
from engines.native.config import EngineConfig, ModelConfig
from engines.native.kv_cache import check_importable
from engines.native.model_runner import ModelRunner
from engines.native.sampler import make_generator
from engines.native.scheduler import ScheduledSeq, Scheduler, SchedulerConfig
from engines.native.sequence import Sequence, SequenceStatus


class EngineCore:
    def __init__(self, config: EngineConfig):
        self.config = config
        self.model_cfg = ModelConfig.from_dir(config.model)
        self.runner = ModelRunner(config, self.model_cfg)
        self.max_model_len = self.runner.max_model_len
        if not config.enable_chunked_prefill and config.max_num_batched_tokens < self.max_model_len:
            raise ValueError("without chunked prefill, max_num_batched_tokens must be >= max_model_len "
                             f"({config.max_num_batched_tokens} < {self.max_model_len})")
        self.block_manager = BlockManager(self.runner.num_blocks, config.block_size, config.enable_prefix_caching)
        sched_cfg = SchedulerConfig(config.max_num_seqs, config.max_num_batched_tokens, config.enable_chunked_prefill)
        self.scheduler = Scheduler(sched_cfg, self.block_manager)
        self.seqs: dict[str, Sequence] = {}  # live and held
        self.num_prompt_tokens_computed = 0
        self.num_generated_tokens = 0
        self.kv_events = KvEventLog()

    # -- commands ----------------------------------------------------------------------------
    def validate(self, request: EngineRequest) -> None:
        """Raise InvalidRequestError for anything this engine cannot serve."""
        validate_request(request, self.max_model_len)
        prompt, vocab = request.prompt_token_ids, self.model_cfg.vocab_size
        if min(prompt) < 0 or max(prompt) >= vocab:
            raise InvalidRequestError(f"prompt token ids must be in [0, {vocab})")
        if request.kv is not None:
            check_importable(self.runner.kv_layout, request.kv)
            if not 0 < request.kv.num_tokens < len(prompt) or prompt[: request.kv.num_tokens] != request.kv.token_ids:
                raise InvalidRequestError("imported KV must cover a strict prefix of the prompt's tokens")

    def add(self, request: EngineRequest) -> None:
        if request.req_id in self.seqs:
            raise InvalidRequestError(f"request id {request.req_id!r} is already in use")
        seq = Sequence(
            req_id=request.req_id, token_ids=list(request.prompt_token_ids),
            num_prompt_tokens=len(request.prompt_token_ids), params=request.params,
            eos_token_ids=self.model_cfg.eos_token_ids, max_model_len=self.max_model_len,
            hold_kv=request.hold_kv, generator=make_generator(request.params.seed, self.config.device),
            arrival_s=time.monotonic(),
        )
        if request.kv is not None:
            self._maybe_import(seq, request.kv)
        self.seqs[seq.req_id] = seq
        self.scheduler.add(seq)

    def abort(self, req_id: str) -> RequestOutput | None:
        seq = self.seqs.pop(req_id, None)
        if seq is None:
            return None
        if seq.status is SequenceStatus.HELD:
            self.block_manager.free(seq)
            return None
        seq.finish_reason = FinishReason.ABORT
        self.scheduler.finish(seq)
        return self._output(seq)

    def export_kv(self, req_id: str) -> KvExport:
        seq = self.seqs.get(req_id)
        if seq is None or seq.status is not SequenceStatus.HELD:
            raise RequestNotFoundError(f"no KV held for request {req_id!r}")
        num_tokens = seq.num_computed_tokens
        block_ids = seq.block_table[: self.block_manager.num_blocks_for(num_tokens)]
        return self.runner.kv_cache.export(block_ids, tuple(seq.token_ids[:num_tokens]))

    def release_kv(self, req_id: str) -> None:
        seq = self.seqs.get(req_id)
        if seq is None or seq.status is not SequenceStatus.HELD:
            raise RequestNotFoundError(f"no KV held for request {req_id!r}")
        self.abort(req_id)

    def expire_held(self, now: float) -> list[str]:
        expired = [s.req_id for s in self.seqs.values() if s.status is SequenceStatus.HELD and s.held_until <= now]
        for req_id in expired:
            self.abort(req_id)
        return expired

    def prompt_logits(self, token_ids: list[int]):
        """Next-token logits at every prompt position ([len, vocab] float32), for evaluation.

        Computed in scratch blocks, outside the request lifecycle; call between steps only.
        """
        seq = Sequence("__score__", list(token_ids), len(token_ids), SamplingParams(max_tokens=1))
        if not self.block_manager.allocate_slots(seq, len(token_ids)):
            raise InvalidRequestError("not enough free KV blocks to score this prompt")
        try:
            return self.runner.prompt_logits(ScheduledSeq(seq, len(token_ids), 0))
        finally:
            self.block_manager.free(seq)

    def drain_kv_events(self) -> list[KvEvent]:
        """Record what the block manager changed since the last drain (steps, imports, evictions)."""
        drained = self.block_manager.drain_events()
        cleared = [self.kv_events.cleared()] if drained.cleared else []
        return cleared + self.kv_events.record(((parent, h) for parent, h, _ in drained.stored), drained.removed,
                                               KvTier.DEVICE)

    def reset_prefix_cache(self) -> int:
        """Drop every cached prefix (published as a CLEARED event); refused while requests hold blocks."""
        dropped = self.block_manager.reset_prefix_cache()
        if dropped is None:
            raise EngineBusyError("the prefix cache cannot be reset while requests hold KV blocks")
        return dropped

    # -- the step ----------------------------------------------------------------------------
    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    def step(self) -> list[RequestOutput]:
        out = self.scheduler.schedule()
        if not out.scheduled:
            return []
        now = time.monotonic()
        for s in out.scheduled:
            if not s.seq.first_scheduled_s:
                s.seq.first_scheduled_s = now
        try:
            results = self.runner.execute(out)
        except Exception as exc:  # NOTE: a failed step fails its requests, never the engine
            return [self._fail(s.seq, f"engine step failed: {exc!r}") for s in out.scheduled]
        for s in out.scheduled:
            s.seq.num_computed_tokens = s.start + s.num_new_tokens
            if s.start < s.seq.num_prompt_tokens:
                self.num_prompt_tokens_computed += min(s.num_new_tokens, s.seq.num_prompt_tokens - s.start)
        for s, token, logprob in results:
            s.seq.append_token(token)
            if logprob is not None:
                s.seq.pending_logprobs.append(logprob)
        self.num_generated_tokens += len(results)
        return [self._emit(s.seq) for s, _, _ in results]

    def _emit(self, seq: Sequence) -> RequestOutput:
        if seq.is_finished:
            self.scheduler.finish(seq)
            if seq.status is SequenceStatus.HELD:
                seq.held_until = time.monotonic() + self.config.held_kv_ttl_s
            else:
                del self.seqs[seq.req_id]
        return self._output(seq)

    def _fail(self, seq: Sequence, message: str) -> RequestOutput:
        self.block_manager.uncache_from(seq, seq.num_computed_tokens)
        seq.finish_reason = FinishReason.ERROR
        self.scheduler.finish(seq)
        self.seqs.pop(seq.req_id, None)
        return self._output(seq, error=message)

    def _output(self, seq: Sequence, error: str | None = None) -> RequestOutput:
        new_ids, logprobs = seq.take_new_tokens()
        queue_s = seq.first_scheduled_s - seq.arrival_s if seq.first_scheduled_s else None
        return RequestOutput(seq.req_id, new_ids, logprobs, seq.finish_reason, seq.num_prompt_tokens,
                             seq.num_cached_tokens, error, queue_s)

    def _maybe_import(self, seq: Sequence, kv: KvExport) -> None:
        """Place imported KV in fresh blocks; with no room, fall back to computing it here."""
        if not self.block_manager.allocate_slots(seq, kv.num_tokens):
            return
        self.runner.kv_cache.import_(seq.block_table, kv)
        seq.num_computed_tokens = kv.num_tokens
        seq.num_cached_tokens = kv.num_tokens

    def stats(self) -> EngineStats:
        bm, sched = self.block_manager, self.scheduler
        return EngineStats(
            num_waiting=len(sched.waiting), num_running=len(sched.running),
            num_held=sum(1 for s in self.seqs.values() if s.status is SequenceStatus.HELD),
            num_blocks_total=bm.num_blocks, num_blocks_used=bm.num_blocks - bm.num_free_blocks,
            num_blocks_cached_free=bm.num_cached_free_blocks, block_size=bm.block_size,
            max_model_len=self.max_model_len, prefix_queries=sched.prefix_queries,
            prefix_hits=sched.prefix_hits, num_preemptions=sched.num_preemptions,
            num_prompt_tokens_computed=self.num_prompt_tokens_computed,
            num_generated_tokens=self.num_generated_tokens,
        )
