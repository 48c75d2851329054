"""Domain dataclasses of the engine contract: requests, sampling, outputs, stats, KV exports."""

import math
from dataclasses import dataclass, field
from enum import Enum

from engines.base.errors import InvalidRequestError
from engines.base.structured import StructuredSpec

MAX_CACHE_SALT_CHARS = 1024  # a salt is a label, not a payload (the gateway caps what clients send lower)
MAX_LOGIT_BIAS = 1024  # tokens one request may bias (OpenAI documents no limit; this bounds the work per step)
MAX_TOP_LOGPROBS = 20  # alternatives per token (OpenAI's limit); the gateway's schema refuses more with this one


class FinishReason(str, Enum):
    STOP = "stop"  # a stop token (EOS or a requested one)
    LENGTH = "length"  # max_tokens or the context limit
    ABORT = "abort"  # cancelled by the caller
    ERROR = "error"  # the engine failed this request
    # a hold_kv request's first token is out and its KV is held for a decode worker: finished here, not for the client
    PREFILLED = "prefilled"


@dataclass(frozen=True, slots=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0
    seed: int | None = None  # randomness keyed on (seed, index of the generated token): same seed, same tokens
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: bool = False  # log-probability of each chosen token
    top_logprobs: int = 0  # and of this many alternatives
    min_tokens: int = 0  # no stop (EOS or stop ids) before this many generated tokens
    # NOTE: the logit-shaping fields below are applied before temperature: presence/frequency as OpenAI defines
    # them (over the generated tokens), repetition as vLLM/HF do (over prompt + generated tokens)
    presence_penalty: float = 0.0  # subtracted once from every token already generated
    frequency_penalty: float = 0.0  # subtracted per time a token was generated
    repetition_penalty: float = 1.0  # divides a positive logit (multiplies a negative one) of any seen token
    min_p: float = 0.0  # drop tokens whose probability is below min_p x the most likely one's
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token_id, bias) added to the logit, ids ascending
    # tenant isolation: mixed (with the deployment secret) into the first KV block's hash, so only requests with the
    # same salt share cached prefixes; "" shares with every unsalted request (engines/base/block_hash.chain_root)
    cache_salt: str = ""
    structured: StructuredSpec | None = None  # the grammar the output follows (structured outputs, tool calls)

    def validate(self) -> None:
        if self.max_tokens < 1:
            raise InvalidRequestError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise InvalidRequestError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidRequestError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise InvalidRequestError(f"top_k must be >= 0, got {self.top_k}")
        if not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS:
            raise InvalidRequestError(f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {self.top_logprobs}")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise InvalidRequestError(f"min_tokens must be in [0, max_tokens], got {self.min_tokens}")
        self._validate_shaping()

    def _validate_shaping(self) -> None:
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not (math.isfinite(value) and -2.0 <= value <= 2.0):
                raise InvalidRequestError(f"{name} must be in [-2, 2], got {value}")
        if not (math.isfinite(self.repetition_penalty) and self.repetition_penalty > 0):
            raise InvalidRequestError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        if not 0.0 <= self.min_p <= 1.0:
            raise InvalidRequestError(f"min_p must be in [0, 1], got {self.min_p}")
        if len(self.logit_bias) > MAX_LOGIT_BIAS:
            raise InvalidRequestError(f"logit_bias takes at most {MAX_LOGIT_BIAS} tokens, got {len(self.logit_bias)}")
        ids = [token_id for token_id, _ in self.logit_bias]
        if ids != sorted(set(ids)):
            raise InvalidRequestError("logit_bias token ids must be unique and in ascending order")
        for token_id, bias in self.logit_bias:
            if token_id < 0 or not (math.isfinite(bias) and -100.0 <= bias <= 100.0):
                raise InvalidRequestError(
                    f"logit_bias maps token ids >= 0 to biases in [-100, 100], got {token_id}: {bias}"
                )
        if len(self.cache_salt) > MAX_CACHE_SALT_CHARS:
            raise InvalidRequestError(
                f"cache_salt takes at most {MAX_CACHE_SALT_CHARS} characters, got {len(self.cache_salt)}"
            )
        if self.structured is not None:
            self.structured.validate()

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    @property
    def has_penalties(self) -> bool:
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0)

    def shaping_fields(self) -> tuple[str, ...]:
        """The logit-shaping fields set away from "off": what an engine without logits must refuse."""
        off = {
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "repetition_penalty": 1.0,
            "min_p": 0.0,
            "logit_bias": (),
        }
        return tuple(name for name, value in off.items() if getattr(self, name) != value)


