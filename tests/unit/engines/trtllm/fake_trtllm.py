"""A fake of the few tensorrt_llm 1.2 objects the adapter touches, written from the release's public API
(names, fields and defaults as there; the objects the LLM API returns are simplified to what is read).

The LLM runs a toy model (the next token is a function of the last) with what matters to the adapter:
streamed cumulative results, stop/end/min_tokens/ignore_eos as TensorRT-LLM applies them, abort, a paged
prefix cache that publishes KV events in TensorRT-LLM's dict format (its own block hashes, the tokens of each
block, cache levels, partial blocks), per-iteration stats dicts, and context-only / generation-only requests
whose KV moves through a fake cache transceiver (a registry shared by every LLM in the process).
Its executor can die as TensorRT-LLM's does (LLM.fail). The tables at the end of the fake objects say which
names of the real package the adapter uses; test_trtllm_fake_matches_real holds them, and every field the fake
offers, to the snapshot of the release's source (engines/trtllm/api_surface.json)."""

import asyncio
import dataclasses
import datetime
import enum
import hashlib
import queue
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from engines.trtllm.api import TrtllmApi

VOCAB = 512  # the tiny test checkpoint's


# ---- tensorrt_llm.sampling_params ----
@dataclass(slots=True, kw_only=True)
class SamplingParams:
    end_id: int | None = None
    pad_id: int | None = None
    max_tokens: int = 32
    stop_token_ids: list[int] | None = None
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    temperature: float | None = None
    min_tokens: int | None = None
    logprobs: int | None = None
    ignore_eos: bool = False
    detokenize: bool = True
    return_perf_metrics: bool = False
    guided_decoding: Any | None = None

    def __post_init__(self):
        if self.top_p is not None and not 0 <= self.top_p <= 1:
            raise ValueError(f"require 0 <= top_p <= 1, got top_p={self.top_p}")
        if self.pad_id is None:
            self.pad_id = self.end_id


# ---- tensorrt_llm.sampling_params ----
@dataclass(slots=True, kw_only=True)
class GuidedDecodingParams:
    json: Any | None = None
    regex: str | None = None
    grammar: str | None = None
    json_object: bool = False
    structural_tag: str | None = None


# ---- tensorrt_llm.disaggregated_params ----
@dataclass(slots=True, kw_only=True)
class DisaggregatedParams:
    request_type: str | None = None
    first_gen_tokens: list[int] | None = None
    first_gen_log_probs: list | None = None
    ctx_request_id: int | None = None
    opaque_state: bytes | None = None
    draft_tokens: list[int] | None = None
    disagg_request_id: int | None = None
    ctx_dp_rank: int | None = None
    ctx_info_endpoint: str | None = None

    def __post_init__(self):
        if self.request_type not in (None, "context_only", "generation_only", "context_and_generation"):
            raise ValueError(f"Unknown request type: {self.request_type}")


# ---- tensorrt_llm.llmapi.llm_args (pydantic models there; their fields and defaults here) ----
@dataclass(kw_only=True)
class KvCacheConfig:
    enable_block_reuse: bool = True
    max_tokens: int | None = None
    free_gpu_memory_fraction: float | None = 0.9
    event_buffer_max_size: int = 0
    dtype: str = "auto"
    tokens_per_block: int = 32


@dataclass(kw_only=True)
class CacheTransceiverConfig:
    backend: str | None = None
    max_tokens_in_buffer: int | None = None


# ---- tensorrt_llm.quantization.mode / tensorrt_llm.models.modeling_utils ----
class QuantAlgo(str, enum.Enum):
    FP8 = "FP8"
    NVFP4 = "NVFP4"


@dataclass(kw_only=True)
class QuantConfig:
    quant_algo: QuantAlgo | None = None
    kv_cache_quant_algo: QuantAlgo | None = None


# ---- tensorrt_llm.executor.result ----
@dataclass(slots=True)
class Logprob:
    logprob: float
    rank: int | None = None


@dataclass(slots=True)
class CompletionOutput:
    index: int
    text: str = ""
    token_ids: list[int] | None = field(default_factory=list)
    logprobs: list | None = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: Any | None = None
    disaggregated_params: DisaggregatedParams | None = None
    request_perf_metrics: Any | None = None


class RequestError(RuntimeError):
    """tensorrt_llm.executor.utils.RequestError: a request the executor failed."""


