"""The sampling surface clients send, through the real gateway to fake workers: penalties, logit_bias, top_k, min_p
reach both workers of a disaggregated request; vLLM's benchmark fields are accepted; usage in every chunk; the
x-request-id header is the id and comes back; a max_tokens the context cannot hold is a 400 naming it."""

import json

import pytest

from tests.unit.services.gateway.conftest import MODEL

MESSAGES = [{"role": "user", "content": "Say hello"}]
SHAPING = {
    "presence_penalty": 0.5,
    "frequency_penalty": -0.25,
    "repetition_penalty": 1.25,
    "top_k": 40,
    "min_p": 0.05,
    "logit_bias": {"7": 5.0, "3": -100},
}


def body(**kw) -> dict:
    return {"model": MODEL, "messages": MESSAGES, "max_tokens": 8, **kw}


def check_shaping(params) -> None:
    assert (params.presence_penalty, params.frequency_penalty, params.top_k) == (0.5, -0.25, 40)
    assert params.repetition_penalty == pytest.approx(1.25) and params.min_p == pytest.approx(0.05)
    assert dict(params.logit_bias) == {3: -100.0, 7: 5.0}


async def test_shaping_fields_reach_the_prefill_and_the_decode_worker(stack):
    stack.disaggregate()
    response = await stack.http.post("/v1/chat/completions", json=body(**SHAPING))
    assert response.status_code == 200, response.text
    (prefill,) = stack.prefill.prefill_requests
    (generate,) = stack.decode.generate_requests
    check_shaping(prefill.params)
    check_shaping(generate.params)


async def test_vllm_bench_serve_fields_are_accepted_at_their_off_values(stack):
    fields = {
        "repetition_penalty": 1.0,
        "top_k": -1,
        "min_p": 0.0,
        "top_p": 1.0,
        "temperature": 0.0,
        "ignore_eos": True,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "logit_bias": {},
    }
    response = await stack.http.post(
        "/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 4, **fields}
    )
    assert response.status_code == 200, response.text
    (generate,) = stack.decode.generate_requests
    assert not generate.params.HasField("repetition_penalty") and generate.params.top_k == 0
    assert not generate.params.logit_bias and generate.params.presence_penalty == 0.0


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": -2.5}, "frequency_penalty"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"top_k": -2}, "top_k"),
        ({"min_p": 1.5}, "min_p"),
        ({"logit_bias": {"x": 1.0}}, "logit_bias"),
        ({"logit_bias": {"5": 101}}, "logit_bias"),
        ({"logit_bias": {"99999999": 1}}, "logit_bias"),  # past the vocabulary
        ({"max_tokens": 2**32}, "max_tokens"),  # once a uint32 overflow and a 500
        ({"max_tokens": 10_000}, "max_tokens"),  # past the context left after the prompt
        ({"max_completion_tokens": 10_000, "max_tokens": None}, "max_completion_tokens"),
        ({"min_tokens": 2**32}, "min_tokens"),
    ],
)
async def test_bad_values_are_a_400_naming_the_field(stack, fields, param):
    response = await stack.http.post("/v1/chat/completions", json=body(**fields))
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param
    assert stack.decode.generate_requests == []


async def test_max_tokens_exactly_the_context_left_is_served(stack, tokenizer):
    text = tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    left = 512 - len(tokenizer.encode(text, add_special_tokens=False))
    response = await stack.http.post("/v1/chat/completions", json=body(max_tokens=left))
    assert response.status_code == 200, response.text


async def test_continuous_usage_stats_put_usage_in_every_chunk(stack, reply_ids):
    options = {"include_usage": True, "continuous_usage_stats": True}
    async with stack.http.stream(
        "POST", "/v1/chat/completions", json=body(max_tokens=100, stream=True, stream_options=options)
    ) as response:
        lines = [line async for line in response.aiter_lines() if line.startswith("data: ")]
    chunks = [json.loads(line[6:]) for line in lines if line != "data: [DONE]"]
    *content, last = chunks
    assert content and all("usage" in c and c["choices"] for c in content)
    completion = [c["usage"]["completion_tokens"] for c in content]
    assert completion == sorted(completion) and completion[-1] == len(reply_ids)
    assert all(c["usage"]["prompt_tokens"] == last["usage"]["prompt_tokens"] > 0 for c in content)
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == len(reply_ids)


async def test_x_request_id_is_the_id_and_is_echoed(stack):
    response = await stack.http.post("/v1/chat/completions", json=body(), headers={"x-request-id": "abc-123"})
    assert response.status_code == 200 and response.headers["x-request-id"] == "abc-123"
    assert response.json()["id"] == "chatcmpl-abc-123"
    (generate,) = stack.decode.generate_requests
    assert generate.req_id.startswith("chatcmpl-abc-123-")
    again = await stack.http.post("/v1/chat/completions", json=body(), headers={"x-request-id": "abc-123"})
    assert again.status_code == 200 and again.json()["id"] == "chatcmpl-abc-123"
    assert len({r.req_id for r in stack.decode.generate_requests}) == 2  # never the same id at a worker
    error = await stack.http.post("/v1/chat/completions", json=body(top_k=-5), headers={"x-request-id": "e1"})
    assert error.status_code == 400 and error.headers["x-request-id"] == "e1"
    bad = await stack.http.post("/v1/chat/completions", json=body(), headers={"x-request-id": "a b"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "x-request-id"
    assert "x-request-id" not in bad.headers


async def test_token_id_prompts_and_health(stack):
    for prompt in ([5, 6, 7], [[5, 6, 7]]):
        response = await stack.http.post("/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 2})
        assert response.status_code == 200, response.text
    assert [list(r.token_ids) for r in stack.decode.generate_requests] == [[5, 6, 7], [5, 6, 7]]
    health = await stack.http.get("/health")
    assert health.status_code == 200 and health.json() == {"status": "ok"}
