"""/v1/completions beyond one prompt: a list of prompts (one choice per prompt x n, indexed in order, whole and
streamed, each choice its own worker request on its own prompt; usage counts every prompt), and a grammar."""

import json

import pytest

from services.gateway.errors import InvalidRequestError
from services.gateway.openai_protocol import MAX_CHOICES, CompletionRequest, parse_request
from tests.unit.services.gateway.conftest import MODEL, REPLY


def prompts_of(**body) -> list:
    return parse_request(CompletionRequest, json.dumps({"model": "m"} | body).encode()).prompts()


def test_prompt_shapes():
    assert prompts_of(prompt="hi") == ["hi"]
    assert prompts_of(prompt=["hi", "yo"]) == ["hi", "yo"]
    assert prompts_of(prompt=[1, 2, 3]) == [[1, 2, 3]]
    assert prompts_of(prompt=[[1, 2], [3]]) == [[1, 2], [3]]
    for prompt in ([], [[1], []], ""):
        with pytest.raises(InvalidRequestError, match="empty") as info:
            prompts_of(prompt=prompt)
        assert info.value.param == "prompt"


def test_too_many_choices_is_a_400_naming_the_prompt():
    assert len(prompts_of(prompt=["a"] * (MAX_CHOICES // 4), n=4)) == MAX_CHOICES // 4
    with pytest.raises(InvalidRequestError, match=f"at most {MAX_CHOICES}") as info:
        prompts_of(prompt=["a"] * (MAX_CHOICES // 4 + 1), n=4)
    assert info.value.param == "prompt"


def by_req_id(stack) -> dict[str, list[int]]:
    return {r.req_id: list(r.token_ids) for r in stack.decode.generate_requests}


async def test_a_batch_of_token_id_prompts_gets_n_choices_each_in_order(stack, reply_ids):
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
    out = await stack.client.completions.create(model=MODEL, prompt=prompts, n=2, max_tokens=4, seed=3)
    assert [c.index for c in out.choices] == list(range(6))
    assert all(c.finish_reason == "length" for c in out.choices)
    assert out.usage.prompt_tokens == 9 and out.usage.completion_tokens == 6 * 4
    sent = by_req_id(stack)
    assert [sent[f"{out.id}-{i}"] for i in range(6)] == [prompts[i // 2] for i in range(6)]
    seeds = {r.req_id: r.params.seed for r in stack.decode.generate_requests}
    assert [seeds[f"{out.id}-{i}"] for i in range(6)] == [3, 4] * 3  # each prompt's choices seeded as if alone


async def test_a_batch_of_text_prompts_streamed(stack, tokenizer, reply_ids):
    prompts = ["The capital of France is", "Once upon a time"]
    stream = await stack.client.completions.create(
        model=MODEL, prompt=prompts, max_tokens=100, stream=True, stream_options={"include_usage": True}
    )
    texts, finishes, usage = {}, {}, None
    async for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + choice.text
            finishes[choice.index] = choice.finish_reason or finishes.get(choice.index)
    assert texts == {0: REPLY, 1: REPLY} and set(finishes) == {0, 1} and None not in finishes.values()
    assert usage.prompt_tokens == sum(len(tokenizer.encode(p)) for p in prompts)
    assert usage.completion_tokens == 2 * len(reply_ids)
    assert sorted(by_req_id(stack).values()) == sorted(tokenizer.encode(p) for p in prompts)


async def test_one_bad_prompt_in_a_batch_is_a_400_and_sends_nothing(stack):
    response = await stack.http.post("/v1/completions", json={"model": MODEL, "prompt": [[5, 6], [10**9]]})
    assert response.status_code == 400 and response.json()["error"]["param"] == "prompt"
    assert stack.decode.generate_requests == []


async def test_structured_outputs_on_completions_reach_every_choice(stack):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    await stack.client.completions.create(
        model=MODEL, prompt=[[5, 6], [7]], max_tokens=2, extra_body={"structured_outputs": {"json": schema}}
    )
    specs = [r.params.structured for r in stack.decode.generate_requests]
    assert len(specs) == 2 and all(json.loads(s.value) == schema for s in specs)
    response = await stack.http.post(
        "/v1/completions", json={"model": MODEL, "prompt": "x", "structured_outputs": {"regex": "[0-"}}
    )
    assert response.status_code == 400 and response.json()["error"]["param"] == "structured_outputs"