# ---- tensorrt_llm.executor.executor ----
class GenerationExecutor:
    """What the adapter sees of the executor: TensorRT-LLM shuts it down when a background thread or worker
    process fails, and LLM.generate_async refuses requests from then on."""

    def __init__(self):
        self._error_queue: queue.Queue = queue.Queue()  # what failed threads and worker processes leave
        self.doing_shutdown = False

    def is_shutdown(self) -> bool:
        return self.doing_shutdown

    def shutdown(self) -> None:
        self.doing_shutdown = True


FAKED = (
    "SamplingParams",
    "DisaggregatedParams",
    "KvCacheConfig",
    "CacheTransceiverConfig",
    "QuantConfig",
    "QuantAlgo",
    "Logprob",
    "CompletionOutput",
    "RequestError",
    "GenerationExecutor",
    "GuidedDecodingParams",
)  # classes, as named there
EXPORTS = {  # where engines/trtllm/api.py imports each name from (the package's __init__ files)
    "__init__.py": ("LLM", "SamplingParams"),
    "llmapi/__init__.py": (
        "DisaggregatedParams",
        "GuidedDecodingParams",
        "KvCacheConfig",
        "CacheTransceiverConfig",
        "QuantConfig",
        "QuantAlgo",
    ),
    "_tensorrt_engine/__init__.py": ("LLM",),
}
LLM_METHODS = {  # LLM (BaseLLM) method -> the parameters the adapter passes (tensorrt_llm/llmapi/llm.py)
    "generate_async": ("inputs", "sampling_params", "streaming", "disaggregated_params", "cache_salt"),
    "get_stats_async": ("timeout",),
    "get_kv_cache_events_async": ("timeout",),
    "shutdown": (),
}
LLM_ARGS = (
    "model",
    "dtype",
    "tensor_parallel_size",
    "max_batch_size",
    "max_num_tokens",
    "max_seq_len",
    "kv_cache_config",
    "cache_transceiver_config",
    "enable_iter_perf_stats",
    "quant_config",
    "guided_decoding_backend",
)
LLM_ATTRIBUTES = ("_executor",)  # what api.executor_failure reads
RESULT_NAMES = ("outputs", "finished", "disaggregated_params", "abort", "__aiter__")  # read off a GenerationResult
EXECUTOR_METHODS = {"is_shutdown": ()}
EXECUTOR_ATTRIBUTES = ("_error_queue",)
KV_EVENT_KEYS = (
    "event_id",
    "data",
    "window_size",
    "type",
    "parent_hash",
    "blocks",
    "block_hash",
    "tokens",
    "token_id",
    "cache_level",
    "block_hashes",
    "new_value",
    "old_value",
)  # tensorrt_llm/_utils.py
KV_EVENT_TYPES = ("created", "stored", "stored_block", "removed", "updated", "event_diff", "unique_token")


class _Silence(Exception):
    """A failure after which the fake's requests hang instead of raising."""


def next_token(last: int) -> int:
    return (last * 7 + 3) % VOCAB


