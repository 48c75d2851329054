"""The Responses API's request (`POST /v1/responses`) and its mapping onto a chat completion request: input items
become chat messages, function tools chat `tools`, `text.format` a `response_format`. Pure: no I/O, no HTTP.
Unknown fields, and known ones this server does not implement, are refused by name with a 400."""

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from services.gateway.errors import InvalidRequestError, from_validation_errors
from services.gateway.tenancy import MAX_CACHE_SALT_CHARS


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TextPart(_Strict):
    """A message's text: `input_text` from users, `output_text` in an assistant message sent back."""

    type: Literal["input_text", "output_text"]
    text: str
    annotations: list | None = None
    logprobs: list | None = None


class MessageItem(_Strict):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[TextPart]
    id: str | None = None
    status: str | None = None
    phase: str | None = None

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class FunctionCallItem(_Strict):
    type: Literal["function_call"]
    call_id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    arguments: str
    id: str | None = None
    status: str | None = None


class FunctionCallOutputItem(_Strict):
    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1)
    output: str | list[TextPart]
    id: str | None = None
    status: str | None = None

    def text(self) -> str:
        return self.output if isinstance(self.output, str) else "".join(p.text for p in self.output)


class ReasoningPart(_Strict):
    type: Literal["reasoning_text", "summary_text"]
    text: str


class ReasoningItem(_Strict):
    """An earlier turn's reasoning, as clients (openai-agents) send output items back."""

    type: Literal["reasoning"]
    id: str | None = None
    summary: list[ReasoningPart] = []
    content: list[ReasoningPart] | None = None
    encrypted_content: str | None = None
    status: str | None = None


InputItem = MessageItem | FunctionCallItem | FunctionCallOutputItem | ReasoningItem
_ITEM_KINDS: dict[str, TypeAdapter] = {
    kind: TypeAdapter(model)
    for kind, model in (
        ("message", MessageItem),
        ("function_call", FunctionCallItem),
        ("function_call_output", FunctionCallOutputItem),
        ("reasoning", ReasoningItem),
    )
}


class FunctionTool(_Strict):
    type: Literal["function"]
    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    def chat_tool(self) -> dict:
        function = {"name": self.name, "parameters": self.parameters or {"type": "object", "properties": {}}}
        if self.description is not None:
            function["description"] = self.description
        if self.strict is not None:
            function["strict"] = self.strict
        return {"type": "function", "function": function}


class NamedFunction(_Strict):
    type: Literal["function"]
    name: str


class TextFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None  # json_schema's, with schema, description and strict
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    description: str | None = None
    strict: bool | None = None

    def response_format(self) -> dict | None:
        if self.type == "text":
            return None
        if self.type == "json_object":
            return {"type": "json_object"}
        if not self.name or self.schema_ is None:
            raise InvalidRequestError("text.format of type json_schema needs a name and a schema", param="text")
        spec = {"name": self.name, "schema": self.schema_} | {
            k: v for k, v in (("description", self.description), ("strict", self.strict)) if v is not None
        }
        return {"type": "json_schema", "json_schema": spec}


class TextConfig(_Strict):
    format: TextFormat = TextFormat(type="text")
    verbosity: Literal["medium"] | None = None  # only the default: a small model has one verbosity


