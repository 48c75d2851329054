"""The whole gateway over HTTP, driven by the official openai client, against fake router and workers."""

import asyncio
import json

import grpc
import httpx
import openai
import pytest

from engines.base.block_hash import chain_block_hashes
from services.common.grpc_server import make_channel
from services.gateway.server import create_app
from services.gateway.settings import GatewaySettings
from tests.unit.services.gateway.conftest import MODEL, REPLY
from tests.unit.services.gateway.fakes import logprob_of

MESSAGES = [{"role": "user", "content": "Say hello"}]
PROMPT = "The capital of France is"


def chat_prompt(tokenizer) -> list[int]:
    text = tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    return tokenizer.encode(text, add_special_tokens=False)


async def test_chat_completion(stack, tokenizer, reply_ids):
    out = await stack.client.chat.completions.create(model=MODEL, messages=MESSAGES)
    assert out.id.startswith("chatcmpl-") and out.object == "chat.completion" and out.model == MODEL
    assert out.choices[0].message.role == "assistant"
    assert out.choices[0].message.content == REPLY
    assert out.choices[0].finish_reason == "stop"
    prompt = chat_prompt(tokenizer)
    assert (out.usage.prompt_tokens, out.usage.completion_tokens) == (len(prompt), len(reply_ids))
    (request,) = stack.decode.generate_requests
    assert list(request.token_ids) == prompt and list(request.output_token_ids) == []
    assert not request.HasField("kv")
    assert request.params.max_tokens == 512 - len(prompt)  # no limit asked: what the context holds
    assert request.params.temperature == 1.0 and request.params.top_p == 1.0 and not request.params.logprobs
    assert request.req_id == f"{out.id}-0"
    assert [r.req_id for r in stack.router.routes] == [request.req_id]
    assert list(stack.router.routes[0].token_ids) == prompt
    assert stack.router.routes[0].model == stack.model_dir  # as the workers registered it
    await stack.wait_for(lambda: stack.router.completed == [request.req_id])


async def test_route_carries_the_prompts_block_hashes_once_the_block_size_is_known(stack, tokenizer):
    stack.router.block_size = 4
    await stack.client.chat.completions.create(model=MODEL, messages=MESSAGES)
    route = stack.router.routes[0]
    prompt = chat_prompt(tokenizer)
    assert route.hash_block_size == 4 and list(route.block_hashes) == chain_block_hashes(prompt, 4)
    assert len(route.block_hashes) == len(prompt) // 4 > 0


async def test_chat_stream_with_usage(stack, tokenizer, reply_ids):
    stream = await stack.client.chat.completions.create(
        model=MODEL, messages=MESSAGES, stream=True, stream_options={"include_usage": True}, max_tokens=100
    )
    chunks = [c async for c in stream]
    *content_chunks, usage_chunk = chunks
    assert content_chunks[0].choices[0].delta.role == "assistant"
    texts = [c.choices[0].delta.content for c in content_chunks]
    assert "".join(texts) == REPLY and not any("\ufffd" in t for t in texts)
    assert [c.choices[0].finish_reason for c in content_chunks][-1] == "stop"
    assert all(c.usage is None for c in content_chunks)
    assert usage_chunk.choices == []
    assert (usage_chunk.usage.prompt_tokens, usage_chunk.usage.completion_tokens) == (
        len(chat_prompt(tokenizer)),
        len(reply_ids),
    )


async def test_completion_whole_and_streamed(stack, tokenizer, reply_ids):
    out = await stack.client.completions.create(model=MODEL, prompt=PROMPT)  # legacy default: 16 tokens
    assert out.object == "text_completion" and out.id.startswith("cmpl-")
    assert out.choices[0].text == tokenizer.decode(reply_ids[:16]) and out.choices[0].finish_reason == "length"
    assert (out.usage.prompt_tokens, out.usage.completion_tokens) == (len(tokenizer.encode(PROMPT)), 16)
    stream = await stack.client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=100, stream=True, stream_options={"include_usage": True}
    )
    chunks = [c async for c in stream]
    assert "".join(c.choices[0].text for c in chunks if c.choices) == REPLY
    assert chunks[-1].usage.completion_tokens == len(reply_ids)


