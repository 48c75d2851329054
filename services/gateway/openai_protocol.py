"""OpenAI request shapes and their validation. Unknown fields, and known fields this server does not
implement, are rejected by name with a 400; nothing is silently ignored. Responses live in responses.py."""

import json
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from engines.base.structured import StructuredSpec
from engines.base.types import MAX_LOGIT_BIAS, MAX_TOP_LOGPROBS, SamplingParams
from services.gateway.errors import InvalidRequestError, from_validation_errors
from services.gateway.tenancy import MAX_CACHE_SALT_CHARS
from services.gateway.tool_calls import Tool, ToolCall, ToolChoice

MAX_N = 16
MAX_CHOICES = 64  # prompts x n of one completions request, each choice one admission slot
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 256  # NOTE: the stop matcher's work per token grows with the longest stop string
MAX_TOKENS_LIMIT = 2**32 - 1  # the wire's uint32; the context left after the prompt is checked once it is known
MAX_TOP_K = 2**31 - 1
MAX_REPETITION_PENALTY = 100.0


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StreamOptions(_Strict):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM's: usage in every chunk too (guidellm sends it)


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None  # None only for an assistant turn that made tool calls
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # assistant turns only
    tool_call_id: str | None = None  # tool turns only
    reasoning_content: str | None = None  # sent back by clients; templates do not render it

    @model_validator(mode="after")
    def _shape(self) -> "ChatMessage":
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError("content is required (it may be null only on an assistant turn with tool_calls)")
        if self.tool_calls and self.role != "assistant":
            raise ValueError("only assistant messages carry tool_calls")
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs the tool_call_id it answers")
        return self

    def template_dict(self) -> dict:
        content = self.content or ""
        text = content if isinstance(content, str) else "".join(p.text for p in content)
        role = "system" if self.role == "developer" else self.role  # templates know "system"
        out = {"role": role, "content": text} | ({"name": self.name} if self.name else {})
        if self.tool_calls:
            out["tool_calls"] = [c.model_dump() for c in self.tool_calls]
        if self.tool_call_id:
            out["tool_call_id"] = self.tool_call_id
        return out


