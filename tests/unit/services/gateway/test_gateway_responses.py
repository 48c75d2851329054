"""OpenAI response shapes built from choice deltas."""
import json

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
    whole = fmt.whole([total], 3, 2)
    assert whole["choices"][0]["message"] == {"role": "assistant", "content": "Hi!"}
    assert whole["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}


def test_completion_text_offsets_continue_across_chunks(tokenizer):
    fmt = CompletionFormat("cmpl-1", "m", TokenBytes(tokenizer), wants_logprobs=True)
    ids = tokenizer.encode("Hello world again", add_special_tokens=False)
    lps = [TokenLogprob(i, -1.0) for i in ids]
    a = fmt.chunk(ChoiceDelta(0, "", 2, tuple(lps[:2])), True)["choices"][0]["logprobs"]
    b = fmt.chunk(ChoiceDelta(0, "", len(ids) - 2, tuple(lps[2:])), False)["choices"][0]["logprobs"]
    tokens = a["tokens"] + b["tokens"]
    assert "".join(tokens) == "Hello world again"
    assert a["text_offset"] + b["text_offset"] == [len("".join(tokens[:i])) for i in range(len(tokens))]
    assert CompletionFormat("c", "m", TokenBytes(tokenizer), False).chunk(
        ChoiceDelta(0, "x", 1), True)["choices"][0]["logprobs"] is None