async def test_completion_from_token_ids(stack, reply_ids):
    out = await stack.client.completions.create(model=MODEL, prompt=[5, 6, 7], max_tokens=3)
    assert list(stack.decode.generate_requests[0].token_ids) == [5, 6, 7]
    assert out.usage.prompt_tokens == 3 and out.usage.completion_tokens == 3


async def test_n_choices_are_separate_worker_requests(stack, reply_ids):
    out = await stack.client.chat.completions.create(model=MODEL, messages=MESSAGES, n=2, seed=7, max_tokens=100)
    assert [c.index for c in out.choices] == [0, 1]
    assert [c.message.content for c in out.choices] == [REPLY, REPLY]
    assert out.usage.completion_tokens == 2 * len(reply_ids)
    requests = sorted(stack.decode.generate_requests, key=lambda r: r.req_id)
    assert [r.req_id for r in requests] == [f"{out.id}-0", f"{out.id}-1"]
    assert [r.params.seed for r in requests] == [7, 8]
    await stack.wait_for(lambda: sorted(stack.router.completed) == [r.req_id for r in requests])


async def test_n_choices_streamed(stack, reply_ids):
    stream = await stack.client.chat.completions.create(model=MODEL, messages=MESSAGES, n=2, stream=True)
    texts = {0: "", 1: ""}
    async for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
    assert texts == {0: REPLY, 1: REPLY}


async def test_chat_logprobs(stack, tokenizer, reply_ids):
    out = await stack.client.chat.completions.create(model=MODEL, messages=MESSAGES, logprobs=True, top_logprobs=2)
    content = out.choices[0].logprobs.content
    assert len(content) == len(reply_ids)
    assert [e.logprob for e in content] == [logprob_of(i) for i in range(len(reply_ids))]
    assert b"".join(bytes(e.bytes) for e in content) == REPLY.encode()
    assert [len(e.top_logprobs) for e in content] == [2] * len(reply_ids)
    assert content[0].top_logprobs[1].logprob == logprob_of(0) - 1
    assert any(e.token.startswith("bytes:") for e in content)  # a token holding part of a character
    assert stack.decode.generate_requests[0].params.top_logprobs == 2


async def test_completion_logprobs(stack, tokenizer, reply_ids):
    out = await stack.client.completions.create(model=MODEL, prompt=PROMPT, logprobs=1, max_tokens=5)
    lp = out.choices[0].logprobs
    assert lp.token_logprobs == [logprob_of(i) for i in range(5)]
    assert lp.tokens == [tokenizer.decode([t]) for t in reply_ids[:5]]  # plain ASCII tokens here
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(5)]
    assert [list(d.values()) for d in lp.top_logprobs] == [[logprob_of(i)] for i in range(5)]


async def test_disaggregated_prefill_then_decode_with_kv(stack, tokenizer, reply_ids):
    stack.disaggregate()
    out = await stack.client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=10)
    prompt = chat_prompt(tokenizer)
    (prefill,) = stack.prefill.prefill_requests
    assert list(prefill.token_ids) == prompt and prefill.params.max_tokens == 10
    (generate,) = stack.decode.generate_requests
    # the first-token seam: the user's prompt and params, the prefill worker's token as output already made
    assert list(generate.token_ids) == prompt and list(generate.output_token_ids) == [reply_ids[0]]
    assert generate.params.max_tokens == 10
    assert generate.kv.address == stack.prefill.address and generate.kv.req_id == prefill.req_id == generate.req_id
    assert stack.decode.prefill_requests == [] and stack.prefill.generate_requests == []
    assert out.choices[0].message.content == tokenizer.decode(reply_ids[:10])
    assert out.usage.completion_tokens == 10 and out.choices[0].finish_reason == "length"


