"""Incremental detokenization on the tiny checkpoint's byte-level BPE: emoji and CJK characters span several
tokens, and no delta may carry a half character (U+FFFD); the deltas add up to tokenizer.decode."""

import pytest

from services.gateway.detokenizer import IncrementalDetokenizer, TokenBytes

TEXTS = ["naïve café 😀👍🏽 中文字符 and 日本語 — done", "🎉🎉🎉", "a\nb\tc  d", "Ω≈ç√∫˜µ≤≥÷ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢"]


def deltas(tokenizer, ids: list[int], step: int = 1, prompt: list[int] = ()) -> list[str]:
    detok = IncrementalDetokenizer(tokenizer, prompt)
    out = [detok.push(ids[i : i + step]) for i in range(0, len(ids), step)]
    return [*out, detok.flush()]


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("step", [1, 3])
def test_deltas_never_split_a_character(tokenizer, text, step):
    ids = tokenizer.encode(text, add_special_tokens=False)
    out = deltas(tokenizer, ids, step)
    assert "".join(out) == tokenizer.decode(ids) == text
    assert not any("\ufffd" in d for d in out)


def test_split_characters_are_held_back(tokenizer):
    ids = tokenizer.encode("😀", add_special_tokens=False)
    assert len(ids) > 1 and tokenizer.decode(ids[:1]).endswith("\ufffd")  # the premise: one emoji, many tokens
    assert deltas(tokenizer, ids) == [""] * (len(ids) - 1) + ["😀", ""]


def test_special_tokens_are_skipped(tokenizer):
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    ids = tokenizer.encode("Hello there", add_special_tokens=False)
    assert "".join(deltas(tokenizer, [*ids, end])) == "Hello there"


def test_prompt_context_is_not_emitted(tokenizer):
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi 中"}], tokenize=False, add_generation_prompt=True
    )
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
    ids = tokenizer.encode(" world 文", add_special_tokens=False)
    assert "".join(deltas(tokenizer, ids, prompt=prompt_ids)) == " world 文"


def test_an_incomplete_character_is_flushed_at_the_end(tokenizer):
    ids = tokenizer.encode("ok 😀", add_special_tokens=False)[:-1]  # cut inside the emoji
    out = deltas(tokenizer, ids)
    assert "".join(out) == tokenizer.decode(ids) and out[-1].endswith("\ufffd")
    assert not any("\ufffd" in d for d in out[:-1])


def test_long_output_in_uneven_deltas(tokenizer):
    """Deltas of 1..7 tokens, as a coalescing worker sends them, add up to the whole decode."""
    ids = tokenizer.encode("The quick brown fox jumps over the lazy dog. 中文 😀 " * 40, add_special_tokens=False)
    detok, out, i = IncrementalDetokenizer(tokenizer, []), [], 0
    for size in [1, 2, 7, 3, 5] * 1000:
        if i >= len(ids):
            break
        out.append(detok.push(ids[i : i + size]))
        i += size
    out.append(detok.flush())
    assert "".join(out) == tokenizer.decode(ids) and len(ids) > 400
    assert not any("\ufffd" in d for d in out)
    assert detok.push([]) == "" and detok.flush() == ""


def test_token_bytes_and_labels(tokenizer):
    token_bytes = TokenBytes(tokenizer)
    for text in TEXTS:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert b"".join(token_bytes(i) for i in ids) == text.encode()
    (first, *_) = tokenizer.encode("😀", add_special_tokens=False)
    assert token_bytes.label(first) == "bytes:\\xf0"
    hello = tokenizer.encode("Hello", add_special_tokens=False)[0]
    assert token_bytes.label(hello) == tokenizer.decode([hello])
    assert token_bytes(tokenizer.convert_tokens_to_ids("<|im_end|>")) == b"<|im_end|>"
