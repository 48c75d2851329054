"""What a chat request's tools, response format and reasoning make of it before and after the engine: the
messages and tools the template renders, the grammar the output follows (checked here, so a bad one is a 400), and
the splitting of each choice's text into content, reasoning and tool calls. No I/O."""

from collections.abc import AsyncIterator
from dataclasses import dataclass

from engines.base.grammar import grammar_text
from engines.base.structured import StructuredSpec
from services.gateway.chat_output import THINK_OPEN, ChoiceSplitter, MessagePart
from services.gateway.choices import ChoiceDelta
from services.gateway.errors import InvalidRequestError
from services.gateway.tool_calls import check_tools, forced_spec, render_history, template_renders_tools, wants_calls
from services.gateway.tool_parsers import ToolParser

# NOTE: what the tools and the reasoning allow of a grammar: it applies after </think>. The reasoning is a lazy
# lexeme ending at the first </think> (a suffix, so nothing is backtracked); a plain regex there, even `.*?`, would
# let the text run on past </think> and leave the answer free
_AFTER_THINK = 'start: "<think>" think /[ \\n]*/ answer\nthink[suffix="</think>"]: /(?s:.*)/\n'


@dataclass(frozen=True, slots=True)
class ChatPlan:
    messages: list[dict]
    tools: list[dict] | None  # for templates that render tools themselves
    spec: StructuredSpec | None
    parser: ToolParser | None  # None: no tool calls are read back
    reasoning: bool

    def splitter(self, prompt_text: str) -> ChoiceSplitter:
        return ChoiceSplitter(self.parser, self.reasoning, prompt_text.rstrip().endswith(THINK_OPEN))

    @property
    def splits(self) -> bool:
        return self.parser is not None or self.reasoning


def plan_chat(req, chat_template: str | None, parser: ToolParser, reasoning: bool) -> ChatPlan:
    """`req` a ChatCompletionRequest; `parser` the served model's tool format; `reasoning`: a think parser is on."""
    check_tools(req.tools, req.tool_choice)
    has_tools = wants_calls(req.tools, req.tool_choice)
    native = template_renders_tools(chat_template)
    messages = render_history(
        [m.template_dict() for m in req.messages], req.tools if has_tools else None, parser, native
    )
    spec = req.format_spec()
    if has_tools:
        forced = forced_spec(req.tools, req.tool_choice, req.parallel_tool_calls is not False, parser)
        if forced is not None and spec is not None:
            raise InvalidRequestError(
                "a forced tool call and a response format cannot both constrain the output", param="tool_choice"
            )
        spec = forced or spec
    if spec is not None:
        grammar_text(spec)  # NOTE: compiles it once here: a grammar that does not compile is the client's 400
    if spec is not None and reasoning:
        spec = StructuredSpec("grammar", _AFTER_THINK + _answer_rules(spec), spec.field)
    tools = [t.model_dump(exclude_none=True) for t in req.tools] if has_tools and native else None
    return ChatPlan(messages, tools, spec, parser if has_tools else None, reasoning)


def _answer_rules(spec: StructuredSpec) -> str:
    """`spec` as Lark rules whose `answer` rule is what follows the reasoning."""
    if spec.kind != "grammar":
        return f"answer: {_as_rule(spec)}\n"
    # NOTE: a forced tool call's grammar is the gateway's own (tool_parsers): `start` is its first rule and no rule
    # refers back to it, and its other rule names (call, body) are not the wrapper's; a client's Lark grammar makes
    # no such promise
    if spec.field != "tool_choice" or not spec.value.startswith("start:"):
        raise InvalidRequestError("a grammar cannot be combined with a reasoning model yet", param=spec.field)
    return "answer:" + spec.value.removeprefix("start:")


def _as_rule(spec: StructuredSpec) -> str:
    """`spec` as one Lark rule body, for wrapping after the reasoning."""
    import json

    if spec.kind == "json_object":
        return '%json {"type": "object"}'
    if spec.kind == "json_schema":
        return "%json " + spec.value
    if spec.kind == "regex":
        return "/" + spec.value.replace("/", "\\/") + "/"
    return " | ".join(json.dumps(c) for c in json.loads(spec.value))


@dataclass(frozen=True, slots=True)
class PartDelta:
    """A ChoiceDelta whose text has been split; `text` is its content."""

    index: int
    part: MessagePart
    num_tokens: int = 0
    logprobs: tuple = ()
    finish_reason: str | None = None
    num_cached_tokens: int | None = None

    @property
    def text(self) -> str:
        return self.part.content


async def split_deltas(
    deltas: AsyncIterator[ChoiceDelta], plan: ChatPlan, prompt_text: str
) -> AsyncIterator[PartDelta]:
    splitters: dict[int, ChoiceSplitter] = {}
    async for d in deltas:
        splitter = splitters.setdefault(d.index, plan.splitter(prompt_text))
        part = splitter.feed(d.text)
        if d.finish_reason is None:
            yield PartDelta(d.index, part, d.num_tokens, d.logprobs, None, d.num_cached_tokens)
            continue
        tail, reason = splitter.finish(d.finish_reason)
        yield PartDelta(d.index, _merge(part, tail), d.num_tokens, d.logprobs, None, d.num_cached_tokens)
        for call_delta in tail.tool_calls:  # NOTE: one chunk each, as OpenAI streams them
            yield PartDelta(d.index, MessagePart(tool_calls=[call_delta]))
        yield PartDelta(d.index, MessagePart(calls=tail.calls), finish_reason=reason)


def _merge(part: MessagePart, tail: MessagePart) -> MessagePart:
    return MessagePart(part.content + tail.content, part.reasoning + tail.reasoning)