class JsonSchemaFormat(BaseModel):
    name: str = Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")
    description: str | None = None
    schema_: dict = Field(default_factory=dict, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputs(_Strict):
    """vLLM's extension: exactly one of these."""

    json_: dict | str | None = Field(None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None


class _Common(_Strict):
    """Fields both endpoints share."""

    model: str
    max_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS_LIMIT)
    temperature: float | None = Field(None, ge=0.0, le=2.0)  # None: OpenAI's default, 1
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    seed: int | None = Field(None, ge=-(2**63), lt=2**63)
    stop: str | list[str] | None = None
    n: int = Field(1, ge=1, le=MAX_N)
    cache_salt: str | None = Field(None, min_length=1, max_length=MAX_CACHE_SALT_CHARS)  # vLLM's: cache isolation
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # vLLM's extensions that benchmark clients send (e.g. to make every request produce max_tokens tokens)
    ignore_eos: bool = Field(False, strict=True)
    min_tokens: int = Field(0, ge=0, le=MAX_TOKENS_LIMIT, strict=True)
    # logit shaping: OpenAI's three, then vLLM's (`vllm bench serve` sends repetition_penalty 1.0, top_k -1)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None  # token id (as a string) -> bias in [-100, 100]
    repetition_penalty: float | None = Field(None, gt=0.0, le=MAX_REPETITION_PENALTY)
    top_k: int | None = Field(None, ge=-1, le=MAX_TOP_K, strict=True)  # -1 or 0: off
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    # the output's grammar: OpenAI's response_format, vLLM's structured_outputs (both endpoints, as vLLM)
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None

    def stop_strings(self) -> tuple[str, ...]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or ())
        return tuple(dict.fromkeys(stops))

    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    def max_tokens_param(self) -> str:
        return "max_tokens"

    def sampling_params(self, max_tokens: int) -> SamplingParams:
        _check_min_tokens(self.min_tokens, max_tokens)
        temperature = 1.0 if self.temperature is None else self.temperature
        top_p = 1.0 if self.top_p is None else self.top_p
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            top_k=max(self.top_k or 0, 0),
            seed=self.seed,
            ignore_eos=self.ignore_eos,
            min_tokens=self.min_tokens,
            logprobs=self.num_top_logprobs() is not None,
            top_logprobs=self.num_top_logprobs() or 0,
            presence_penalty=self.presence_penalty or 0.0,
            frequency_penalty=self.frequency_penalty or 0.0,
            repetition_penalty=1.0 if self.repetition_penalty is None else self.repetition_penalty,
            min_p=self.min_p or 0.0,
            logit_bias=self.logit_bias_pairs(),
        )

    def logit_bias_pairs(self) -> tuple[tuple[int, float], ...]:
        """logit_bias as (token_id, bias) pairs, ids ascending; a 400 naming logit_bias for a bad entry."""
        pairs = []
        for key, bias in (self.logit_bias or {}).items():
            if not key.strip().isdigit() or not -100.0 <= bias <= 100.0:
                raise InvalidRequestError(
                    f"logit_bias maps token ids to biases in [-100, 100], got {key!r}: {bias}", param="logit_bias"
                )
            pairs.append((int(key), float(bias)))
        if len(pairs) > MAX_LOGIT_BIAS:
            raise InvalidRequestError(f"logit_bias takes at most {MAX_LOGIT_BIAS} tokens", param="logit_bias")
        return tuple(sorted(pairs))

    def format_spec(self) -> StructuredSpec | None:
        """The grammar response_format or structured_outputs asks for (one of them at most)."""
        specs = [s for s in (_format_spec(self.response_format), _outputs_spec(self.structured_outputs)) if s]
        if len(specs) > 1:
            raise InvalidRequestError(
                "response_format and structured_outputs cannot both be set", param="structured_outputs"
            )
        return specs[0] if specs else None

    def include_continuous_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.continuous_usage_stats

    def num_top_logprobs(self) -> int | None:
        """None: no logprobs; else how many alternatives per token."""
        raise NotImplementedError


class ChatCompletionRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS_LIMIT)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    # known OpenAI fields this server does not implement (see _UNSUPPORTED)
    functions: Any = None
    function_call: Any = None
    audio: Any = None
    modalities: Any = None
    prediction: Any = None
    store: Any = None
    metadata: Any = None
    reasoning_effort: Any = None
    service_tier: Any = None
    web_search_options: Any = None

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def max_tokens_param(self) -> str:
        return "max_completion_tokens" if self.max_completion_tokens is not None else "max_tokens"

    def num_top_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def template_messages(self) -> list[dict]:
        return [m.template_dict() for m in self.messages]


def _format_spec(fmt: ResponseFormat | None) -> StructuredSpec | None:
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return StructuredSpec("json_object", "", "response_format")
    if fmt.json_schema is None:
        raise InvalidRequestError("response_format json_schema needs its json_schema", param="response_format")
    return StructuredSpec("json_schema", json.dumps(fmt.json_schema.schema_), "response_format")


def _outputs_spec(so: StructuredOutputs | None) -> StructuredSpec | None:
    if so is None:
        return None
    given = [
        (k, v)
        for k, v in (("json_schema", so.json_), ("regex", so.regex), ("choice", so.choice), ("grammar", so.grammar))
        if v is not None
    ]
    if len(given) != 1:
        raise InvalidRequestError(
            "structured_outputs takes exactly one of json, regex, choice, grammar", param="structured_outputs"
        )
    kind, value = given[0]
    text = value if isinstance(value, str) else json.dumps(value)
    return StructuredSpec(kind, text, "structured_outputs")


