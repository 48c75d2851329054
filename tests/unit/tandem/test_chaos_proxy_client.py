"""The chaos client and proxy on loopback against a tiny server that streams SSE: the client records a whole
stream, an error body with Retry-After, a client that leaves, a hang; the proxy passes bytes, delays them, and
resets every connection it carries on `drop()`."""

import asyncio
import json
import time

from tandem.chaos.client import Behaviour, Exchange, Record
from tandem.chaos.proxy import FaultyProxy, ProxyProcess

EVENTS = [{"choices": [{"text": t, "finish_reason": None}]} for t in ("a", "b", "c")] + [
    {"choices": [{"text": "", "finish_reason": "length"}], "usage": {"completion_tokens": 3}}
]


async def _serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, mode: str, gap_s: float) -> None:
    await reader.readuntil(b"\r\n\r\n")
    if mode == "busy":
        body = json.dumps({"error": {"message": "every worker is busy", "type": "service_unavailable_error"}})
        writer.write(
            f"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n{body}".encode()
        )
    else:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        for payload in [json.dumps(e) for e in EVENTS] + ["[DONE]"]:
            data = f"data: {payload}\n\n".encode()
            writer.write(b"%x\r\n%s\r\n" % (len(data), data))
            await writer.drain()
            await asyncio.sleep(gap_s if mode != "hang" else 3600)
        writer.write(b"0\r\n\r\n")
    await writer.drain()
    writer.close()


async def _server(mode: str, gap_s: float = 0.0):
    server = await asyncio.start_server(lambda r, w: _serve(r, w, mode, gap_s), "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def _exchange(port: int, behaviour: Behaviour = Behaviour(), deadline_s: float = 5.0) -> Record:
    rec = Record(0, behaviour.kind, time.monotonic())
    return await Exchange("127.0.0.1", port, b"{}", behaviour, rec, keep_events=True).run(deadline_s)


async def test_a_whole_stream_and_an_error_body():
    server, port = await _server("stream")
    rec = await _exchange(port)
    assert (rec.status, rec.text, rec.finish_reason, rec.num_tokens, rec.is_done, rec.has_ended) == (
        200,
        "abc",
        "length",
        3,
        True,
        True,
    )
    server.close()
    server, port = await _server("busy")
    rec = await _exchange(port)
    assert (rec.status, rec.retry_after, rec.error["type"], rec.is_done) == (
        503,
        "1",
        "service_unavailable_error",
        False,
    )
    server.close()


async def test_a_client_that_leaves_and_one_that_waits_past_its_deadline():
    server, port = await _server("stream", gap_s=0.05)
    rec = await _exchange(port, Behaviour("leave", leave_after=2))
    assert rec.has_left and rec.text == "ab" and not rec.is_done
    server.close()
    server, port = await _server("hang")
    rec = await _exchange(port, deadline_s=0.3)
    assert rec.timed_out and rec.text == "a"
    server.close()


async def test_the_proxy_passes_delays_and_drops():
    server, port = await _server("stream")
    proxy = FaultyProxy("127.0.0.1", port)
    proxied = await proxy.start()
    assert (await _exchange(proxied)).text == "abc"
    proxy.delay_s = 0.05
    started = time.monotonic()
    assert (
        await _exchange(proxied)
    ).is_done and time.monotonic() - started >= 0.1  # the request's read and the answer's, each delayed
    proxy.delay_s = 0.0
    server.close()
    server, port = await _server("hang")
    proxy.target = ("127.0.0.1", port)
    pending = asyncio.create_task(_exchange(proxied))
    await asyncio.sleep(0.2)
    assert proxy.drop(refuse_s=1.0) == 1
    rec = await pending
    assert "ConnectionReset" in rec.transport_error or (rec.has_ended is False and not rec.timed_out)
    refused = await _exchange(proxied)
    assert refused.transport_error and refused.status == 0  # refused while the link is down
    await proxy.stop()
    server.close()


async def test_the_proxy_in_its_own_process_is_driven_over_its_pipe():
    server, port = await _server("hang")
    proxy = ProxyProcess("127.0.0.1", port)
    proxied = await asyncio.to_thread(proxy.start)
    pending = asyncio.create_task(_exchange(proxied))
    await asyncio.sleep(0.3)
    proxy.delay_s = 0.01
    assert proxy.delay_s == 0.01 and await asyncio.to_thread(proxy.drop, 0.5) == 1
    rec = await pending
    assert rec.text == "a" and not rec.is_done and not rec.timed_out  # cut, as a dying link cuts it
    await asyncio.to_thread(proxy.stop)
    server.close()