async def test_first_token_streams_before_decode_starts(stack, reply_ids, tokenizer):
    stack.disaggregate()
    stack.decode.hang_after = 0  # the decode worker never sends anything
    stream = await stack.client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True)
    first = await anext(aiter(stream))
    assert first.choices[0].delta.content == tokenizer.decode(reply_ids[:1])
    await stack.wait_for(lambda: stack.decode.generate_requests)  # the KV pull overlaps the first token
    await stream.close()
    req_id = stack.decode.generate_requests[0].req_id
    await stack.wait_for(lambda: req_id in stack.decode.cancelled and req_id in stack.decode.aborted)
    await stack.wait_for(lambda: stack.router.completed == [req_id])


async def test_prefill_finishing_at_first_token_skips_decode(stack, tokenizer, reply_ids):
    stack.disaggregate()
    out = await stack.client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=1)
    assert out.choices[0].text == tokenizer.decode(reply_ids[:1]) and out.choices[0].finish_reason == "length"
    assert stack.decode.generate_requests == [] and out.usage.completion_tokens == 1


async def test_prefill_failure_falls_back_to_local_prefill(stack, tokenizer, reply_ids):
    stack.disaggregate()
    stack.prefill.prefill_error = grpc.StatusCode.UNAVAILABLE
    out = await stack.client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=100)
    assert out.choices[0].message.content == REPLY
    (generate,) = stack.decode.generate_requests
    assert list(generate.token_ids) == chat_prompt(tokenizer) and not generate.HasField("kv")
    assert generate.params.max_tokens == 100


@pytest.mark.parametrize("code", [grpc.StatusCode.INTERNAL, grpc.StatusCode.DEADLINE_EXCEEDED])
async def test_other_prefill_failures_fall_back_too(stack, code):
    stack.disaggregate()
    stack.prefill.prefill_error = code
    out = await stack.client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3)
    assert out.usage.completion_tokens == 3 and not stack.decode.generate_requests[0].HasField("kv")


async def test_prefill_refusing_the_request_is_a_400(stack):
    stack.disaggregate()
    stack.prefill.prefill_error = grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(openai.BadRequestError, match="prefill failed"):
        await stack.client.completions.create(model=MODEL, prompt=PROMPT)
    assert stack.decode.generate_requests == []


async def test_stop_string_is_cut_and_worker_aborted(stack):
    stack.decode.token_delay_s = 0.02  # NOTE: paced like decode steps, so the abort can overtake the stream
    out = await stack.client.chat.completions.create(model=MODEL, messages=MESSAGES, stop=["中文", "😀"])
    assert out.choices[0].message.content == "Hello world! " and out.choices[0].finish_reason == "stop"
    req_id = stack.decode.generate_requests[0].req_id
    await stack.wait_for(lambda: req_id in stack.decode.aborted and req_id in stack.decode.cancelled)
    assert stack.decode.sent[req_id] < len(stack.decode.tokens)  # the stream was cut, not run to its end


async def test_stop_string_streamed_never_leaks(stack):
    stream = await stack.client.completions.create(
        model=MODEL, prompt=PROMPT, stop="world!", stream=True, max_tokens=100
    )
    chunks = [c async for c in stream]
    assert "".join(c.choices[0].text for c in chunks) == "Hello "
    assert chunks[-1].choices[0].finish_reason == "stop"


async def test_stream_disconnect_cancels_and_aborts(stack):
    stack.decode.hang_after = 3
    body = {"model": MODEL, "messages": MESSAGES, "stream": True}
    async with stack.http.stream("POST", "/v1/chat/completions", json=body) as response:
        async for line in response.aiter_lines():
            if line.startswith("data:"):
                break  # one chunk, then hang up
    req_id = stack.decode.generate_requests[0].req_id
    await stack.wait_for(lambda: req_id in stack.decode.cancelled and req_id in stack.decode.aborted)
    await stack.wait_for(lambda: stack.router.completed == [req_id])


