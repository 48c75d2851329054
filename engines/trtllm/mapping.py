"""tandem's request -> what TensorRT-LLM is asked to do: the prompt it sees, its SamplingParams keyword
arguments (one to one; a clear InvalidRequestError for what has no TensorRT-LLM equivalent), and the
disaggregation mode (context-only for hold_kv, generation-only for a handle in `kv`). Also that handle's codec
(kv_params: TensorRT-LLM's disaggregated params).
Pure: no tensorrt_llm import; the adapter builds the real objects from these dicts."""

import base64
import dataclasses
import json
import re
from dataclasses import dataclass
from typing import Any

from engines.base.errors import InvalidRequestError
from engines.base.structured import StructuredSpec
from engines.base.types import EngineRequest, KvExport, SamplingParams

# every SamplingParams field the mapping below carries over; any other field set away from its default is refused
MAPPED = frozenset(
    {
        "max_tokens",
        "temperature",
        "top_k",
        "top_p",
        "seed",
        "stop_token_ids",
        "ignore_eos",
        "logprobs",
        "top_logprobs",
        "min_tokens",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "min_p",
        "logit_bias",
        "structured",
        "cache_salt",
    }
)  # NOTE: travels as generate_async's cache_salt (the keyed root, engine.py)
# tandem's field -> TensorRT-LLM SamplingParams' (tensorrt_llm/sampling_params.py, read 2026-11): the same names.
# NOTE (assumption, not checked on a GPU here): TensorRT-LLM's sampler may count the prompt in presence/frequency
# penalties, where OpenAI (and tandem's native engine) count generated tokens only
_SHAPING = ("presence_penalty", "frequency_penalty", "repetition_penalty", "min_p")
_KV_PARAMS_VERSION = 1
# DisaggregatedParams fields that are not plain data (tensors, Logprob objects) do not travel; the prefill
# worker's first-token logprobs reach the client through its own output instead
_NOT_SENT = frozenset({"request_type", "first_gen_log_probs", "first_gen_logits"})


@dataclass(frozen=True, slots=True)
class RequestPlan:
    inputs: tuple[int, ...]  # the token ids TensorRT-LLM gets as the prompt
    sampling: dict[str, Any]  # SamplingParams(**sampling)
    disaggregated: dict[str, Any] | None  # DisaggregatedParams(**disaggregated), or None
    skip_tokens: tuple[int, ...] = ()  # leading output tokens TensorRT-LLM repeats (generation-only)
    holds_kv: bool = False  # context-only: the KV stays for a decode worker
    imported: bool = False  # the whole prompt's KV came from the prefill worker


def plan_request(request: EngineRequest, eos_token_ids: tuple[int, ...], seed: int) -> RequestPlan:
    """`seed` is used when the request has none: TensorRT-LLM seeds an unseeded request with 0, which would
    make every unseeded sampled request with the same prompt give the same tokens."""
    p, done = request.params, request.output_token_ids
    _refuse_unmapped(p)
    if isinstance(request.kv, KvExport):
        raise InvalidRequestError("the trtllm engine takes KV only as kv_params from a trtllm prefill worker")
    if request.hold_kv and (done or request.kv):
        raise InvalidRequestError("a hold_kv (prefill-only) request starts from the prompt alone")
    if request.kv:
        params = decode_kv_params(request.kv)
        first = tuple(params.get("first_gen_tokens") or ())
        if first != done:
            raise InvalidRequestError(f"kv_params carry first tokens {list(first)}, the request {list(done)}")
        sampling = sampling_kwargs(p, p.max_tokens, p.min_tokens, eos_token_ids, seed)
        return RequestPlan(
            request.prompt_token_ids,
            sampling,
            {**params, "request_type": "generation_only"},
            skip_tokens=first,
            imported=True,
        )
    if done:  # tokens generated elsewhere without their KV: they become part of the prompt
        left = p.max_tokens - len(done)
        if left < 1:
            raise InvalidRequestError(f"{len(done)} output tokens already reach max_tokens={p.max_tokens}")
        sampling = sampling_kwargs(p, left, max(0, p.min_tokens - len(done)), eos_token_ids, seed)
        return RequestPlan(request.prompt_token_ids + done, sampling, None)
    if request.hold_kv and p.max_tokens > 1:
        sampling = sampling_kwargs(p, 1, min(1, p.min_tokens), eos_token_ids, seed)
        return RequestPlan(request.prompt_token_ids, sampling, {"request_type": "context_only"}, holds_kv=True)
    # NOTE: a hold_kv request whose only token is its last finishes as usual and holds nothing
    return RequestPlan(
        request.prompt_token_ids, sampling_kwargs(p, p.max_tokens, p.min_tokens, eos_token_ids, seed), None
    )