@dataclass(frozen=True, slots=True)
class KvLayout:
    """What a block of KV looks like; an import must match the importer's layout exactly."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: str  # torch dtype name without prefix, e.g. "bfloat16", "float32", "float8_e4m3fn"
    block_size: int


@dataclass(frozen=True, slots=True)
class KvExport:
    """The KV cache of one request's first `num_tokens` tokens, in block order.

    `data` holds a C-contiguous array of shape [num_layers, 2 (k, v), num_blocks, block_size,
    num_kv_heads, head_dim] in `layout.dtype`, as raw bytes. Slots past `num_tokens` in the
    last block are undefined.
    """

    layout: KvLayout
    token_ids: tuple[int, ...]  # the tokens whose KV this is (len == num_tokens)
    num_blocks: int
    data: bytes
    scales: tuple[float, ...] = ()  # per-layer KV scales for quantized caches; empty otherwise

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


@dataclass(frozen=True, slots=True)
class EngineRequest:
    req_id: str
    prompt_token_ids: tuple[int, ...]  # the user's prompt: len() is num_prompt_tokens everywhere
    params: SamplingParams = field(default_factory=SamplingParams)  # the user's; max_tokens counts output_token_ids
    # Prefill only: compute the prompt, sample exactly one token, hold the KV until export_kv/release_kv.
    hold_kv: bool = False
    # KV for a prefix of prompt + output_token_ids computed elsewhere: its bytes (see KvExport), or a handle naming
    # it that an engine of the prefill's kind loads itself (a transfer descriptor, TensorRT-LLM's disaggregated
    # params); only that kind reads a handle.
    kv: KvExport | bytes | None = None
    # Tokens already generated for this request elsewhere (a prefill worker's first token, a migrated
    # request's output); the engine continues after them and never sends them again.
    output_token_ids: tuple[int, ...] = ()
    hash_root: int = 0  # the first KV block's parent hash: block_hash.chain_root(params.cache_salt, secret)

    @property
    def all_token_ids(self) -> tuple[int, ...]:
        return self.prompt_token_ids + self.output_token_ids


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()  # (token_id, logprob) best first


@dataclass(frozen=True, slots=True)
class RequestOutput:
    """A delta: the tokens produced since the previous output of the same request."""

    req_id: str
    new_token_ids: tuple[int, ...]
    logprobs: tuple[TokenLogprob, ...] = ()
    finish_reason: FinishReason | None = None
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache or an import
    error: str | None = None
    queue_s: float | None = None  # arrival to first scheduled step, when the engine knows it (for traces)
    kv_handle: bytes = b""  # the last output of a hold_kv request whose KV is held: what `EngineRequest.kv` takes
    # to load it, when its engine loads KV itself

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(frozen=True, slots=True)
class EngineStats:
    num_waiting: int
    num_running: int
    num_held: int  # finished requests whose KV is held for export
    num_blocks_total: int
    num_blocks_used: int
    num_blocks_cached_free: int  # free blocks still holding a reusable prefix
    block_size: int
    max_model_len: int
    prefix_queries: int  # prompt tokens looked up in the prefix cache
    prefix_hits: int  # of which served from it
    num_preemptions: int
    num_prompt_tokens_computed: int
    num_generated_tokens: int
    # KV tiers below the device pool (all 0 without them); blocks hold every layer, `kv_block_bytes` each
    num_host_blocks_total: int = 0
    num_host_blocks_used: int = 0
    num_disk_blocks_total: int = 0
    num_disk_blocks_used: int = 0
    kv_block_bytes: int = 0
    prefix_hits_host: int = 0  # of prefix_hits: prompt tokens onboarded from the host tier
    prefix_hits_disk: int = 0  # and from disk
    num_blocks_offloaded_host: int = 0  # device -> host copies (write-through)
    num_blocks_offloaded_disk: int = 0  # host -> disk writes that succeeded
    num_blocks_onboarded_host: int = 0
    num_blocks_onboarded_disk: int = 0
    num_onboards: int = 0  # onboarding loads that ended well
    onboard_seconds: float = 0.0  # their summed latency, start to the step loop seeing the end
    num_disk_write_errors: int = 0
    prefill_tokens_per_s: float = 0.0  # measured; what a load is weighed against
    # grammar masks (structured outputs): rows masked, time on them (building matchers on the grammar thread, filling
    # masks on the step thread), and the step thread's share (starting them; filling them after the forward pass)
    num_grammar_masks: int = 0
    grammar_mask_seconds: float = 0.0
    grammar_wait_seconds: float = 0.0
    # speculative decoding (all 0 without it): tokens proposed and verified, of them accepted, and the
    # sequence-steps that verified (accepted / verify steps = mean accepted length, before the one bonus token)
    num_spec_proposed: int = 0
    num_spec_accepted: int = 0
    num_spec_verify_steps: int = 0
    kv_host_bytes_per_s: float = 0.0  # measured onboarding bandwidth per tier (0: not yet measured)
    kv_disk_bytes_per_s: float = 0.0
    num_disk_blocks_refused: int = 0  # disk tier files refused: planted, another worker's, tampered or corrupt

    @property
    def prefix_hit_rate(self) -> float:
        return self.prefix_hits / self.prefix_queries if self.prefix_queries else 0.0

    @property
    def kv_bytes_per_token(self) -> float:
        """A token's KV, every layer, as the tiers hold it (0 without tiers)."""
        return self.kv_block_bytes / self.block_size if self.block_size else 0.0