async def test_disconnect_while_waiting_for_whole_response(stack):
    stack.decode.hang_after = 3
    task = asyncio.create_task(stack.http.post("/v1/completions", json={"model": MODEL, "prompt": PROMPT}))
    await stack.wait_for(lambda: stack.decode.sent)
    task.cancel()
    req_id = stack.decode.generate_requests[0].req_id
    await stack.wait_for(lambda: req_id in stack.decode.cancelled)
    await stack.wait_for(lambda: stack.router.completed == [req_id])


async def test_disconnect_during_prefill_aborts_prefill_worker(stack):
    stack.disaggregate()
    stack.prefill.prefill_hang = True
    body = {"model": MODEL, "prompt": PROMPT, "stream": True}
    task = asyncio.create_task(stack.http.post("/v1/completions", json=body))
    await stack.wait_for(lambda: stack.prefill.prefill_requests)
    task.cancel()
    req_id = stack.prefill.prefill_requests[0].req_id
    await stack.wait_for(lambda: req_id in stack.prefill.aborted and req_id in stack.prefill.cancelled)
    assert stack.decode.generate_requests == []


async def test_worker_dying_mid_stream_ends_with_error_event(stack):
    stack.decode.hang_after = 3
    stream = await stack.client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True)
    received = [await anext(aiter(stream))]
    await stack.wait_for(lambda: stack.decode.sent)
    await stack.servers["decode"].stop(0)  # the worker process is gone
    with pytest.raises(openai.APIError, match="unavailable"):
        async for chunk in stream:
            received.append(chunk)
    assert 1 <= len(received) <= 3


async def test_worker_failing_mid_stream_gives_503_whole(stack):
    stack.decode.generate_error = (2, grpc.StatusCode.UNAVAILABLE)
    response = await stack.http.post("/v1/chat/completions", json={"model": MODEL, "messages": MESSAGES})
    assert response.status_code == 503 and response.headers["retry-after"] == "1"
    assert response.json()["error"]["type"] == "service_unavailable_error"
    req_id = stack.decode.generate_requests[0].req_id
    await stack.wait_for(lambda: ("d0", req_id) in stack.router.reported)  # the router heard of it at once


async def test_unreachable_prefill_worker_is_reported_and_decode_prefills(stack):
    stack.disaggregate()
    stack.prefill.prefill_error = grpc.StatusCode.UNAVAILABLE
    out = await stack.client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3)
    assert out.usage.completion_tokens == 3
    await stack.wait_for(lambda: [w for w, _ in stack.router.reported] == ["p0"])


async def test_sse_wire_format(stack):
    body = {"model": MODEL, "prompt": PROMPT, "stream": True, "max_tokens": 2}
    response = await stack.http.post("/v1/completions", json=body)
    assert response.headers["content-type"].startswith("text/event-stream")
    events = [e for e in response.text.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events) and events[-1] == "data: [DONE]"
    assert json.loads(events[0][6:])["object"] == "text_completion"


async def test_models_health_ready_metrics(stack):
    models = await stack.client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert (await stack.http.get("/health")).status_code == 200
    assert (await stack.http.get("/ready")).status_code == 200
    stack.router.live_decode_workers = 0
    assert (await stack.http.get("/ready")).status_code == 503
    await stack.client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4)
    text = (await stack.http.get("/metrics")).text
    route = 'route="/v1/completions"'
    assert f'tandem_gateway_requests_total{{model="{MODEL}",{route},status="200"}} 1.0' in text
    assert f'tandem_gateway_completion_tokens_total{{model="{MODEL}"}} 4.0' in text
    assert f'tandem_gateway_time_to_first_token_seconds_count{{model="{MODEL}"}} 1.0' in text
    assert f'tandem_gateway_inter_token_latency_seconds_count{{model="{MODEL}"}} 3.0' in text
    assert f'tandem_gateway_requests_in_flight{{model="{MODEL}"}} 0.0' in text


