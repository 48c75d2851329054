"""Token-level migration through the real gateway: a decode worker that fails mid-stream is reported, and another
continues from the prompt plus the tokens already sent, so the client's text and logprobs go on with no gap and no
repeat (across a character split over tokens and a stop string too); the limit holds."""

import contextlib
import json

import grpc
import pytest

from services.common.drain import HAND_BACK_MESSAGE
from tests.unit.services.gateway.conftest import MODEL, REPLY
from tests.unit.services.gateway.fakes import FakeWorker, add_worker, start_server

PROMPT = "Say hello"


@contextlib.asynccontextmanager
async def spares(stack, reply_ids, n: int = 1):
    """`n` more fake decode workers ("d1", ...) the fake router picks after d0, in order."""
    workers, servers = [], []
    for i in range(1, n + 1):
        worker = FakeWorker(reply_ids)
        server, worker.address = await start_server(add_worker, worker)
        stack.router.spare_decode.append((f"d{i}", worker.address))
        workers.append(worker)
        servers.append(server)
    try:
        yield workers
    finally:
        for server in servers:
            await server.stop(0)


async def _stream_text(stack, body: dict) -> tuple[str, list[dict], dict | None]:
    """The streamed text, the chunks, and the error event if the stream ended with one."""
    chunks, error = [], None
    async with stack.http.stream("POST", "/v1/completions", json={**body, "stream": True}) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                error = event["error"]
            else:
                chunks.append(event)
    return "".join(c["choices"][0]["text"] for c in chunks), chunks, error


def _migrations(metrics_text: str) -> float:
    line = next(x for x in metrics_text.splitlines() if x.startswith("tandem_gateway_migrations_total{"))
    return float(line.rsplit(" ", 1)[1])


@pytest.mark.parametrize("code", [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED])
async def test_a_stream_whose_worker_fails_goes_on_elsewhere_without_gap_or_repeat(stack, reply_ids, tokenizer, code):
    stack.decode.generate_error = (3, code)  # 3 tokens out, then the worker is gone
    async with spares(stack, reply_ids) as (d1,):
        text, _, error = await _stream_text(
            stack, {"model": MODEL, "prompt": PROMPT, "max_tokens": 100, "seed": 7, "temperature": 0.8}
        )
    assert error is None and text == REPLY
    (first,), (second,) = stack.decode.generate_requests, d1.generate_requests
    assert second.params == first.params and second.params.seed == 7  # seeded by token index: it samples on
    prompt = tokenizer.encode(PROMPT)
    assert list(second.token_ids) == prompt and list(second.output_token_ids) == reply_ids[:3]
    assert second.params.max_tokens == 100 and second.req_id == first.req_id  # the user's numbers, unchanged
    routes = stack.router.routes
    assert [list(r.exclude_worker_ids) for r in routes] == [[], ["d0"]]
    assert list(routes[1].token_ids) == prompt + reply_ids[:3]  # the KV the next worker needs
    await stack.wait_for(lambda: stack.router.reported == [("d0", first.req_id)])
    assert _migrations((await stack.http.get("/metrics")).text) == 1.0


async def test_logprobs_go_on_where_they_stopped(stack, reply_ids):
    stack.decode.generate_error = (4, grpc.StatusCode.UNAVAILABLE)
    async with spares(stack, reply_ids):
        _, chunks, error = await _stream_text(
            stack, {"model": MODEL, "prompt": PROMPT, "max_tokens": 100, "logprobs": 0}
        )
    assert error is None
    values = [v for c in chunks if c["choices"][0]["logprobs"] for v in c["choices"][0]["logprobs"]["token_logprobs"]]
    assert values == [-0.25 * (i + 1) for i in range(len(reply_ids))]  # the fake's logprob of token i


async def test_a_character_split_over_the_failure_comes_out_whole(stack, reply_ids, tokenizer):
    cut = next(i for i in range(1, len(reply_ids)) if tokenizer.decode(reply_ids[:i]).endswith("\ufffd"))
    stack.decode.generate_error = (cut, grpc.StatusCode.UNAVAILABLE)  # mid-way through a multi-byte character
    async with spares(stack, reply_ids):
        text, _, error = await _stream_text(stack, {"model": MODEL, "prompt": PROMPT, "max_tokens": 100})
    assert error is None and text == REPLY and "\ufffd" not in text


async def test_a_stop_string_spanning_the_failure_still_stops(stack, reply_ids, tokenizer):
    cut = next(i for i in range(1, len(reply_ids)) if tokenizer.decode(reply_ids[:i]).endswith("wor"))
    stack.decode.generate_error = (cut, grpc.StatusCode.UNAVAILABLE)
    async with spares(stack, reply_ids):
        text, chunks, error = await _stream_text(
            stack, {"model": MODEL, "prompt": PROMPT, "max_tokens": 100, "stop": ["world!"]}
        )
    assert error is None and text == "Hello " and chunks[-1]["choices"][0]["finish_reason"] == "stop"


