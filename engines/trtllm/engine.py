"""TrtllmEngine: the Engine protocol over TensorRT-LLM's LLM API (pinned in config.TRTLLM_VERSION).

One LLM object per worker. Each request is one generate_async(streaming=True) call whose results a pump task
turns into tandem's deltas (outputs.py); hold_kv runs a context-only request and ends in PREFILLED with
TensorRT-LLM's disaggregated params as its kv_handle, and a request carrying them (`kv`) runs generation-only: the KV
crosses between workers through TensorRT-LLM's own cache transceiver, never through tandem. Two pollers drain
TensorRT-LLM's iteration stats and KV events, and a death watch (executor_failure) ends every stream with ABORT, so
the gateway moves them, once TensorRT-LLM's executor has shut down. tensorrt_llm is imported in start() only."""

import asyncio
import json
import logging
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from engines.base.engine import EngineCapabilities
from engines.base.errors import (
    EngineDiedError,
    EngineError,
    EngineUnavailableError,
    InvalidRequestError,
    RequestNotFoundError,
)
from engines.base.events import KvEvent, KvSnapshot
from engines.base.requests import queue_stream, validate_request
from engines.base.types import EngineRequest, EngineStats, FinishReason, KvExport, KvLayout, RequestOutput
from engines.transfer import transports
from engines.trtllm.api import TrtllmApi, executor_failure, load_api, require_package
from engines.trtllm.build import check_checkpoint, choose_backend, kv_dtype, llm_arguments, max_model_len
from engines.trtllm.checkpoint import read_checkpoint
from engines.trtllm.config import TrtllmConfig
from engines.trtllm.events import TrtllmKvEvents
from engines.trtllm.mapping import plan_request
from engines.trtllm.outputs import OutputStream
from engines.trtllm.stats import Counts, engine_stats

log = logging.getLogger(__name__)
POLL_TIMEOUT_S = 0.05  # how long a drain of stats or KV events waits for the next one
HEALTH_POLL_S = 0.5  # how often wait_failed asks TensorRT-LLM whether its executor is still up


@dataclass(slots=True)
class _Live:
    result: Any  # TensorRT-LLM's GenerationResult
    stream: OutputStream
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    closed: bool = False  # ended by abort() or shutdown(): the pump delivers nothing more
    counted: bool = False  # its prompt is in the counters
    pump: asyncio.Task | None = None


