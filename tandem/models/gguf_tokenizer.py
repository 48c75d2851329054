"""Rebuild a byte-level BPE `tokenizers.Tokenizer` from GGUF tokenizer metadata (llama.cpp's "gpt2" model).

Reads metadata only; writing the files is hf_files' job.
"""

from dataclasses import dataclass

from gguf import GGUFReader
from tokenizers import AddedToken, Tokenizer, decoders, pre_tokenizers, processors
from tokenizers.models import BPE

from tandem.models.errors import GGUFConversionError

# llama.cpp token types (gguf.TokenType): 3 = CONTROL, 4 = USER_DEFINED
_CONTROL, _USER_DEFINED = 3, 4
# llama.cpp pre-tokenizer names whose regex starts by isolating every digit (LLAMA_VOCAB_PRE_TYPE_SMOLLM,
# STARCODER, REFACT): the Hugging Face tokenizers express that as Digits(individual_digits=True).
_DIGIT_SPLIT_PRE = frozenset({"smollm", "starcoder", "refact"})
# plain GPT-2 regex pre-tokenizers
_GPT2_PRE = frozenset({"default", "gpt-2", "gpt2"})


@dataclass(frozen=True, slots=True)
class GGUFTokenizer:
    tokenizer: Tokenizer
    special: dict[str, str | None]  # bos_token / eos_token / pad_token / unk_token
    special_ids: dict[str, int | None]  # bos_token_id / eos_token_id / pad_token_id
    chat_template: str | None


def field(reader: GGUFReader, key: str, default=None):
    """One metadata value (scalars unwrapped, string arrays as lists); `default` when absent."""
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def build_tokenizer(reader: GGUFReader) -> GGUFTokenizer:
    model = field(reader, "tokenizer.ggml.model")
    if model != "gpt2":
        raise GGUFConversionError(f"unsupported GGUF tokenizer model {model!r}; supported: 'gpt2' (byte-level BPE)")
    tokens: list[str] = field(reader, "tokenizer.ggml.tokens")
    types: list[int] = field(reader, "tokenizer.ggml.token_type") or [1] * len(tokens)
    merges = [tuple(m.split(" ", 1)) for m in field(reader, "tokenizer.ggml.merges", [])]
    tok = Tokenizer(BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=False))
    tok.pre_tokenizer = _pre_tokenizer(field(reader, "tokenizer.ggml.pre", "default"))
    tok.decoder = decoders.ByteLevel()
    # NOTE: tokens already in the vocab keep their ids when registered as added tokens
    tok.add_special_tokens([_added(tokens[i], True) for i, t in enumerate(types) if t == _CONTROL])
    tok.add_tokens([_added(tokens[i], False) for i, t in enumerate(types) if t == _USER_DEFINED])
    ids = _special_ids(reader)
    tok.post_processor = _post_processor(reader, tokens, ids["bos_token_id"])
    return GGUFTokenizer(
        tokenizer=tok,
        special=_special_strings(tokens, ids, field(reader, "tokenizer.ggml.unknown_token_id")),
        special_ids=ids,
        chat_template=field(reader, "tokenizer.chat_template"),
    )


def _added(content: str, special: bool) -> AddedToken:
    return AddedToken(content, special=special, normalized=False)


def _pre_tokenizer(pre: str) -> pre_tokenizers.PreTokenizer:
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in _DIGIT_SPLIT_PRE:
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    if pre in _GPT2_PRE:
        return byte_level
    known = sorted(_DIGIT_SPLIT_PRE | _GPT2_PRE)
    raise GGUFConversionError(f"unsupported GGUF pre-tokenizer {pre!r}; supported: {known}")


def _special_ids(reader: GGUFReader) -> dict[str, int | None]:
    return {
        "bos_token_id": field(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": field(reader, "tokenizer.ggml.eos_token_id"),
        "pad_token_id": field(reader, "tokenizer.ggml.padding_token_id"),
    }


def _special_strings(tokens: list[str], ids: dict[str, int | None], unk_id: int | None) -> dict[str, str | None]:
    def name(token_id: int | None) -> str | None:
        return tokens[token_id] if token_id is not None and 0 <= token_id < len(tokens) else None

    return {
        "bos_token": name(ids["bos_token_id"]),
        "eos_token": name(ids["eos_token_id"]),
        "pad_token": name(ids["pad_token_id"]),
        "unk_token": name(unk_id),
    }


def _post_processor(reader: GGUFReader, tokens: list[str], bos_id: int | None) -> processors.PostProcessor:
    if field(reader, "tokenizer.ggml.add_bos_token", False) and bos_id is not None:
        bos = tokens[bos_id]
        return processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, bos_id)]
        )
    return processors.ByteLevel(trim_offsets=False)