def trt_block_hash(parent: int | None, tokens: list[int]) -> int:
    """Not tandem's hash, on purpose: the adapter must rehash."""
    digest = hashlib.blake2b(f"{parent}:{tokens}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


class _Transceiver:
    """The KV of finished context-only requests, waiting for a generation-only request (any LLM here)."""

    held: dict[int, tuple[tuple[int, ...], list[int]]] = {}
    next_id = 1000


class _Cache:
    """A paged prefix cache of `capacity` full blocks, LRU, publishing TensorRT-LLM-style KV event dicts."""

    def __init__(self, block_size: int, capacity: int, events_on: bool):
        self.block_size, self.capacity, self.events_on = block_size, capacity, events_on
        self.blocks: dict[int, None] = {}  # trt hash, LRU order
        self.events: list[dict] = []
        self.next_event_id = 0
        self._emit({"type": "created", "num_blocks_per_cache_level": [capacity, 0]})

    def _emit(self, data: dict) -> None:
        if self.events_on:
            self.events.append({"event_id": self.next_event_id, "data": data, "window_size": 4096})
        self.next_event_id += 1  # NOTE: ids advance even when nobody drains: a gap shows lost events

    def store(self, tokens: tuple[int, ...]) -> int:
        """Store the prompt's blocks; returns how many full blocks of its prefix were cached already."""
        parent, first_parent, reused, stored, bs = None, None, 0, [], self.block_size
        for start in range(0, len(tokens), bs):
            chunk = list(tokens[start : start + bs])
            h = trt_block_hash(parent, chunk)
            if len(chunk) == bs and h in self.blocks and not stored:
                reused += 1
                self.blocks[h] = self.blocks.pop(h)  # most recently used
            else:
                first_parent = parent if not stored else first_parent
                stored.append(
                    {
                        "type": "stored_block",
                        "block_hash": h,
                        "cache_level": 0,
                        "priority": 35,
                        "tokens": [{"type": "unique_token", "token_id": t, "token_extra_id": 0} for t in chunk],
                    }
                )
                if len(chunk) == bs:
                    self.blocks[h] = None
            parent = h
        if stored:
            self._emit({"type": "stored", "parent_hash": first_parent, "blocks": stored})
        self._evict()
        return reused

    def _evict(self) -> None:
        gone = []
        while len(self.blocks) > self.capacity:
            gone.append(next(iter(self.blocks)))
            self.blocks.pop(gone[-1])
        if gone:
            self._emit({"type": "removed", "block_hashes": gone})

    def offload(self, trt_hash: int) -> None:
        self._emit(
            {
                "type": "updated",
                "block_hash": trt_hash,
                "priority": None,
                "cache_level": {"type": "event_diff", "new_value": 1, "old_value": 0},
            }
        )


class GenerationResult:
    """Streams itself, as TensorRT-LLM's does: the same object, its outputs[0] growing."""

    def __init__(
        self, llm: "LLM", request_id: int, prompt: list[int], params: SamplingParams, disagg: DisaggregatedParams | None
    ):
        self.llm, self.request_id, self.prompt_token_ids = llm, request_id, list(prompt)
        self.params, self.disagg = params, disagg
        self.outputs = [CompletionOutput(0)]
        self.finished = False
        self.disaggregated_params = None
        self.aborted = False
        self.abort_calls = 0

    def abort(self) -> None:
        self.abort_calls += 1
        self.aborted = True

    def __aiter__(self):
        return self._run()

    async def _run(self):
        llm, out, p = self.llm, self.outputs[0], self.params
        arrival = datetime.timedelta(seconds=1.0)
        kind = self.disagg.request_type if self.disagg else "context_and_generation"
        if kind == "generation_only":
            key = self.disagg.ctx_request_id
            if key not in _Transceiver.held or _Transceiver.held[key][0] != tuple(self.prompt_token_ids):
                raise RequestError(f"no KV to receive for context request {key}")
            _, first = _Transceiver.held.pop(key)
            reused = len(self.prompt_token_ids) // llm.block_size
            out.token_ids = list(first)
        else:
            reused = llm.cache.store(tuple(self.prompt_token_ids))
        out.request_perf_metrics = SimpleNamespace(
            kv_cache_metrics=SimpleNamespace(num_reused_blocks=reused),
            timing_metrics=SimpleNamespace(arrival_time=arrival, first_scheduled_time=arrival + llm.queue_delay),
        )
        while True:
            await asyncio.sleep(llm.step_delay)
            if isinstance(llm.failure, _Silence):
                await asyncio.Event().wait()
            if llm.failure is not None:
                raise llm.failure
            llm.iteration(self)
            if self.aborted:
                out.finish_reason, self.finished = "cancelled", True
                yield self
                return
            last = (self.prompt_token_ids + out.token_ids)[-1]
            token = next_token(last) if last not in llm.forced else llm.forced[last]
            out.token_ids.append(token)
            if p.logprobs:
                out.logprobs.append(
                    {
                        token: Logprob(-0.25, 1),
                        **{(token + i) % VOCAB: Logprob(-1.0 - i, i + 1) for i in range(1, p.logprobs)},
                    }
                )
            out.finish_reason = self._finish(token, len(out.token_ids))
            if kind == "context_only" and out.finish_reason is None:
                out.finish_reason = "length"
            if out.finish_reason:
                self.finished = True
                if kind == "context_only":
                    self._hand_over(out)
            yield self
            if self.finished:
                return

    def _finish(self, token: int, n: int) -> str | None:
        p = self.params
        if token in (p.stop_token_ids or ()):
            return "stop"
        if token == p.end_id and not p.ignore_eos and n >= (p.min_tokens or 1):
            return "stop"
        if n >= p.max_tokens or len(self.prompt_token_ids) + n >= self.llm.max_seq_len:
            return "length"
        return None

    def _hand_over(self, out: CompletionOutput) -> None:
        if self.llm.kwargs.get("cache_transceiver_config") is None:
            raise RequestError("context-only requests need a cache transceiver")
        _Transceiver.next_id += 1
        ctx_id = _Transceiver.next_id
        _Transceiver.held[ctx_id] = (tuple(self.prompt_token_ids), list(out.token_ids))
        out.disaggregated_params = DisaggregatedParams(
            request_type="context_only",
            first_gen_tokens=list(out.token_ids),
            ctx_request_id=ctx_id,
            opaque_state=b"\x00\x01fake-ucx-endpoint",
            disagg_request_id=ctx_id * 10,
        )


class LLM:
    """tensorrt_llm.LLM (and _tensorrt_engine.LLM): the keyword arguments the adapter passes are kept."""

    instances: list["LLM"] = []

    def __init__(self, model: str, **kwargs):
        self.model, self.kwargs = model, kwargs
        kv = kwargs.get("kv_cache_config") or KvCacheConfig()
        self.block_size = kv.tokens_per_block
        capacity = (kv.max_tokens or 64 * self.block_size) // self.block_size
        self.cache = _Cache(self.block_size, capacity, kv.enable_block_reuse and kv.event_buffer_max_size > 0)
        self.max_seq_len = kwargs.get("max_seq_len") or 4096
        self.step_delay, self.queue_delay = 0.0, datetime.timedelta(milliseconds=5)
        self.forced: dict[int, int] = {}  # last token -> next token, to steer the toy model in a test
        self.live: list[GenerationResult] = []
        self.stats: list[dict] = []
        self.submitted: list[tuple[list[int], SamplingParams, DisaggregatedParams | None]] = []
        self.cache_salts: list[str | None] = []  # generate_async's cache_salt, per request
        self.is_shut_down = False
        self._executor: GenerationExecutor | None = GenerationExecutor()
        self.failure: BaseException | None = None  # fail(): what live requests raise at their next step
        self._ids = 0
        LLM.instances.append(self)

    def generate_async(
        self,
        inputs,
        sampling_params=None,
        lora_request=None,
        prompt_adapter_request=None,
        streaming=False,
        kv_cache_retention_config=None,
        disaggregated_params=None,
        cache_salt=None,
    ):
        if self._executor is None or self._executor.is_shutdown():
            raise RuntimeError("LLM is shutting down")  # as the real generate_async does
        if not isinstance(inputs, list) or not inputs:
            raise TypeError("the fake takes token ids")
        self._ids += 1
        self.submitted.append((list(inputs), sampling_params, disaggregated_params))
        self.cache_salts.append(cache_salt)
        result = GenerationResult(self, self._ids, inputs, sampling_params or SamplingParams(), disaggregated_params)
        self.live.append(result)
        return result

    def iteration(self, running: GenerationResult) -> None:
        active = [r for r in self.live if not r.finished]
        used = len(self.cache.blocks)
        self.stats.append(
            {
                "iter": len(self.stats),
                "numActiveRequests": len(active),
                "numQueuedRequests": 0,
                "inflightBatchingStats": {"numPausedRequests": 0, "numContextRequests": 0},
                "kvCacheStats": {
                    "maxNumBlocks": self.cache.capacity,
                    "usedNumBlocks": used,
                    "freeNumBlocks": self.cache.capacity - used,
                    "tokensPerBlock": self.block_size,
                },
            }
        )

    async def get_stats_async(self, timeout: float | None = 2):
        """An async iterable of what is queued (TensorRT-LLM's IterationResult ends once its timeout passes)."""
        while self.stats:
            yield self.stats.pop(0)

    async def get_kv_cache_events_async(self, timeout: float | None = 2):
        while self.cache.events:
            yield self.cache.events.pop(0)

    def shutdown(self) -> None:
        self.is_shut_down = True
        if self._executor is not None:
            self._executor.shutdown()
            self._executor = None

    def fail(self, error: BaseException | None = None, queued: bool = False) -> None:
        """The executor dies as on a background error: it shuts down (or, `queued`, its worker process's error
        only waits in its error queue, as TensorRT-LLM leaves it until the next request); live requests raise
        `error` at their next step, or (None) are never answered again, as when the worker process is gone."""
        if queued:
            self._executor._error_queue.put_nowait(error or RuntimeError("worker process died"))
        else:
            self._executor.shutdown()
        self.failure = error if error is not None else _Silence()


def fake_api(total_gpu_bytes: int = 80 << 30) -> TrtllmApi:
    return TrtllmApi(
        LLM=LLM,
        TrtLLM=LLM,
        SamplingParams=SamplingParams,
        DisaggregatedParams=DisaggregatedParams,
        GuidedDecodingParams=GuidedDecodingParams,
        KvCacheConfig=KvCacheConfig,
        CacheTransceiverConfig=CacheTransceiverConfig,
        QuantConfig=QuantConfig,
        QuantAlgo=QuantAlgo,
        gpu_memory=lambda: (total_gpu_bytes // 2, total_gpu_bytes),
    )


def fields_of(cls) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]
