"""OpenAI streaming responses, one SSE line at a time: what a benchmark client needs from each event.

Pure parsing: no sockets, no clocks. The caller stamps the time each event arrives.
"""

import json
from dataclasses import dataclass
from enum import Enum


class EventKind(str, Enum):
    CONTENT = "content"  # a chunk carrying generated text (or a first/last chunk with a finish reason)
    USAGE = "usage"  # the usage-only chunk (stream_options.include_usage)
    DONE = "done"  # data: [DONE]
    ERROR = "error"  # an error event sent after the stream started
    OTHER = "other"  # comments, blank lines, fields other than data, empty choices


@dataclass(frozen=True, slots=True)
class SseEvent:
    kind: EventKind
    text: str = ""
    finish_reason: str | None = None
    num_completion_tokens: int | None = None  # from `usage`, when the chunk carries it
    error: str | None = None


_OTHER = SseEvent(EventKind.OTHER)
_DONE = SseEvent(EventKind.DONE)


def parse_sse_line(line: str) -> SseEvent:
    """One line of an SSE body (without its newline). Events here are single-line `data:` fields."""
    if not line.startswith("data:"):
        return _OTHER  # blank separators, ": keep-alive" comments, event:/id:/retry: fields
    data = line[5:].strip()
    if data == "[DONE]":
        return _DONE
    try:
        payload = json.loads(data)
    except ValueError:
        return SseEvent(EventKind.ERROR, error=f"not JSON: {data[:200]!r}")
    if not isinstance(payload, dict):
        return SseEvent(EventKind.ERROR, error=f"not a JSON object: {data[:200]!r}")
    return parse_chunk(payload)


def parse_chunk(payload: dict) -> SseEvent:
    """A decoded chat.completion.chunk or text_completion chunk (first choice only: the bench sends n=1)."""
    if "error" in payload:
        err = payload["error"]
        return SseEvent(EventKind.ERROR, error=err.get("message", str(err)) if isinstance(err, dict) else str(err))
    usage = payload.get("usage") or {}
    tokens = usage.get("completion_tokens")
    choices = payload.get("choices") or []
    if not choices:
        return SseEvent(EventKind.USAGE, num_completion_tokens=tokens) if tokens is not None else _OTHER
    choice = choices[0]
    return SseEvent(
        EventKind.CONTENT,
        text=_choice_text(choice),
        finish_reason=choice.get("finish_reason"),
        num_completion_tokens=tokens,
    )


def _choice_text(choice: dict) -> str:
    if "text" in choice:  # /v1/completions
        return choice["text"] or ""
    delta = choice.get("delta") or {}  # /v1/chat/completions
    return delta.get("content") or delta.get("reasoning_content") or ""
