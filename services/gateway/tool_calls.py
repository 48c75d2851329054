"""Tool calling at the gateway: the request's tools and tool_choice as OpenAI sends them, the prompt they make (the
template's own tool rendering, or a Hermes-style system prompt for templates that have none), and the grammar that
forces a call. No I/O; the engine only ever sees a prompt and a StructuredSpec."""

import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from engines.base.structured import StructuredSpec
from services.gateway.errors import InvalidRequestError
from services.gateway.tool_parsers import ToolParser

NAME_PATTERN = r"^[a-zA-Z0-9_.-]{1,64}$"
DEFAULT_SYSTEM = (
    "You are a function calling AI model. You may call one or more functions to assist with the user "
    "query. Here are the available tools: <tools>\n{tools}\n</tools>\nFor each function call, return "
    "a json object with function name and arguments within <tool_call></tool_call> XML tags:\n"
    '<tool_call>\n{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)


class _Open(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FunctionDef(_Open):
    name: str = Field(pattern=NAME_PATTERN)
    description: str | None = None
    parameters: dict | None = None
    strict: bool | None = None


class Tool(_Open):
    type: Literal["function"]
    function: FunctionDef


class _Name(_Open):
    name: str


class NamedToolChoice(_Open):
    type: Literal["function"]
    function: _Name


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class CalledFunction(_Open):
    name: str
    arguments: str


class ToolCall(_Open):
    id: str
    type: Literal["function"] = "function"
    function: CalledFunction


def check_tools(tools: list[Tool] | None, choice: ToolChoice | None) -> None:
    names = [t.function.name for t in tools or ()]
    if len(set(names)) != len(names):
        raise InvalidRequestError("tool names must be unique", param="tools")
    if choice in ("required",) and not names:
        raise InvalidRequestError("tool_choice `required` needs tools", param="tool_choice")
    if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
        raise InvalidRequestError(
            f"tool_choice names {choice.function.name!r}, which is not in tools", param="tool_choice"
        )


def wants_calls(tools: list[Tool] | None, choice: ToolChoice | None) -> bool:
    """Whether tools are offered at all (tool_choice none: the model answers in text, as if there were none)."""
    return bool(tools) and choice != "none"


def forced_spec(
    tools: list[Tool], choice: ToolChoice | None, parallel: bool, parser: ToolParser
) -> StructuredSpec | None:
    """The grammar of `required` (any tool) or a named function (that one); None when the model may choose."""
    if choice == "required":
        chosen = tools
    elif isinstance(choice, NamedToolChoice):
        chosen, parallel = [t for t in tools if t.function.name == choice.function.name], False
    else:
        return None
    schemas = [json.dumps(parser.call_schema(t.function.name, t.function.parameters)) for t in chosen]
    return StructuredSpec("grammar", parser.calls_grammar(schemas, parallel), "tool_choice")


def template_renders_tools(chat_template: str | None) -> bool:
    return bool(chat_template) and "tools" in chat_template


def render_history(messages: list[dict], tools: list[Tool] | None, parser: ToolParser, native: bool) -> list[dict]:
    """Messages as the chat template takes them. A template that renders tools itself gets OpenAI's shapes
    (tool_calls with parsed arguments, tool messages); one that does not gets them as text in the parser's format,
    tool results as user turns in <tool_response> tags, and the tools in a system prompt."""
    if native:
        return [_native(m) for m in messages]
    out = [_as_text(m, parser) for m in messages]
    if tools:
        listing = "\n".join(json.dumps(t.model_dump(exclude_none=True)) for t in tools)
        system = DEFAULT_SYSTEM.format(tools=listing)
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": out[0]["content"] + "\n\n" + system}
        else:
            out.insert(0, {"role": "system", "content": system})
    return out


def _native(m: dict) -> dict:
    if m.get("tool_calls"):
        calls = [
            {**c, "function": {**c["function"], "arguments": _loads(c["function"]["arguments"])}}
            for c in m["tool_calls"]
        ]
        return {**m, "tool_calls": calls, "content": m.get("content") or ""}
    return m


def _as_text(m: dict, parser: ToolParser) -> dict:
    if m["role"] == "tool":
        return {"role": "user", "content": f"<tool_response>\n{m['content']}\n</tool_response>"}
    if m.get("tool_calls"):
        calls = "\n".join(
            parser.render_call(c["function"]["name"], c["function"]["arguments"]) for c in m["tool_calls"]
        )
        return {"role": "assistant", "content": ((m.get("content") or "") + "\n" + calls).strip()}
    return {k: v for k, v in m.items() if k in ("role", "content", "name")}


def _loads(arguments: str):
    try:
        return json.loads(arguments)
    except json.JSONDecodeError:
        return arguments