async def test_ready_is_503_without_router(stack_with):
    async with stack_with() as stack:
        await stack.servers["router"].stop(0)
        response = await stack.http.get("/ready")
        assert response.status_code == 503 and "router" in response.json()["reason"]


async def test_worker_failing_the_request_is_a_clean_error(stack):
    stack.decode.engine_error_after = 2
    response = await stack.http.post("/v1/completions", json={"model": MODEL, "prompt": PROMPT})
    assert response.status_code == 500 and "engine blew up" in response.json()["error"]["message"]
    stream = await stack.client.completions.create(model=MODEL, prompt=PROMPT, stream=True)
    with pytest.raises(openai.APIError, match="engine blew up"):
        async for _ in stream:
            pass
    await stack.wait_until_idle()
    assert stack.decode.aborted == []  # the worker ended these itself: nothing to abort


async def test_app_with_a_given_router_channel_over_asgi(stack, model_dir):
    channel = make_channel(stack.router.address)
    app = create_app(GatewaySettings(model_dir=str(model_dir), served_model_name="other"), router_channel=channel)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as http:
        response = await http.post("/v1/completions", json={"model": "other", "prompt": PROMPT, "max_tokens": 2})
    assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] == 2
    await channel.close()


async def test_ignore_eos_and_min_tokens_reach_the_workers(stack):
    extra = {"ignore_eos": True, "min_tokens": 5}
    await stack.client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, extra_body=extra)
    stack.disaggregate()
    await stack.client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8, extra_body=extra)
    (prefill,) = stack.prefill.prefill_requests
    aggregated, continued = stack.decode.generate_requests
    for params in (aggregated.params, prefill.params):
        assert (params.ignore_eos, params.min_tokens, params.max_tokens) == (True, 5, 8)
    assert continued.params.ignore_eos and continued.HasField("kv")


@pytest.mark.parametrize(
    "path, body",
    [
        ("/v1/completions", {"prompt": PROMPT, "max_tokens": 4, "min_tokens": 5}),
        ("/v1/chat/completions", {"messages": MESSAGES, "max_completion_tokens": 4, "min_tokens": 5}),
        ("/v1/chat/completions", {"messages": MESSAGES, "min_tokens": 100_000}),  # more than the context leaves
        ("/v1/completions", {"prompt": PROMPT, "min_tokens": -1}),
        ("/v1/completions", {"prompt": PROMPT, "ignore_eos": "yes"}),
    ],
)
async def test_bad_min_tokens_or_ignore_eos_are_clear_400s(stack, path, body):
    reply = await stack.http.post(path, json={"model": MODEL, **body})
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] in ("min_tokens", "ignore_eos")
    assert stack.router.routes == []


async def test_cached_tokens_in_whole_and_streamed_usage(stack):
    stack.decode.num_cached_tokens = 7
    out = await stack.client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4)
    assert out.usage.prompt_tokens_details.cached_tokens == 7
    stream = await stack.client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=4, stream=True, stream_options={"include_usage": True}
    )
    chunks = [c async for c in stream]
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == 7


async def test_cached_tokens_come_from_the_prefill_worker_when_disaggregated(stack):
    """The decode worker imports the whole prompt's KV; what the client saved is the prefill worker's hit."""
    stack.disaggregate()
    stack.prefill.num_cached_tokens, stack.decode.num_cached_tokens = 3, 99
    out = await stack.client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, n=2)
    assert out.usage.prompt_tokens_details.cached_tokens == 3
    stream = await stack.client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=4, stream=True, stream_options={"include_usage": True}
    )
    assert [c async for c in stream][-1].usage.prompt_tokens_details.cached_tokens == 3
