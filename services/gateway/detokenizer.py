"""Incremental detokenization: text deltas that never split a UTF-8 character, O(1) amortized per token,
special tokens skipped. Also each token's raw bytes, which logprobs report. No I/O, no request state."""
import re
from collections.abc import Sequence

from transformers import PreTrainedTokenizerBase

REPLACEMENT = "\ufffd"  # what decoding an incomplete UTF-8 sequence ends with
CONTEXT_TOKENS = 5  # prompt tokens decoded ahead of the output, so a leading space decodes as it would mid-text
_SP_BYTE = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")  # SentencePiece byte-fallback tokens
_SP_SPACE = "\u2581"


class IncrementalDetokenizer:
    """Decodes a growing list of token ids into text deltas.

    Two offsets into the ids: text up to `read_offset` has been emitted; decoding starts at
    `prefix_offset` so the tokens before it give context. A delta is emitted only once the decoded
    window grew and does not end in U+FFFD (the tail of a character whose bytes are still coming).
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, prompt_ids: Sequence[int] = ()):
        self._tokenizer = tokenizer
        self._ids: list[int] = list(prompt_ids[-CONTEXT_TOKENS:]) if CONTEXT_TOKENS else []
        self._prefix_offset = 0
        self._read_offset = len(self._ids)

    def push(self, token_ids: Sequence[int]) -> str:
        """Add tokens; return the text they complete (possibly "")."""
        self._ids.extend(token_ids)
        prefix, text = self._window()
        if len(text) <= len(prefix) or text.endswith(REPLACEMENT):
            return ""
        self._advance()
        return text[len(prefix):]

    def flush(self) -> str:
        """At the end: whatever is held back, even an incomplete character (as U+FFFD)."""
        prefix, text = self._window()
        self._advance()
        return text[len(prefix):] if len(text) > len(prefix) else ""

    def _window(self) -> tuple[str, str]:
        ids = self._ids
        prefix = self._decode(ids[self._prefix_offset:self._read_offset])
        return prefix, self._decode(ids[self._prefix_offset:])

    def _advance(self) -> None:
        # NOTE: keep only the new context window, so every decode stays a handful of tokens long
        del self._ids[:self._read_offset]
        self._prefix_offset, self._read_offset = 0, len(self._ids)

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=True) if ids else ""


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