class ResponsesRequest(_Strict):
    model: str
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[FunctionTool] = []
    tool_choice: Literal["none", "auto", "required"] | NamedFunction = "auto"
    parallel_tool_calls: bool = True
    text: TextConfig = TextConfig()
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    store: bool = True
    stream: bool = False
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = Field(None, max_length=16)
    user: str | None = None
    truncation: Literal["disabled"] | None = None
    cache_salt: str | None = Field(None, min_length=1, max_length=MAX_CACHE_SALT_CHARS)  # vLLM's, as in chat
    # known OpenAI fields this server does not implement (see _UNSUPPORTED)
    include: Any = None
    reasoning: Any = None
    background: Any = None
    conversation: Any = None
    prompt: Any = None
    service_tier: Any = None
    max_tool_calls: Any = None
    top_logprobs: Any = None
    stream_options: Any = None
    prompt_cache_key: Any = None
    safety_identifier: Any = None

    def input_items(self) -> list[InputItem]:
        if isinstance(self.input, str):
            return [MessageItem(role="user", content=self.input)]
        return [parse_item(i, raw) for i, raw in enumerate(self.input)]

    def chat_body(self, messages: list[dict]) -> bytes:
        """The chat completion request this response runs as (streaming with usage when this one streams)."""
        body: dict[str, Any] = {"model": self.model, "messages": messages}
        optional = {
            "max_completion_tokens": self.max_output_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "user": self.user,
            "cache_salt": self.cache_salt,
            "response_format": self.text.format.response_format(),
        }
        body.update({k: v for k, v in optional.items() if v is not None})
        if self.tools:
            body["tools"] = [t.chat_tool() for t in self.tools]
            body["tool_choice"] = self.chat_tool_choice()
            body["parallel_tool_calls"] = self.parallel_tool_calls
        elif self.tool_choice not in ("auto", "none"):
            raise InvalidRequestError("tool_choice names a tool but no tools were given", param="tool_choice")
        if self.stream:
            body |= {"stream": True, "stream_options": {"include_usage": True}}
        return json.dumps(body).encode()

    def chat_tool_choice(self) -> str | dict:
        if isinstance(self.tool_choice, NamedFunction):
            if self.tool_choice.name not in {t.name for t in self.tools}:
                raise InvalidRequestError(
                    f"tool_choice names `{self.tool_choice.name}`, which is not among the tools", param="tool_choice"
                )
            return {"type": "function", "function": {"name": self.tool_choice.name}}
        return self.tool_choice


def parse_item(index: int, raw: dict) -> InputItem:
    kind = raw.get("type", "message")
    adapter = _ITEM_KINDS.get(kind) if isinstance(kind, str) else None
    if adapter is None:
        raise InvalidRequestError(
            f"input[{index}]: item type `{kind}` is not supported; this server takes {', '.join(_ITEM_KINDS)}",
            param="input",
        )
    try:
        return adapter.validate_python(raw)
    except ValidationError as exc:
        err = from_validation_errors(exc.errors())
        raise InvalidRequestError(f"input[{index}]: {err}", param="input") from None


def _off(value) -> bool:
    return not value


# field -> (accepts this value?, what to say); the first failing field is named in the 400
_UNSUPPORTED: dict[str, tuple] = {
    "include": (_off, "include is not supported"),
    "reasoning": (_off, "reasoning options are not supported"),
    "background": (_off, "background responses are not supported"),
    "conversation": (_off, "conversations are not supported; use previous_response_id"),
    "prompt": (_off, "prompt templates are not supported"),
    "service_tier": (lambda v: v in (None, "auto", "default"), "service tiers are not supported"),
    "max_tool_calls": (lambda v: v is None, "max_tool_calls is not supported"),
    "top_logprobs": (_off, "logprobs are not supported on /v1/responses"),
    "stream_options": (_off, "stream_options are not supported"),
    "prompt_cache_key": (lambda v: v is None, "prompt_cache_key is not supported"),
    "safety_identifier": (lambda v: v is None, "safety_identifier is not supported"),
}


def parse_responses_request(body: bytes) -> ResponsesRequest:
    """Validate a JSON body, or raise a 400 naming the offending field."""
    try:
        req = ResponsesRequest.model_validate_json(body)
    except ValidationError as exc:
        raise from_validation_errors(exc.errors()) from None
    for name in req.model_fields_set:
        rule = _UNSUPPORTED.get(name)
        if rule and not rule[0](getattr(req, name)):
            raise InvalidRequestError(f"`{name}` is not supported by this server: {rule[1]}", param=name)
    return req
