"""The lean benchmark client against a real asyncio HTTP server on loopback: chunked SSE split anywhere,
keep-alive reuse, error statuses, a server that closes mid-stream."""

import asyncio
import json

import numpy as np

from tandem.bench.http_client import Endpoint
from tandem.bench.loadgen import PromptMaker, RequestSpec
from tandem.bench.raw_client import RawStreamingClient


def sse_body(*payloads) -> bytes:
    events = b"".join(b"data: " + (p if isinstance(p, bytes) else json.dumps(p).encode()) + b"\n\n" for p in payloads)
    return (
        b"".join(b"%x\r\n%s\r\n" % (len(piece), piece) for piece in (events[:7], events[7:40], events[40:]))
        + b"0\r\n\r\n"
    )


def chunk(text, finish=None) -> dict:
    return {"choices": [{"index": 0, "text": text, "finish_reason": finish}]}


class Server:
    """Answers each request with the next scripted response, written in small pieces; records requests."""

    def __init__(self, responses: list[bytes], max_per_connection: int = 0):
        self.responses, self.requests, self.connections = responses, [], 0
        self.max_per_connection = max_per_connection  # then it closes the idle connection (a keep-alive timeout)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        num_answered = 0
        while self.responses and not 0 < self.max_per_connection <= num_answered:
            num_answered += 1
            head = await reader.readuntil(b"\r\n\r\n")
            length = int([h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")][0].split(b":")[1])
            self.requests.append((head, json.loads(await reader.readexactly(length))))
            reply = self.responses.pop(0)
            for i in range(0, len(reply), 11):  # NOTE: split anywhere, across framing and lines
                writer.write(reply[i : i + 11])
                await writer.drain()
                await asyncio.sleep(0)
            if b"close-now" in reply:
                break
        writer.close()


def ok(body: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n" + body


async def serve(responses: list[bytes], max_per_connection: int = 0):
    server = Server(responses, max_per_connection)
    listener = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    return server, listener, f"http://127.0.0.1:{listener.sockets[0].getsockname()[1]}"


async def test_streams_become_records_over_one_kept_alive_connection():
    usage = {"choices": [], "usage": {"completion_tokens": 3}}
    server, listener, url = await serve(
        [
            ok(sse_body(chunk("a"), chunk(""), chunk("b", "length"), usage, b"[DONE]")),
            ok(sse_body(chunk("x"), chunk("y", "stop"), b"[DONE]")),
        ]
    )
    async with RawStreamingClient(Endpoint(url, model="m", api_key="k"), PromptMaker(np.arange(5, 9))) as client:
        first = await client.send(RequestSpec(0, None, isl=6, osl=3))
        second = await client.send(RequestSpec(1, None, isl=2, osl=2))
    listener.close()
    assert (first.error, first.num_output_tokens, len(first.chunk_times_s)) == (None, 3, 2)
    assert (second.error, second.num_output_tokens, len(second.chunk_times_s)) == (None, 2, 2)
    assert server.connections == 1
    head, body = server.requests[0]
    assert head.startswith(b"POST /v1/completions HTTP/1.1\r\n") and b"Authorization: Bearer k" in head
    assert (body["model"], body["max_tokens"], body["stream"], len(body["prompt"])) == ("m", 3, True, 6)


async def test_error_status_and_a_closed_connection_are_errors():
    refused = b'{"error": {"message": "busy"}}'
    server, listener, url = await serve(
        [
            b"HTTP/1.1 429 Too Many Requests\r\ncontent-length: %d\r\n\r\n%s" % (len(refused), refused),
            ok(b"5\r\ndata:\r\n") + b"close-now",
        ]
    )
    async with RawStreamingClient(Endpoint(url, model="m"), PromptMaker(np.arange(5, 9))) as client:
        busy = await client.send(RequestSpec(0, None, isl=2, osl=2))
        cut = await client.send(RequestSpec(1, None, isl=2, osl=2))
    listener.close()
    assert busy.error == 'HTTP 429: {"error": {"message": "busy"}}' and not busy.is_ok
    assert cut.error is not None and not cut.is_ok


async def test_a_connection_the_server_closed_while_idle_is_not_reused():
    server, listener, url = await serve(
        [ok(sse_body(chunk("a", "stop"), b"[DONE]")), ok(sse_body(chunk("b", "stop"), b"[DONE]"))], max_per_connection=1
    )
    async with RawStreamingClient(Endpoint(url, model="m"), PromptMaker(np.arange(5, 9))) as client:
        first = await client.send(RequestSpec(0, None, isl=2, osl=1))
        await asyncio.sleep(0.2)  # the server's close reaches the idle connection
        # NOTE: before the fix the second request went into the closed connection and waited forever
        second = await asyncio.wait_for(client.send(RequestSpec(1, None, isl=2, osl=1)), timeout=10)
    listener.close()
    assert (first.error, second.error, second.num_output_tokens) == (None, None, 1)
    assert server.connections == 2
