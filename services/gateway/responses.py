"""OpenAI response shapes: chat and text completions, whole or as stream chunks, usage and logprobs.

Pure functions of choice deltas; what the JSON looks like and nothing else.
"""

import json
import time
from dataclasses import dataclass, field

from engines.base.types import TokenLogprob
from services.gateway.chat_output import split_delta, split_message
from services.gateway.choices import ChoiceDelta
from services.gateway.detokenizer import TokenBytes

MIN_LOGPROB = -9999.0


@dataclass(slots=True)
class ChoiceTotal:
    """A whole choice, accumulated from its deltas (non-streaming responses)."""

    index: int
    text: str = ""
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    parts: list = field(default_factory=list)  # chat_output.MessagePart of a split choice (tools, reasoning)

    def add(self, delta: ChoiceDelta) -> None:
        if hasattr(delta, "part"):
            self.parts.append(delta.part)
        self.text += delta.text
        self.logprobs.extend(delta.logprobs)
        self.finish_reason = delta.finish_reason or self.finish_reason


def _finite(logprob: float) -> float:
    # NOTE: JSON has no -inf; OpenAI reports impossible tokens as -9999.0
    return logprob if logprob >= MIN_LOGPROB else MIN_LOGPROB


def usage(num_prompt_tokens: int, num_completion_tokens: int, num_cached_tokens: int = 0) -> dict:
    return {
        "prompt_tokens": num_prompt_tokens,
        "completion_tokens": num_completion_tokens,
        "total_tokens": num_prompt_tokens + num_completion_tokens,
        "prompt_tokens_details": {"cached_tokens": num_cached_tokens},
    }


_SLOTS = ("\x00index", "\x00text", "\x00finish")  # placeholders: JSON-encoded, they appear as "\u0000index"...


def _template(chunk: dict) -> str:
    """`chunk`'s JSON with %-slots where its placeholders were: index (%d), text and finish reason (%s, JSON)."""
    text = json.dumps(chunk).replace("%", "%%")
    for slot, fmt in zip(_SLOTS, ("%d", "%s", "%s")):
        text = text.replace(json.dumps(slot), fmt)
    return text


class _Format:
    """The envelope both endpoints share; subclasses shape choices and logprobs."""

    object_name = chunk_object_name = ""

    def __init__(self, request_id: str, model: str, token_bytes: TokenBytes, wants_logprobs: bool):
        self.request_id, self.model = request_id, model
        self.created = int(time.time())
        self._bytes, self._wants_logprobs = token_bytes, wants_logprobs
        self._templates: dict[bool, str] = {}  # is_first -> a chunk's JSON with slots (no logprobs)

    def chunk(self, delta: ChoiceDelta, is_first: bool) -> dict:
        return self._envelope(self.chunk_object_name, [self.chunk_choice(delta, is_first)])

    def chunk_json(self, delta: ChoiceDelta, is_first: bool) -> str:
        """`chunk` as JSON. Without logprobs (the streaming hot path) only the text is encoded: the rest comes
        from a template made once per request and kind of chunk."""
        if self._wants_logprobs or hasattr(delta, "part"):
            return json.dumps(self.chunk(delta, is_first))
        template = self._templates.get(is_first)
        if template is None:
            slots = ChoiceDelta(_SLOTS[0], _SLOTS[1], 0, finish_reason=_SLOTS[2])  # type: ignore[arg-type]
            template = self._templates[is_first] = _template(self.chunk(slots, is_first))
        return template % (delta.index, json.dumps(delta.text), json.dumps(delta.finish_reason))

    def usage_chunk(self, num_prompt_tokens: int, num_completion_tokens: int, num_cached_tokens: int = 0) -> dict:
        return self._envelope(
            self.chunk_object_name, [], usage=usage(num_prompt_tokens, num_completion_tokens, num_cached_tokens)
        )

    def whole(
        self, choices: list[ChoiceTotal], num_prompt_tokens: int, num_completion_tokens: int, num_cached_tokens: int = 0
    ) -> dict:
        return self._envelope(
            self.object_name,
            [self.whole_choice(c) for c in choices],
            usage=usage(num_prompt_tokens, num_completion_tokens, num_cached_tokens),
        )

    def _envelope(self, obj: str, choices: list[dict], **extra) -> dict:
        return {
            "id": self.request_id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": choices,
            **extra,
        }

    def chunk_choice(self, delta: ChoiceDelta, is_first: bool) -> dict:
        raise NotImplementedError

    def whole_choice(self, choice: ChoiceTotal) -> dict:
        raise NotImplementedError


class ChatFormat(_Format):
    object_name, chunk_object_name = "chat.completion", "chat.completion.chunk"

    def chunk_choice(self, delta: ChoiceDelta, is_first: bool) -> dict:
        message = {"role": "assistant", "content": delta.text} if is_first else {"content": delta.text}
        if hasattr(delta, "part"):
            message = split_delta(delta.part, is_first)
        return {
            "index": delta.index,
            "delta": message,
            "logprobs": self._logprobs(delta.logprobs),
            "finish_reason": delta.finish_reason,
        }

    def whole_choice(self, choice: ChoiceTotal) -> dict:
        message = (
            split_message(choice.parts, choice.text) if choice.parts else {"role": "assistant", "content": choice.text}
        )
        return {
            "index": choice.index,
            "message": message,
            "logprobs": self._logprobs(choice.logprobs),
            "finish_reason": choice.finish_reason,
        }

    def _logprobs(self, logprobs) -> dict | None:
        if not self._wants_logprobs:
            return None
        return {"content": [self._entry(lp) for lp in logprobs], "refusal": None}

    def _entry(self, lp: TokenLogprob) -> dict:
        top = [self._item(token_id, logprob) for token_id, logprob in lp.top]
        return {**self._item(lp.token_id, lp.logprob), "top_logprobs": top}

    def _item(self, token_id: int, logprob: float) -> dict:
        return {"token": self._bytes.label(token_id), "logprob": _finite(logprob), "bytes": list(self._bytes(token_id))}


class CompletionFormat(_Format):
    object_name = chunk_object_name = "text_completion"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._offsets: dict[int, int] = {}  # choice index -> text offset of its next token (streaming)

    def chunk_choice(self, delta: ChoiceDelta, is_first: bool) -> dict:
        return {
            "index": delta.index,
            "text": delta.text,
            "logprobs": self._logprobs(delta.index, delta.logprobs),
            "finish_reason": delta.finish_reason,
        }

    def whole_choice(self, choice: ChoiceTotal) -> dict:
        return {
            "index": choice.index,
            "text": choice.text,
            "logprobs": self._logprobs(choice.index, choice.logprobs),
            "finish_reason": choice.finish_reason,
        }

    def _logprobs(self, index: int, logprobs) -> dict | None:
        if not self._wants_logprobs:
            return None
        labels = [self._bytes.label(lp.token_id) for lp in logprobs]
        offsets, offset = [], self._offsets.get(index, 0)
        for lp in logprobs:
            offsets.append(offset)
            offset += len(self._bytes(lp.token_id).decode("utf-8", errors="ignore"))
        self._offsets[index] = offset
        return {
            "tokens": labels,
            "token_logprobs": [_finite(lp.logprob) for lp in logprobs],
            "top_logprobs": [{self._bytes.label(t): _finite(v) for t, v in lp.top} for lp in logprobs],
            "text_offset": offsets,
        }