async def test_whole_and_disaggregated_requests_migrate_too(stack, reply_ids):
    stack.disaggregate()  # the prefill worker's first token, then d0 fails after 2 more
    stack.decode.generate_error = (2, grpc.StatusCode.UNAVAILABLE)
    async with spares(stack, reply_ids) as (d1,):
        out = await stack.client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=100)
    assert out.choices[0].text == REPLY and out.usage.completion_tokens == len(reply_ids)
    (resumed,) = d1.generate_requests
    assert list(resumed.output_token_ids) == reply_ids[:3] and not resumed.HasField("kv")


async def test_a_worker_handing_a_request_back_while_it_drains_is_continued(stack, reply_ids):
    async def hand_back(i: int, context) -> None:
        if i == 5:
            await context.abort(grpc.StatusCode.UNAVAILABLE, HAND_BACK_MESSAGE)

    stack.decode._maybe_stall_or_fail = hand_back
    async with spares(stack, reply_ids):
        text, _, error = await _stream_text(stack, {"model": MODEL, "prompt": PROMPT, "max_tokens": 100})
    assert error is None and text == REPLY


async def test_migrations_stop_at_the_limit(stack_with, reply_ids):
    async with stack_with(max_migrations=1) as stack:
        stack.decode.generate_error = (2, grpc.StatusCode.UNAVAILABLE)
        async with spares(stack, reply_ids, n=2) as (d1, d2):
            d1.generate_error = (2, grpc.StatusCode.UNAVAILABLE)
            text, _, error = await _stream_text(stack, {"model": MODEL, "prompt": PROMPT, "max_tokens": 100})
        assert error["type"] == "service_unavailable_error" and error["code"] == "worker_failed"
        assert text and REPLY.startswith(text)  # what two workers made, in order, then the error
        assert list(d1.generate_requests[0].output_token_ids) == reply_ids[:2]
        assert d2.generate_requests == []  # the second failure was one too many
        assert [w for w, _ in stack.router.reported] == ["d0", "d1"]


async def test_no_migration_when_switched_off(stack_with, reply_ids):
    async with stack_with(max_migrations=0) as stack:
        stack.decode.generate_error = (2, grpc.StatusCode.UNAVAILABLE)
        async with spares(stack, reply_ids) as (d1,):
            _, chunks, error = await _stream_text(stack, {"model": MODEL, "prompt": PROMPT, "max_tokens": 100})
        assert error["code"] == "worker_failed" and len(chunks) == 2 and d1.generate_requests == []


async def test_the_only_worker_failing_once_takes_the_request_back_and_finishes_it(stack):
    stack.decode.generate_error = (2, grpc.StatusCode.UNAVAILABLE)

    async def fail_once(i: int, context) -> None:  # a dropped connection: the worker itself is fine
        if stack.decode.generate_error is not None and i == stack.decode.generate_error[0]:
            stack.decode.generate_error = None
            await context.abort(grpc.StatusCode.UNAVAILABLE, "connection dropped")

    stack.decode._maybe_stall_or_fail = fail_once
    text, _, error = await _stream_text(stack, {"model": MODEL, "prompt": PROMPT, "max_tokens": 100})
    assert error is None and text == REPLY
    assert [list(r.exclude_worker_ids) for r in stack.router.routes] == [[], ["d0"], []]
    assert len(stack.decode.generate_requests) == 2


async def test_a_worker_that_fails_it_again_after_going_back_ends_it_cleanly(stack):
    stack.decode.generate_error = (2, grpc.StatusCode.UNAVAILABLE)  # every time, after 2 more tokens
    _, chunks, error = await _stream_text(stack, {"model": MODEL, "prompt": PROMPT, "max_tokens": 100})
    assert len(chunks) == 4 and error["code"] == "no_worker_available" and error["type"] == "service_unavailable_error"
    assert [list(r.exclude_worker_ids) for r in stack.router.routes] == [[], ["d0"], [], ["d0"]]  # back once only


async def test_a_migrated_request_keeps_its_cache_salt(stack, reply_ids):
    stack.decode.generate_error = (3, grpc.StatusCode.UNAVAILABLE)
    async with spares(stack, reply_ids) as (d1,):
        text, _, error = await _stream_text(
            stack, {"model": MODEL, "prompt": PROMPT, "max_tokens": 100, "cache_salt": "team-x"}
        )
    assert error is None and d1.generate_requests
    assert [r.params.cache_salt for r in stack.decode.generate_requests + d1.generate_requests] == ["team-x"] * 2
    assert [r.cache_salt for r in stack.router.routes] == ["team-x"] * 2  # routed again under the same salt