class CompletionRequest(_Common):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(16, ge=1, le=MAX_TOKENS_LIMIT)  # the legacy endpoint's default
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None

    def num_top_logprobs(self) -> int | None:
        return self.logprobs

    def prompts(self) -> list[str | list[int]]:
        """The prompts, each as text or token ids: one, or a batch (OpenAI answers each with n choices, in order)."""
        prompt = self.prompt
        batch = prompt if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)) else [prompt]
        if not prompt or any(isinstance(p, list) and not p for p in batch):
            raise InvalidRequestError("the prompt is empty", param="prompt")
        if len(batch) * self.n > MAX_CHOICES:
            raise InvalidRequestError(
                f"{len(batch)} prompts with n={self.n} ask for {len(batch) * self.n} choices; "
                f"at most {MAX_CHOICES} per request",
                param="prompt",
            )
        return batch


RequestT = TypeVar("RequestT", bound=_Common)


def _off(value) -> bool:
    return not value


# field -> (accepts this value?, what to say); the first failing field is named in the 400
_UNSUPPORTED: dict[str, tuple] = {
    "functions": (_off, "function calling is not supported"),
    "function_call": (lambda v: v in (None, "none"), "function calling is not supported"),
    "audio": (_off, "audio output is not supported"),
    "modalities": (lambda v: v in (None, ["text"]), "only the text modality is supported"),
    "prediction": (_off, "predicted outputs are not supported"),
    "store": (lambda v: v in (None, False), "storing completions is not supported"),
    "metadata": (_off, "metadata (for stored completions) is not supported"),
    "reasoning_effort": (_off, "reasoning_effort is not supported"),
    "service_tier": (lambda v: v in (None, "auto", "default"), "service tiers are not supported"),
    "web_search_options": (_off, "web search is not supported"),
    "echo": (lambda v: v is False, "echo is not supported"),
    "best_of": (lambda v: v in (None, 1), "best_of > 1 is not supported"),
    "suffix": (_off, "suffix (insertion) is not supported"),
}


def parse_request(kind: type[RequestT], body: bytes) -> RequestT:
    """Validate a JSON body into `kind`, or raise a 400 naming the offending field."""
    try:
        req = kind.model_validate_json(body)
    except ValidationError as exc:
        raise from_validation_errors(exc.errors()) from None
    _check_supported(req)
    _check_consistent(req)
    return req


def _check_supported(req: _Common) -> None:
    for name in req.model_fields_set:
        rule = _UNSUPPORTED.get(name)
        if rule and not rule[0](getattr(req, name)):
            raise InvalidRequestError(f"`{name}` is not supported by this server: {rule[1]}", param=name)


def _check_min_tokens(min_tokens: int, max_tokens: int | None) -> None:
    if max_tokens is not None and min_tokens > max_tokens:
        raise InvalidRequestError(
            f"min_tokens must be less than or equal to max_tokens={max_tokens}, got {min_tokens}", param="min_tokens"
        )


def _check_consistent(req: _Common) -> None:
    _check_min_tokens(req.min_tokens, req.requested_max_tokens())
    stops = req.stop_strings()
    if len(stops) > MAX_STOP_STRINGS or any(not s for s in stops):
        raise InvalidRequestError(f"stop takes at most {MAX_STOP_STRINGS} non-empty strings", param="stop")
    if any(len(s) > MAX_STOP_CHARS for s in stops):
        raise InvalidRequestError(
            f"each stop string takes at most {MAX_STOP_CHARS} characters, got {max(len(s) for s in stops)}",
            param="stop",
        )
    if req.stream_options is not None and not req.stream:
        raise InvalidRequestError("stream_options is only allowed when stream is true", param="stream_options")
    if isinstance(req, ChatCompletionRequest) and req.top_logprobs and not req.logprobs:
        raise InvalidRequestError("top_logprobs requires logprobs to be true", param="top_logprobs")
