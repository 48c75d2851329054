"""A chat choice's generated text split as OpenAI returns it: reasoning (between <think> tags) into
`reasoning_content`, then tool calls (by the request's tool parser) into `tool_calls`, the rest into `content`;
streamed as deltas, holding back only text that may still turn out to be a tag or a call. Pure string work."""

import uuid
from dataclasses import dataclass, field

from services.gateway.tool_parsers import ParsedCall, ToolParser

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
REASONING_PARSERS = ("", "think")  # "": none; think: <think>...</think> (DeepSeek-R1, Qwen3, ...)


@dataclass(slots=True)
class MessagePart:
    """What one step adds to a chat message: text, reasoning, and tool calls in OpenAI's stream shape."""

    content: str = ""
    reasoning: str = ""
    tool_calls: list[dict] = field(default_factory=list)  # stream shape: {"index", "id"?, "type"?, "function"}
    calls: list[ParsedCall] = field(default_factory=list)  # the calls completed here (whole responses)

    def __bool__(self) -> bool:
        return bool(self.content or self.reasoning or self.tool_calls)


def _held(text: str, marker: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `marker` (it may yet become it)."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


class ChoiceSplitter:
    def __init__(self, parser: ToolParser | None, reasoning: bool, starts_in_reasoning: bool = False):
        self.parser, self.reasoning = parser, reasoning
        self.in_reasoning = reasoning and starts_in_reasoning
        self.pending = ""  # text not yet emitted
        self.in_calls = False  # the tool parser's marker was seen: the rest is buffered until the end
        self.seen_text = False  # content started (reasoning only opens at the very start)
        self.has_reasoned = False  # a </think> closed the reasoning
        self.num_calls = 0

    def feed(self, text: str) -> MessagePart:
        self.pending += text
        part = MessagePart()
        if self.reasoning and self._reason(part):
            return part
        if not self.in_reasoning and not self.in_calls:
            self._content(part)
        return part

    def finish(self, finish_reason: str | None) -> tuple[MessagePart, str | None]:
        part, text = MessagePart(), self.pending
        self.pending = ""
        if self.in_reasoning:
            part.reasoning = text
            return part, finish_reason
        content, calls = self.parser.parse(text) if self.parser is not None else (text, [])
        part.content = content
        for call in calls:
            self._add_call(part, call)
        if self.num_calls and finish_reason == "stop":
            finish_reason = "tool_calls"
        return part, finish_reason

    def _reason(self, part: MessagePart) -> bool:
        """Move reasoning text into `part`; True while the start may still open a <think> (hold everything)."""
        if not self.in_reasoning and not self.seen_text:
            stripped = self.pending.lstrip()
            if stripped.startswith(THINK_OPEN):
                self.in_reasoning, self.pending = True, stripped[len(THINK_OPEN) :]
            elif THINK_OPEN.startswith(stripped):
                return True
        if self.in_reasoning:
            end = self.pending.find(THINK_CLOSE)
            if end >= 0:
                part.reasoning += self.pending[:end]
                self.pending, self.in_reasoning = self.pending[end + len(THINK_CLOSE) :], False
                self.has_reasoned = True
            else:
                keep = _held(self.pending, THINK_CLOSE)
                part.reasoning += self.pending[: len(self.pending) - keep]
                self.pending = self.pending[len(self.pending) - keep :]
        if self.has_reasoned and not self.seen_text:  # NOTE: the blank between </think> and the answer, in any chunk
            self.pending = self.pending.lstrip()
        return False

    def _content(self, part: MessagePart) -> None:
        if self.parser is None:
            part.content, self.pending = self.pending, ""
            self.seen_text = self.seen_text or bool(part.content)
            return
        marker, text = self.parser.marker, self.pending
        at = text.find(marker)
        if marker == "{" and not text.strip() and not self.seen_text:
            return  # a JSON-call format: nothing is content until the first character says which
        if at >= 0 and (marker != "{" or not self.seen_text and not text[:at].strip()):
            part.content, self.pending, self.in_calls = text[:at], text[at:], True
        else:
            keep = 0 if marker == "{" else _held(text, marker)
            part.content, self.pending = text[: len(text) - keep], text[len(text) - keep :]
        self.seen_text = self.seen_text or bool(part.content.strip())

    def _add_call(self, part: MessagePart, call: ParsedCall) -> None:
        index, self.num_calls = self.num_calls, self.num_calls + 1
        part.calls.append(call)
        part.tool_calls.append(
            {
                "index": index,
                "id": f"call_{uuid.uuid4().hex[:24]}",
                "type": "function",
                "function": {"name": call.name, "arguments": ""},
            }
        )
        part.tool_calls.append({"index": index, "function": {"arguments": call.arguments}})


def whole_calls(parts: list[MessagePart]) -> list[dict]:
    """The complete calls of a whole response, in OpenAI's message shape."""
    headers = [tc for p in parts for tc in p.tool_calls if "id" in tc]
    calls = [c for p in parts for c in p.calls]
    return [
        {"id": h["id"], "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
        for h, c in zip(headers, calls)
    ]


def split_delta(part: MessagePart, is_first: bool) -> dict:
    """A stream chunk's `delta` for a split choice."""
    message: dict = {"role": "assistant"} if is_first else {}
    if part.content or not (part.reasoning or part.tool_calls):
        message["content"] = part.content
    if part.reasoning:
        message["reasoning_content"] = part.reasoning
    if part.tool_calls:
        message["tool_calls"] = part.tool_calls
    return message


def split_message(parts: list[MessagePart], content: str) -> dict:
    """A whole response's `message` for a split choice."""
    calls = whole_calls(parts)
    message: dict = {"role": "assistant", "content": content if content or not calls else None}
    reasoning = "".join(p.reasoning for p in parts)
    if reasoning:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = calls
    return message