def sampling_kwargs(
    p: SamplingParams, max_tokens: int, min_tokens: int, eos_token_ids: tuple[int, ...], seed: int
) -> dict[str, Any]:
    """The model's first EOS id is TensorRT-LLM's end id; its other EOS ids stop as stop tokens do."""
    stops = list(p.stop_token_ids) + ([] if p.ignore_eos else list(eos_token_ids[1:]))
    if min_tokens and stops:
        # TensorRT-LLM holds back only the end id before min_tokens; stop_token_ids would still stop it early
        raise InvalidRequestError(
            "the trtllm engine cannot hold back stop_token_ids (or a second EOS id) before "
            "min_tokens; send min_tokens without stop_token_ids"
        )
    kwargs: dict[str, Any] = {
        "max_tokens": max_tokens,
        "temperature": p.temperature,
        "top_k": p.top_k,
        "top_p": p.top_p,
        "seed": p.seed if p.seed is not None else seed,
        "stop_token_ids": stops,
        "ignore_eos": p.ignore_eos,
        "detokenize": False,
        "return_perf_metrics": True,
    }
    if eos_token_ids:
        kwargs["end_id"] = eos_token_ids[0]
    if min_tokens:
        kwargs["min_tokens"] = min_tokens
    if p.logprobs or p.top_logprobs:
        kwargs["logprobs"] = max(1, p.top_logprobs)  # TensorRT-LLM returns the sampled token's with the top-k
    kwargs.update({name: getattr(p, name) for name in _SHAPING if name in p.shaping_fields()})
    if p.logit_bias:
        kwargs["logits_processor"] = LogitBias(p.logit_bias)
    if p.structured is not None:
        kwargs["guided_decoding"] = guided_decoding(p.structured)
    return kwargs


class LogitBias:
    """OpenAI's logit_bias as a TensorRT-LLM per-request logits processor (its PyTorch backend calls it with the
    step's logits, [..., vocab_size], to modify in place). NOTE (assumption): duck-typed to LogitsProcessor's
    __call__(req_id, logits, token_ids, stream_ptr, client_id); only exercised against a fake here."""

    def __init__(self, bias: tuple[tuple[int, float], ...]):
        self.token_ids = [t for t, _ in bias]
        self.values = [b for _, b in bias]

    def __call__(self, req_id, logits, token_ids, stream_ptr, client_id) -> None:
        logits[..., self.token_ids] += logits.new_tensor(self.values)


def guided_decoding(spec: StructuredSpec) -> dict[str, Any]:
    """GuidedDecodingParams(**this): TensorRT-LLM's own guided decoding, with its llguidance backend (the worker's
    LLM is built with guided_decoding_backend="llguidance", so a Lark grammar means what it means here)."""
    if spec.kind == "json_object":
        return {"json_object": True}
    if spec.kind == "json_schema":
        return {"json": spec.value}
    if spec.kind == "choice":
        return {"regex": "|".join(re.escape(c) for c in json.loads(spec.value))}
    return {spec.kind: spec.value}  # regex, grammar


def _refuse_unmapped(p: SamplingParams) -> None:
    for f in dataclasses.fields(p):
        if f.name not in MAPPED and getattr(p, f.name) != f.default:
            raise InvalidRequestError(f"the trtllm engine has no equivalent of sampling parameter {f.name}")


def encode_kv_params(disaggregated: Any) -> bytes:
    """TensorRT-LLM's DisaggregatedParams of a finished context-only request, as bytes for tandem's wire."""
    fields = {f.name: getattr(disaggregated, f.name) for f in dataclasses.fields(disaggregated)}
    sent = {k: _plain(v) for k, v in fields.items() if k not in _NOT_SENT and v is not None}
    return json.dumps({"v": _KV_PARAMS_VERSION, "trtllm": sent}, separators=(",", ":")).encode()


def decode_kv_params(blob: bytes) -> dict[str, Any]:
    try:
        msg = json.loads(blob)
        if msg.get("v") != _KV_PARAMS_VERSION:
            raise ValueError(f"version {msg.get('v')!r}")
        return {k: _unplain(v) for k, v in msg["trtllm"].items()}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise InvalidRequestError(f"kv_params are not a trtllm prefill worker's ({exc})") from None


def _plain(value: Any) -> Any:
    if isinstance(value, bytes):
        return {"b64": base64.b64encode(value).decode()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return int(value) if hasattr(value, "__index__") and not isinstance(value, bool) else value


def _unplain(value: Any) -> Any:
    if isinstance(value, dict) and set(value) == {"b64"}:
        return base64.b64decode(value["b64"])
    return [_unplain(v) for v in value] if isinstance(value, list) else value
