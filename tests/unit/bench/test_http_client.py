"""The streaming client against a mocked HTTP transport: request body, chunk stamping, usage, errors."""

import itertools
import json

import httpx
import numpy as np
import pytest

from tandem.bench.http_client import Endpoint, ServerError, StreamingClient
from tandem.bench.loadgen import PromptMaker, RequestSpec


def sse(*payloads) -> bytes:
    return b"".join(b"data: " + (p if isinstance(p, bytes) else json.dumps(p).encode()) + b"\n\n" for p in payloads)


def chunk(text, finish=None) -> dict:
    return {"object": "text_completion", "choices": [{"index": 0, "text": text, "finish_reason": finish}]}


def make_client(handler, **endpoint) -> StreamingClient:
    ticks = itertools.count(start=1.0)  # every clock read is one second after the previous
    return StreamingClient(
        Endpoint("http://bench.test", **endpoint),
        PromptMaker(np.arange(5, 9)),
        clock=lambda: float(next(ticks)),
        transport=httpx.MockTransport(handler),
    )


async def test_a_stream_becomes_a_record_with_one_stamp_per_text_chunk():
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        body = sse(
            chunk("a"),
            chunk(""),
            chunk("b"),
            chunk("c", "length"),
            {"choices": [], "usage": {"completion_tokens": 4}},
            b"[DONE]",
        )
        return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})

    async with make_client(handler, model="m", extra_body={"ignore_eos": True}) as client:
        record = await client.send(RequestSpec(0, None, isl=6, osl=4))
    body = seen[0]
    assert (body["model"], body["max_tokens"], body["stream"], body["ignore_eos"]) == ("m", 4, True, True)
    assert len(body["prompt"]) == 6 and all(5 <= t < 9 for t in body["prompt"])
    assert body["stream_options"] == {"include_usage": True} and body["temperature"] == 0.0
    assert record.error is None
    assert record.num_output_tokens == 4  # the server's usage, not the 3 chunks with text
    assert len(record.chunk_times_s) == 3 and record.ttft_s > 0 and record.end_s > record.chunk_times_s[-1]


async def test_without_usage_the_text_chunks_are_counted():
    def handler(request):
        return httpx.Response(200, content=sse(chunk("a"), chunk("b", "length"), b"[DONE]"))

    async with make_client(handler, model="m") as client:
        assert (await client.send(RequestSpec(0, None, 2, 2))).num_output_tokens == 2


async def test_a_last_chunk_without_text_still_marks_a_token():
    def handler(request):  # one token that decodes to nothing visible
        return httpx.Response(
            200,
            content=sse(chunk(""), chunk("", "length"), {"choices": [], "usage": {"completion_tokens": 1}}, b"[DONE]"),
        )

    async with make_client(handler, model="m") as client:
        record = await client.send(RequestSpec(0, None, 2, 1))
    assert record.is_ok and len(record.chunk_times_s) == 1 and record.num_output_tokens == 1


async def test_http_errors_and_mid_stream_errors_are_recorded():
    def refused(request):
        return httpx.Response(400, json={"error": {"message": "prompt too long"}})

    def broken(request):
        return httpx.Response(200, content=sse(chunk("a"), {"error": {"message": "worker lost"}}))

    async with make_client(refused, model="m") as client:
        record = await client.send(RequestSpec(0, None, 2, 2))
        assert record.error.startswith("HTTP 400") and "prompt too long" in record.error and not record.is_ok
    async with make_client(broken, model="m") as client:
        assert (await client.send(RequestSpec(0, None, 2, 2))).error == "worker lost"


async def test_connection_failures_are_recorded_not_raised():
    def down(request):
        raise httpx.ConnectError("refused")

    async with make_client(down, model="m") as client:
        assert (await client.send(RequestSpec(0, None, 2, 2))).error == "ConnectError: refused"


async def test_model_card_picks_the_named_model_or_the_first():
    def models(request):
        return httpx.Response(200, json={"data": [{"id": "a", "max_model_len": 512}, {"id": "b"}]})

    async with make_client(models) as client:
        card = await client.model_card()
        assert (card.id, card.max_model_len, client.model) == ("a", 512, "a")
    async with make_client(models, model="b") as client:
        assert (await client.model_card()).max_model_len is None


async def test_an_unreachable_or_empty_server_is_a_server_error():
    def down(request):
        raise httpx.ConnectError("refused")

    def empty(request):
        return httpx.Response(200, json={"data": []})

    for handler, message in ((down, "cannot list models"), (empty, "lists no model")):
        async with make_client(handler) as client:
            with pytest.raises(ServerError, match=message):
                await client.model_card()
