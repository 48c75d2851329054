"""Incremental detokenization: text deltas that never split a UTF-8 character, O(1) per token, special tokens
skipped, decoded once in the tokenizers library (its DecodeStream). Also each token's raw bytes, which logprobs
report. No I/O, no request state."""

import re
from collections.abc import Sequence

from tokenizers.decoders import DecodeStream
from transformers import PreTrainedTokenizerBase

CONTEXT_TOKENS = 5  # prompt tokens decoded ahead of the output, so a leading space decodes as it would mid-text
_SP_BYTE = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")  # SentencePiece byte-fallback tokens
_SP_SPACE = "\u2581"


class IncrementalDetokenizer:
    """Decodes a growing list of token ids into text deltas, with the fast tokenizer's own DecodeStream.

    The stream holds back the tokens of a character whose bytes are still coming; they are kept here too, so
    that `flush` can emit them (as U+FFFD) when the output ends inside a character.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, prompt_ids: Sequence[int] = ()):
        self._backend = tokenizer.backend_tokenizer
        context = list(prompt_ids[-CONTEXT_TOKENS:]) if CONTEXT_TOKENS else []
        self._stream = DecodeStream(ids=context, skip_special_tokens=True)
        self._emitted: list[int] = context  # the last ids that produced text: the context for `flush`
        self._pending: list[int] = []  # ids pushed since the last text came out

    def push(self, token_ids: Sequence[int]) -> str:
        """Add tokens; return the text they complete (possibly "")."""
        if not token_ids:
            return ""
        text = self._stream.step(self._backend, list(token_ids))
        self._pending.extend(token_ids)
        if text is None:
            return ""
        self._emitted, self._pending = self._pending[-CONTEXT_TOKENS:], []
        return text

    def flush(self) -> str:
        """At the end: whatever is held back, even an incomplete character (as U+FFFD)."""
        if not self._pending:
            return ""
        prefix = self._decode(self._emitted)
        text = self._decode(self._emitted + self._pending)
        self._pending = []
        return text[len(prefix) :] if len(text) > len(prefix) and text.startswith(prefix) else ""

    def _decode(self, ids: list[int]) -> str:
        return self._backend.decode(ids, skip_special_tokens=True) if ids else ""


def _byte_level_table() -> dict[str, int]:
    """Byte-level BPE's alphabet: each byte is one printable character (GPT-2's scheme)."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {chr(b): b for b in printable}
    others = [b for b in range(256) if b not in table.values()]
    table.update({chr(0x100 + i): b for i, b in enumerate(others)})
    return table


class TokenBytes:
    """The raw bytes of single tokens, and the label OpenAI logprobs show for them; cached per id."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase):
        self._tokenizer = tokenizer
        self._added = {i: t.content for i, t in tokenizer.added_tokens_decoder.items()}
        backend = getattr(tokenizer, "backend_tokenizer", None)
        decoder = getattr(backend, "decoder", None) if backend is not None else None
        is_byte_level = decoder is not None and b'"ByteLevel"' in decoder.__getstate__()
        self._table = _byte_level_table() if is_byte_level else None
        self._cache: dict[int, bytes] = {}

    def __call__(self, token_id: int) -> bytes:
        raw = self._cache.get(token_id)
        if raw is None:
            raw = self._cache[token_id] = self._compute(token_id)
        return raw

    def label(self, token_id: int) -> str:
        """The token's text, or `bytes:\\xNN...` when it is part of a character."""
        raw = self(token_id)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)

    def _compute(self, token_id: int) -> bytes:
        if token_id in self._added:
            return self._added[token_id].encode("utf-8")
        piece = self._tokenizer.convert_ids_to_tokens(token_id)
        if piece is None:
            return b""
        if self._table is not None and all(c in self._table for c in piece):
            return bytes(self._table[c] for c in piece)
        match = _SP_BYTE.match(piece)
        if match:
            return bytes([int(match.group(1), 16)])
        if _SP_SPACE in piece:
            return piece.replace(_SP_SPACE, " ").encode("utf-8")
        return self._tokenizer.decode([token_id]).encode("utf-8")
