"""The chaos load's client: one streaming completion over a raw asyncio connection, read the way a scenario's
client behaves (normal, slow, stalled, or leaving after some events), recorded as the client saw it: status,
Retry-After, text, finish, usage, an error event or body, and how the exchange ended (done, cut, timed out).

No retries and no interpretation: outcomes.py judges the records.
"""

import asyncio
import json
import math
import socket
import time
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Behaviour:
    kind: str = "normal"  # normal | slow | stall | leave
    read_delay_s: float = 0.0  # slow: pause before reading each event
    stall_s: float = 0.0  # stall: after the first event, read nothing for this long (a small receive buffer)
    leave_after: int = 0  # leave: close the connection after this many events


NORMAL = Behaviour()
STALL_RCVBUF = 4096  # bytes: a stalled reader's window fills at once, so the server feels the stall


@dataclass(slots=True)
class Record:
    index: int
    behaviour: str
    start_s: float
    end_s: float = float("nan")
    first_token_s: float = float("nan")
    status: int = 0
    retry_after: str | None = None
    content_type: str = ""
    text: str = ""
    finish_reason: str | None = None
    num_tokens: int | None = None  # usage.completion_tokens
    error: dict | None = None  # the error event's or the error body's "error" object
    is_done: bool = False  # the stream ended with [DONE]
    has_ended: bool = False  # the response ended as HTTP says (last chunk, or the whole body)
    has_left: bool = False  # the client closed it on purpose (leave, or a stall past the deadline)
    transport_error: str = ""
    timed_out: bool = False
    events: list[dict] = field(default_factory=list, repr=False)  # kept only when asked (tests)


class Exchange:
    """One request and its response, read as `behaviour` says."""

    def __init__(
        self,
        host: str,
        port: int,
        body: bytes,
        behaviour: Behaviour,
        record: Record,
        clock=time.monotonic,
        keep_events: bool = False,
        api_key: str = "",
    ):
        self.host, self.port, self.body, self.behaviour, self.record = host, port, body, behaviour, record
        self.clock, self.keep_events = clock, keep_events
        self.auth = f"Authorization: Bearer {api_key}\r\n" if api_key else ""
        self._num_events = 0

    async def run(self, deadline_s: float) -> Record:
        writer = None
        try:
            reader, writer = await asyncio.wait_for(self._connect(), deadline_s)
            await asyncio.wait_for(self._exchange(reader, writer), max(deadline_s - self._elapsed(), 0.001))
        except TimeoutError:
            self.record.timed_out = True
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
            self.record.transport_error = f"{type(exc).__name__}: {exc}"
        finally:
            self.record.end_s = self.clock()
            if writer is not None:
                writer.close()
        return self.record

    def _elapsed(self) -> float:
        return self.clock() - self.record.start_s

    async def _connect(self):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if self.behaviour.kind == "stall":
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, STALL_RCVBUF)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, (self.host, self.port))
        return await asyncio.open_connection(sock=sock, limit=1 << 20)

    async def _exchange(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (
            f"POST /v1/completions HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nContent-Type: application/json"
            f"\r\nAccept: text/event-stream\r\nContent-Length: {len(self.body)}\r\n{self.auth}"
            "Connection: close\r\n\r\n"
        )
        writer.write(head.encode() + self.body)
        await writer.drain()
        headers = await self._head(reader)
        if headers.get("transfer-encoding", "").lower() == "chunked":
            await self._chunks(reader, writer)
        else:
            data = await reader.readexactly(int(headers.get("content-length", "0")))
            self.record.has_ended = True
            self._error_body(data)

    async def _head(self, reader: asyncio.StreamReader) -> dict[str, str]:
        lines = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        self.record.status = int(lines[0].split(" ", 2)[1])
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
        self.record.retry_after = headers.get("retry-after")
        self.record.content_type = headers.get("content-type", "")
        return headers

    async def _chunks(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        pending = b""
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            data = await reader.readexactly(size + 2)
            if size == 0:
                self.record.has_ended = True
                return
            *lines, pending = (pending + data[:-2]).split(b"\n")
            for line in lines:
                if line.startswith(b"data: ") and not await self._event(line[6:], writer):
                    return

    async def _event(self, data: bytes, writer: asyncio.StreamWriter) -> bool:
        """Take one SSE payload; False once the client has left."""
        if data == b"[DONE]":
            self.record.is_done = True
            return True
        event = json.loads(data)
        if self.keep_events:
            self.record.events.append(event)
        if "error" in event:
            self.record.error = event["error"]
            return True
        self._take(event)
        self._num_events += 1
        return await self._pace(writer)

    def _take(self, event: dict) -> None:
        if event.get("usage"):
            self.record.num_tokens = event["usage"]["completion_tokens"]
        for choice in event.get("choices", ()):
            if choice.get("text") and math.isnan(self.record.first_token_s):
                self.record.first_token_s = self.clock()
            self.record.text += choice.get("text", "")
            self.record.finish_reason = choice.get("finish_reason") or self.record.finish_reason

    async def _pace(self, writer: asyncio.StreamWriter) -> bool:
        b = self.behaviour
        if b.kind == "leave" and self._num_events >= b.leave_after:
            self.record.has_left = True
            writer.transport.abort()
            return False
        if b.kind == "slow":
            await asyncio.sleep(b.read_delay_s)
        elif b.kind == "stall" and self._num_events == 1:
            await asyncio.sleep(b.stall_s)
        return True

    def _error_body(self, data: bytes) -> None:
        try:
            body = json.loads(data)
        except ValueError:
            return
        if isinstance(body, dict) and isinstance(body.get("error"), dict):
            self.record.error = body["error"]


def completion_body(model: str, prompt: list[int], max_tokens: int) -> bytes:
    """A streamed completion of exactly `max_tokens` tokens (ignore_eos) with usage at the end."""
    return json.dumps(
        {
            "model": model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    ).encode()
