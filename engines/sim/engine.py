"""SimEngine: the Engine protocol over a SimWorker, sleeping each step's profiled duration (times
`time_factor`) on the event loop, so the real worker services can run a cluster of simulated GPUs.
Tokens are deterministic; KV events are the real block manager's; KV exports carry zero bytes."""
import asyncio
from collections.abc import AsyncIterator

from engines.base.requests import queue_stream, validate_request
from engines.base.errors import EngineBusyError, EngineError, RequestNotFoundError
from engines.base.events import KvEvent, KvSnapshot
from engines.base.types import EngineRequest, EngineStats, FinishReason, KvExport, KvLayout, RequestOutput
from engines.native.sequence import Sequence
from engines.sim.profile import TimingProfile, load_profile
from engines.sim.sim_core import SimWorker


class SimEngine:
    def __init__(self, profile: TimingProfile | str | None = None, time_factor: float = 1.0,
                 max_model_len: int = 131072, worker_id: str = "sim"):
        if time_factor < 0:
            raise ValueError(f"time_factor must be >= 0, got {time_factor}")
        self.profile = profile if isinstance(profile, TimingProfile) else load_profile(profile or "h100-llama3.1-8b")
        self.time_factor = time_factor
        self.max_model_len = max_model_len
        self.worker = SimWorker(worker_id, self.profile)
        self.kv_layout = KvLayout(1, 1, 1, "float32", self.profile.block_size)  # NOTE: exports stay tiny
        self._streams: dict[str, asyncio.Queue[RequestOutput]] = {}
        self._seqs: dict[str, Sequence] = {}  # live and held
        self._held: set[str] = set()
        self._aborts: set[str] = set()  # applied between steps, never inside one
        self._wake = asyncio.Event()
        self._kv_changed = asyncio.Event()
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="tandem-sim-engine")

    async def shutdown(self) -> None:
        if self._task is None:
            return
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        self._task = None
        for req_id in list(self._streams):
            self._publish(RequestOutput(req_id, (), finish_reason=FinishReason.ABORT))

    # -- the Engine protocol -----------------------------------------------------------------
    def add_request(self, request: EngineRequest) -> AsyncIterator[RequestOutput]:
        if self._task is None:
            raise EngineError("engine is not started")
        self._validate(request)
        seq = self.worker.make_seq(request.req_id, list(request.prompt_token_ids), request.params.max_tokens)
        seq.params, seq.hold_kv, seq.max_model_len = request.params, request.hold_kv, self.max_model_len
        stream: asyncio.Queue[RequestOutput] = asyncio.Queue()
        self._streams[request.req_id], self._seqs[request.req_id] = stream, seq
        num_imported = request.kv.num_tokens if request.kv is not None else 0
        asyncio.get_running_loop().create_task(self._admit(seq, num_imported))
        return self._stream(request.req_id, stream)

    async def abort(self, req_id: str) -> None:
        if req_id in self._held:
            self._drop_held(req_id)
        elif req_id in self._seqs:
            self._aborts.add(req_id)
            self._wake.set()

    def stats(self) -> EngineStats:
        bm, sched = self.worker.block_manager, self.worker.scheduler
        return EngineStats(
            num_waiting=len(sched.waiting), num_running=len(sched.running), num_held=len(self._held),
            num_blocks_total=bm.num_blocks, num_blocks_used=bm.num_blocks - bm.num_free_blocks,
            num_blocks_cached_free=bm.num_cached_free_blocks, block_size=bm.block_size,
            max_model_len=self.max_model_len, prefix_queries=sched.prefix_queries, prefix_hits=sched.prefix_hits,
            num_preemptions=sched.num_preemptions, num_prompt_tokens_computed=self.worker.num_prompt_tokens_computed,
            num_generated_tokens=self.worker.num_generated_tokens)

    async def export_kv(self, req_id: str) -> KvExport:
        if req_id not in self._held:
            raise RequestNotFoundError(f"no KV held for request {req_id!r}")
        seq = self._seqs[req_id]
        tokens = tuple(seq.token_ids[: seq.num_computed_tokens])
        num_blocks = self.worker.block_manager.num_blocks_for(len(tokens))
        data = bytes(2 * num_blocks * self.kv_layout.block_size * 4)  # [1, 2, n, bs, 1, 1] float32 zeros
        return KvExport(self.kv_layout, tokens, num_blocks, data)

    async def release_kv(self, req_id: str) -> None:
        if req_id not in self._held:
            raise RequestNotFoundError(f"no KV held for request {req_id!r}")
        self._drop_held(req_id)

    # -- KV events (the KvEventSource capability) --------------------------------------------
    async def kv_events_since(self, after_seq: int) -> list[KvEvent] | None:
        return self.worker.event_log.since(after_seq)

    async def kv_snapshot(self) -> KvSnapshot:
        return self.worker.event_log.snapshot()

    async def wait_kv_events(self, after_seq: int) -> None:
        changed = self._kv_changed
        if self.worker.event_log.last_seq <= after_seq:
            await changed.wait()

    async def reset_prefix_cache(self) -> int:
        """Drop every cached prefix and publish CLEARED; refused while requests hold blocks."""
        dropped = self.worker.block_manager.reset_prefix_cache()
        if dropped is None:
            raise EngineBusyError("the prefix cache cannot be reset while requests hold KV blocks")
        if self.worker.drain_events():
            self._kv_changed.set()
            self._kv_changed = asyncio.Event()
        return dropped

    # -- internals ---------------------------------------------------------------------------
    def _validate(self, request: EngineRequest) -> None:
        validate_request(request, self.max_model_len, self._seqs)

    async def _admit(self, seq: Sequence, num_imported: int) -> None:
        if num_imported:  # the pull of the prefill worker's KV takes the profile's transfer time
            await asyncio.sleep(self.profile.transfer_s(num_imported) * self.time_factor)
            self.worker.import_kv(seq, num_imported)
        self.worker.add(seq)
        self._wake.set()

    async def _run(self) -> None:
        while True:
            self._apply_aborts()
            plan = self.worker.begin_step() if self.worker.has_work else None
            if plan is None:
                self._wake.clear()
                await self._wake.wait()
                continue
            await asyncio.sleep(plan.duration_s * self.time_factor)
            result = self.worker.end_step(plan)
            for seq in result.emitted:
                self._emit(seq)
            if result.events:
                self._kv_changed.set()
                self._kv_changed = asyncio.Event()

    def _emit(self, seq: Sequence) -> None:
        new_ids, _ = seq.take_new_tokens()
        if seq.is_finished and seq.hold_kv:
            self._held.add(seq.req_id)
        elif seq.is_finished:
            self._seqs.pop(seq.req_id, None)
        self._publish(RequestOutput(seq.req_id, new_ids, (), seq.finish_reason, seq.num_prompt_tokens,
                                    seq.num_cached_tokens))

    def _apply_aborts(self) -> None:
        for req_id in sorted(self._aborts):
            seq = self._seqs.pop(req_id, None)
            if seq is not None and not seq.is_finished:
                self.worker.abort(seq)
                self._publish(RequestOutput(req_id, (), finish_reason=FinishReason.ABORT))
        self._aborts.clear()

    def _drop_held(self, req_id: str) -> None:
        self._held.discard(req_id)
        seq = self._seqs.pop(req_id)
        self.worker.block_manager.free(seq)

    def _publish(self, out: RequestOutput) -> None:
        stream = self._streams.get(out.req_id)
        if stream is not None:
            stream.put_nowait(out)

    def _stream(self, req_id: str, stream: asyncio.Queue) -> AsyncIterator[RequestOutput]:
        return queue_stream(req_id, stream, lambda: self._streams.pop(req_id, None), self.abort)