class TrtllmEngine:
    # NOTE: its KV moves through TensorRT-LLM's own transceiver (no export), and it has no prefix-cache reset
    capabilities = EngineCapabilities(kv_events=True, kv_transport=transports.TRTLLM)

    def __init__(self, config: TrtllmConfig, api: TrtllmApi | None = None):
        if api is None:
            require_package()  # NOTE: first, so a host without it hears about that before anything else
        if not config.device.startswith("cuda"):
            raise EngineUnavailableError(
                "engine trtllm runs on NVIDIA GPUs only: start the worker with "
                "--device cuda (TANDEM_WORKER_DEVICE=cuda)"
            )
        self.config, self._api = config, api
        self.ckpt = read_checkpoint(config.model)
        self.backend = choose_backend(config, self.ckpt)
        check_checkpoint(config, self.ckpt, self.backend)
        self.max_model_len = max_model_len(config, self.ckpt)
        self.kv_layout = KvLayout(
            self.ckpt.num_layers,
            self.ckpt.num_kv_heads,
            self.ckpt.head_dim,
            kv_dtype(config, self.ckpt),
            config.cache.block_size,
        )
        self._llm: Any = None
        self._live: dict[str, _Live] = {}
        self._held: dict[str, tuple[float, Any]] = {}  # req_id -> (let go at, result): prefilled, KV held
        self._counts = Counts()
        self._stat: dict = {}
        self._kv = TrtllmKvEvents(config.cache.block_size, root=config.kv_hash_root)
        self._kv_changed = asyncio.Event()
        self._pollers: list[asyncio.Task] = []
        self._failure: str | None = None  # why the executor is gone; then nothing more is served
        self._dead = asyncio.Event()
        self._stopping = False

    # ---- lifecycle ----

    async def start(self) -> None:
        if self._llm is not None:
            return
        api = self._api = self._api or load_api()
        _, total = api.gpu_memory()
        cls, kwargs = llm_arguments(self.config, self.ckpt, self.backend, api, total)
        log.info("loading %s on TensorRT-LLM (%s backend)", self.config.model, self.backend)
        # NOTE: on the loop's own thread, as TensorRT-LLM's servers do (it starts its executor processes and binds
        # its result queues to the running loop); nothing else is served until the engine has started
        self._llm = cls(**kwargs)
        self._pollers = [
            asyncio.ensure_future(self._poll(self._llm.get_stats_async, self._on_stats)),
            asyncio.ensure_future(self._poll(self._llm.get_kv_cache_events_async, self._on_kv_events)),
        ]

    async def shutdown(self) -> None:
        self._stopping = True  # NOTE: our own shutdown stops the executor too; that is no failure
        lives = list(self._live.values())
        for live in lives:
            await self.abort(live.stream.req_id)
        tasks = self._pollers + [live.pump for live in lives if live.pump is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._llm is not None:
            llm, self._llm = self._llm, None
            llm.shutdown()

    # ---- requests ----

    def add_request(self, request: EngineRequest):
        if self._llm is None:
            raise EngineError("engine is not started")
        if self._executor_gone():
            raise EngineDiedError(f"the engine cannot serve: {self._failure}")
        self._expire_held()
        validate_request(request, self.max_model_len, self._live)
        tokens = request.prompt_token_ids + request.output_token_ids
        if len(tokens) >= self.max_model_len:
            raise InvalidRequestError(f"prompt and output tokens fill the context ({self.max_model_len} tokens)")
        vocab = self.ckpt.vocab_size
        if vocab and not 0 <= min(tokens) <= max(tokens) < vocab:
            # NOTE: TensorRT-LLM does not check: an id past the embedding table faults the GPU, and every request
            raise InvalidRequestError(f"prompt token ids must be in [0, {vocab})")
        if (request.hold_kv or isinstance(request.kv, bytes) and request.kv) and not self.config.disaggregation:
            raise InvalidRequestError(
                "this trtllm worker runs without a cache transceiver (--trtllm-cache-"
                "transceiver off): it neither holds nor takes KV for another worker"
            )
        plan = plan_request(request, self.ckpt.eos_token_ids, secrets.randbits(63))
        result = self._submit(plan, request.hash_root)
        p = request.params
        stream = OutputStream(
            request.req_id,
            plan,
            len(request.prompt_token_ids),
            self.config.cache.block_size,
            p.top_logprobs,
            p.logprobs,
        )
        live = self._live[request.req_id] = _Live(result, stream)
        live.pump = asyncio.ensure_future(self._pump(request.req_id, live))
        return queue_stream(request.req_id, live.queue, lambda: self._stream_done(request.req_id), self.abort)

    def _stream_done(self, req_id: str) -> None:
        """The consumer is gone: whatever TensorRT-LLM still runs for it is cancelled."""
        live = self._live.pop(req_id, None)
        if live is not None and not live.closed:
            live.closed = True
            self._count_prompt(live)
            _abort_quietly(live.result)

    def _submit(self, plan, hash_root: int = 0) -> Any:
        # NOTE: TensorRT-LLM mixes cache_salt into its own first block hash: the tenant's keyed root, never the salt
        salted = {"cache_salt": f"{hash_root:016x}"} if hash_root else {}
        try:
            guided = plan.sampling.get("guided_decoding")
            sampling = self._api.SamplingParams(
                **plan.sampling | ({"guided_decoding": self._api.GuidedDecodingParams(**guided)} if guided else {})
            )
            disagg = self._api.DisaggregatedParams(**plan.disaggregated) if plan.disaggregated else None
            return self._llm.generate_async(
                list(plan.inputs), sampling_params=sampling, streaming=True, disaggregated_params=disagg, **salted
            )
        except (TypeError, ValueError) as exc:  # what TensorRT-LLM's own validation refuses, e.g. a newer kv_params
            raise InvalidRequestError(f"TensorRT-LLM refused the request: {exc}") from None
        except RuntimeError as exc:  # "LLM is shutting down": its executor died since the last look
            if self._executor_gone():
                raise EngineDiedError(f"the engine cannot serve: {self._failure}") from None
            raise EngineError(f"TensorRT-LLM failed to take the request: {exc}") from None

    async def _pump(self, req_id: str, live: _Live) -> None:
        last: RequestOutput | None = None
        try:
            async for result in live.result:
                last = live.stream.feed(result)
                if last is not None:
                    self._deliver(live, last)
                if live.closed or live.stream.finished:
                    break
            if not live.closed and not live.stream.finished and not self._executor_gone():
                self._deliver(live, self._failed(live, "TensorRT-LLM's stream ended without a finish reason"))
        except Exception as exc:  # a request error, or the executor died (then _die has ended it with ABORT)
            if not self._executor_gone():
                log.warning("request %s failed in TensorRT-LLM: %s", req_id, exc)
                self._deliver(live, self._failed(live, str(exc)))
        if last is not None and last.finish_reason is FinishReason.PREFILLED:
            self._held[req_id] = (time.monotonic() + self.config.transfer.held_kv_ttl_s, live.result)
        elif live.stream.plan.holds_kv:
            _abort_quietly(live.result)  # ended on its first token: nothing to hand over, let its KV go

    def _deliver(self, live: _Live, out: RequestOutput) -> None:
        if live.closed:
            return
        self._counts.generated_tokens += len(out.new_token_ids)
        if out.finished:
            live.closed = True
            self._count_prompt(live)
        live.queue.put_nowait(out)

    def _failed(self, live: _Live, error: str) -> RequestOutput:
        return RequestOutput(
            live.stream.req_id,
            (),
            finish_reason=FinishReason.ERROR,
            error=error,
            num_prompt_tokens=live.stream.num_prompt_tokens,
        )

    def _count_prompt(self, live: _Live) -> None:
        if not live.counted:
            live.counted = True
            s = live.stream
            self._counts.request_started(s.num_prompt_tokens, s.num_cached_tokens, s.plan.imported)

    async def abort(self, req_id: str) -> None:
        live = self._live.get(req_id)
        if live is not None and not live.closed:
            _abort_quietly(live.result)
            self._deliver(
                live,
                RequestOutput(
                    req_id, (), finish_reason=FinishReason.ABORT, num_prompt_tokens=live.stream.num_prompt_tokens
                ),
            )
        held = self._held.pop(req_id, None)
        if held is not None:
            _abort_quietly(held[1])

    # ---- KV handed over by TensorRT-LLM itself ----

    async def reset_prefix_cache(self) -> int:
        raise EngineError("the trtllm engine cannot reset its prefix cache")

    async def wait_failed(self) -> str:
        """Return once TensorRT-LLM's executor is gone: a failed request may have seen it first, or this look
        every HEALTH_POLL_S (an executor that died quietly leaves its requests waiting, not failing)."""
        while not self._executor_gone():
            try:
                await asyncio.wait_for(self._dead.wait(), HEALTH_POLL_S)
            except TimeoutError:
                pass
        return self._failure or "TensorRT-LLM's executor failed"

    def _executor_gone(self) -> bool:
        """Whether the executor is gone; the first time it is seen gone, every request this engine holds ends.
        TensorRT-LLM shuts its executor down on a background error (GenerationExecutor._handle_background_error)
        and refuses new requests from then on; the LLM object stays (api_surface.json holds both names)."""
        if self._failure is None and not self._stopping and self._llm is not None:
            reason = executor_failure(self._llm)
            if reason is not None:
                self._die(reason)
        return self._failure is not None

    def _die(self, reason: str) -> None:
        self._failure = reason
        lives = [live for live in self._live.values() if not live.closed]
        log.error("%s: handing %d live requests back, dropping %d held", reason, len(lives), len(self._held))
        for live in lives:  # NOTE: ABORT, not ERROR: the gateway continues an aborted request on another worker
            self._deliver(
                live,
                RequestOutput(
                    live.stream.req_id,
                    (),
                    finish_reason=FinishReason.ABORT,
                    num_prompt_tokens=live.stream.num_prompt_tokens,
                ),
            )
            if live.pump is not None and live.pump is not asyncio.current_task():
                live.pump.cancel()  # NOTE: a dead executor may never answer it again
        self._held.clear()
        self._dead.set()

    async def export_kv(self, req_id: str, into: str = "", offset: int = 0) -> KvExport:
        raise EngineError(
            "the trtllm engine moves its KV itself (cache transceiver): a decode worker takes it "
            "with the kv_params of the prefill's last output"
        )

    async def release_kv(self, req_id: str) -> None:
        held = self._held.pop(req_id, None)
        if held is None:
            raise RequestNotFoundError(f"no KV held for request {req_id!r}")
        # NOTE: TensorRT-LLM frees the blocks once its transceiver has sent them; this only stops tracking them

    def _expire_held(self) -> None:
        now = time.monotonic()
        for req_id in [r for r, (deadline, _) in self._held.items() if deadline <= now]:
            log.info("held KV of %s not taken within %.0fs; letting it go", req_id, self.config.transfer.held_kv_ttl_s)
            _abort_quietly(self._held.pop(req_id)[1])

    # ---- stats and KV events ----

    def stats(self) -> EngineStats:
        self._expire_held()
        return engine_stats(
            self._stat,
            self._counts,
            block_size=self.config.cache.block_size,
            max_model_len=self.max_model_len,
            num_held=len(self._held),
            num_live=len(self._live),
        )

    async def kv_events_since(self, after_seq: int) -> list[KvEvent] | None:
        return self._kv.log.since(after_seq)

    async def kv_snapshot(self) -> KvSnapshot:
        return self._kv.log.snapshot()

    async def wait_kv_events(self, after_seq: int) -> None:
        while self._kv.log.last_seq <= after_seq:
            await self._kv_changed.wait()

    def _on_stats(self, stat: dict) -> None:
        self._stat = stat

    def _on_kv_events(self, event: dict) -> None:
        if self._kv.ingest([event]):
            self._kv_changed.set()
            self._kv_changed = asyncio.Event()

    async def _poll(self, fetch, handle) -> None:
        """Drain one of TensorRT-LLM's result queues until cancelled. Each fetch is an async iterable that ends
        (or times out) once nothing arrives within the timeout."""
        while True:
            drained = False
            try:
                async for item in fetch(POLL_TIMEOUT_S):
                    handle(json_dict(item))
                    drained = True
                    await asyncio.sleep(0)  # NOTE: a queue that always has more must not starve the streams
            except (TimeoutError, asyncio.QueueEmpty):
                pass
            except Exception as exc:  # NOTE: a failed drain must not end the worker; the next one may succeed
                log.warning("TensorRT-LLM %s failed: %s", getattr(fetch, "__name__", fetch), exc)
                await asyncio.sleep(1.0)
            if not drained:
                await asyncio.sleep(POLL_TIMEOUT_S)


def json_dict(item: Any) -> dict:
    """Stats and events come as dicts; some releases hand out their JSON text instead."""
    return json.loads(item) if isinstance(item, str) else item


def _abort_quietly(result: Any) -> None:
    try:
        result.abort()
    except Exception as exc:  # NOTE: aborting a request TensorRT-LLM already let go is not an error here
        log.debug("abort: %s", exc)
