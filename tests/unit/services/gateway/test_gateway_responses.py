"""OpenAI response shapes built from choice deltas."""

import json

import pytest

from engines.base.types import TokenLogprob
from services.gateway.choices import ChoiceDelta
from services.gateway.detokenizer import TokenBytes
from services.gateway.responses import ChatFormat, ChoiceTotal, CompletionFormat


def test_chat_chunks_and_whole(tokenizer):
    fmt = ChatFormat("chatcmpl-1", "m", TokenBytes(tokenizer), wants_logprobs=True)
    hi = tokenizer.encode("Hello", add_special_tokens=False)[0]
    word = tokenizer.decode([hi])
    delta = ChoiceDelta(0, "Hi", 1, (TokenLogprob(hi, float("-inf"), ((hi, -0.5),)),), None)
    first, later = fmt.chunk(delta, True), fmt.chunk(delta, False)
    assert first["object"] == "chat.completion.chunk" and first["choices"][0]["delta"]["role"] == "assistant"
    assert "role" not in later["choices"][0]["delta"]
    entry = first["choices"][0]["logprobs"]["content"][0]
    item = {"token": word, "bytes": list(word.encode())}
    assert entry == {**item, "logprob": -9999.0, "top_logprobs": [{**item, "logprob": -0.5}]}
    json.dumps(first, allow_nan=False)  # strict JSON: no -Infinity
    total = ChoiceTotal(0)
    total.add(delta)
    total.add(ChoiceDelta(0, "!", 1, (), "stop"))
    whole = fmt.whole([total], 3, 2, num_cached_tokens=1)
    assert whole["choices"][0]["message"] == {"role": "assistant", "content": "Hi!"}
    assert whole["usage"] == {
        "prompt_tokens": 3,
        "completion_tokens": 2,
        "total_tokens": 5,
        "prompt_tokens_details": {"cached_tokens": 1},
    }
    assert fmt.usage_chunk(3, 2, 2)["usage"]["prompt_tokens_details"] == {"cached_tokens": 2}


@pytest.mark.parametrize("kind", [ChatFormat, CompletionFormat])
def test_chunk_json_from_a_template_is_the_chunk_encoded(tokenizer, kind):
    """The streaming fast path splices text into a per-request template; it must say exactly what json.dumps says."""
    fmt = kind("id-1", 'model "50%" %s', TokenBytes(tokenizer), wants_logprobs=False)
    deltas = [
        ChoiceDelta(0, 'say "hi" \\ 100% %d %s\n中文 😀', 1),
        ChoiceDelta(2, "", 0, finish_reason="length"),
        ChoiceDelta(15, "\u0000index", 3, finish_reason="stop"),
    ]
    for delta in deltas:
        for is_first in (True, False):
            assert fmt.chunk_json(delta, is_first) == json.dumps(fmt.chunk(delta, is_first))
    delta = ChoiceDelta(0, "x", 1, (TokenLogprob(5, -0.25),))  # logprobs: encoded whole (text offsets are state)
    one, other = (kind("id-2", "m", TokenBytes(tokenizer), wants_logprobs=True) for _ in range(2))
    other.created = one.created  # NOTE: on a loaded host the two may be made in different seconds
    assert one.chunk_json(delta, True) == json.dumps(other.chunk(delta, True))


def test_completion_text_offsets_continue_across_chunks(tokenizer):
    fmt = CompletionFormat("cmpl-1", "m", TokenBytes(tokenizer), wants_logprobs=True)
    ids = tokenizer.encode("Hello world again", add_special_tokens=False)
    lps = [TokenLogprob(i, -1.0) for i in ids]
    a = fmt.chunk(ChoiceDelta(0, "", 2, tuple(lps[:2])), True)["choices"][0]["logprobs"]
    b = fmt.chunk(ChoiceDelta(0, "", len(ids) - 2, tuple(lps[2:])), False)["choices"][0]["logprobs"]
    tokens = a["tokens"] + b["tokens"]
    assert "".join(tokens) == "Hello world again"
    assert a["text_offset"] + b["text_offset"] == [len("".join(tokens[:i])) for i in range(len(tokens))]
    assert (
        CompletionFormat("c", "m", TokenBytes(tokenizer), False).chunk(ChoiceDelta(0, "x", 1), True)["choices"][0][
            "logprobs"
        ]
        is None
    )
