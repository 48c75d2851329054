"""A server-sent events response as a bare ASGI callable: one `data:` event per payload, written straight to the
server, plus one task per response that notices the client leaving. No ping task, no per-event timeout scope and
no shutdown watcher: sse-starlette's cost per event was a measured share of the gateway's CPU, and its shutdown
watcher ends every stream at SIGTERM, where a draining gateway must let them finish (bench/RESULTS.md).

Knows the SSE wire format and ASGI, nothing of OpenAI or of what the payloads mean.
"""

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

from starlette.responses import Response

HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-store"),
    (b"x-accel-buffering", b"no"),
]  # NOTE: a proxy that buffers would hold every event back


def event(data: bytes) -> bytes:
    """One SSE event carrying `data` (a single line: JSON never contains a raw newline)."""
    return b"data: " + data + b"\n\n"


class SseResponse(Response):
    """Writes every payload of `events` as an event; `on_close` runs however it ends, even when the client left
    before it started. A client that disconnects cancels the iteration (closing `events`), and the response
    returns quietly. (A Response subclass only so that routes may return it; Response.__init__ is not used.)"""

    def __init__(self, events: AsyncIterator[bytes], on_close: Callable[[], Awaitable[None]]):
        self._events, self._on_close = events, on_close
        self.status_code, self.background, self.raw_headers = 200, None, list(HEADERS)

    async def __call__(self, scope, receive, send) -> None:
        writer, state = asyncio.current_task(), {"is_writing": True, "is_gone": False}
        watcher = asyncio.ensure_future(_cancel_on_disconnect(receive, writer, state))
        try:
            await self._write(send)
        except asyncio.CancelledError:
            if not state["is_gone"]:
                raise
            writer.uncancel()  # NOTE: our own watcher cancelled us: the client left, which is not an error here
        finally:
            state["is_writing"] = False
            watcher.cancel()
            await self._on_close()
        if self.background is not None:
            await self.background()

    async def _write(self, send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
        async for data in self._events:
            await send({"type": "http.response.body", "body": event(data), "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _cancel_on_disconnect(receive, writer: asyncio.Task, state: dict) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    if state["is_writing"]:  # NOTE: uvicorn also answers "disconnect" once the response is complete
        state["is_gone"] = True
        writer.cancel()
