"""A lean HTTP/1.1 streaming client for the overhead benchmark: keep-alive connections as asyncio Protocols that
parse the status line, chunked framing and SSE lines as bytes arrive. httpx spent more CPU per streamed token
than the gateway (its pool checks every connection per request), on the same 2 cores, and its queueing showed
up as the services' TTFT (bench/RESULTS.md). Same requests and records as StreamingClient; no TLS, no proxies,
no redirects: a benchmark of our own loopback stack, nothing else.
"""

import asyncio
from urllib.parse import urlsplit

from tandem.bench.http_client import COMPLETIONS_PATH, SseRecorder, StreamingClient
from tandem.bench.loadgen import RequestSpec
from tandem.bench.serve_stats import RequestRecord


class RawStreamingClient(StreamingClient):
    """StreamingClient's interface (its httpx client still answers model_card); `send` goes over raw sockets."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        url = urlsplit(self.endpoint.base_url)
        self._host, self._port = url.hostname or "127.0.0.1", url.port or 80
        self._idle: list[_Connection] = []
        auth = f"Authorization: Bearer {self.endpoint.api_key}\r\n" if self.endpoint.api_key else ""
        self._head = (
            f"POST {COMPLETIONS_PATH} HTTP/1.1\r\nHost: {url.netloc}\r\n{auth}"
            "Content-Type: application/json\r\nAccept: text/event-stream\r\n"
        )

    async def __aexit__(self, *exc) -> None:
        for conn in self._idle:
            conn.close()
        await super().__aexit__(*exc)

    async def send(self, spec: RequestSpec) -> RequestRecord:
        body = self.body(spec)
        request = (self._head + f"Content-Length: {len(body)}\r\n\r\n").encode() + body
        record = RequestRecord(submit_s=self.clock(), num_prompt_tokens=spec.isl)
        try:
            conn = self._reusable() or await self._connect()
            await conn.request(request, SseRecorder(record), self.clock)
            if conn.is_reusable:
                self._idle.append(conn)
        except (OSError, ValueError, asyncio.IncompleteReadError) as exc:
            record.error = f"{type(exc).__name__}: {exc}"
        record.end_s = self.clock()
        return record

    def _reusable(self) -> "_Connection | None":
        # NOTE: the server may close a keep-alive connection while it sits idle (its keep-alive timeout); a request
        # written into that closed transport would wait forever for an answer
        while self._idle:
            conn = self._idle.pop()
            if conn.is_reusable and conn.transport is not None and not conn.transport.is_closing():
                return conn
            conn.close()
        return None

    async def _connect(self) -> "_Connection":
        _, conn = await asyncio.get_running_loop().create_connection(_Connection, self._host, self._port)
        return conn


class _Connection(asyncio.Protocol):
    """One keep-alive connection; one response at a time, parsed from the bytes as they come."""

    def __init__(self):
        self.transport: asyncio.Transport | None = None
        self.is_reusable = True
        self._buf = b""
        self._done: asyncio.Future | None = None
        self._recorder: SseRecorder | None = None
        self._clock = None
        self._state = "idle"  # head -> chunks (SSE body) | body (an error's JSON) -> idle
        self._status, self._remaining, self._text = 0, 0, b""

    def connection_made(self, transport) -> None:
        self.transport = transport

    def connection_lost(self, exc) -> None:
        self.is_reusable = False
        if self._done is not None and not self._done.done():
            self._done.set_exception(exc or ConnectionResetError("the server closed the connection"))

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    async def request(self, data: bytes, recorder: SseRecorder, clock) -> None:
        self._done = asyncio.get_running_loop().create_future()
        self._recorder, self._clock, self._state, self._buf, self._text = recorder, clock, "head", b"", b""
        self.transport.write(data)
        await self._done

    def data_received(self, data: bytes) -> None:
        self._buf += data
        now = self._clock()
        try:
            while self._state != "idle" and self._step(now):
                pass
        except ValueError as exc:
            self.is_reusable = False
            self._finish(exc)

    def _step(self, now: float) -> bool:
        """Consume what `_buf` holds for the current state; False when more bytes are needed."""
        if self._state == "head":
            return self._head()
        if self._state == "body":
            return self._body()
        return self._chunk(now)

    def _head(self) -> bool:
        end = self._buf.find(b"\r\n\r\n")
        if end < 0:
            return False
        lines = self._buf[:end].decode("latin-1").split("\r\n")
        self._buf = self._buf[end + 4 :]
        self._status = int(lines[0].split(" ", 2)[1])
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        self.is_reusable = headers.get("connection", "").lower() != "close"
        if headers.get("transfer-encoding", "").lower() == "chunked":
            self._state = "chunks"
        else:
            self._state, self._remaining = "body", int(headers.get("content-length", "0"))
        return True

    def _body(self) -> bool:
        if len(self._buf) < self._remaining:
            return False
        text = self._buf[: self._remaining].decode(errors="replace")
        self._buf = self._buf[self._remaining :]
        self._recorder.record.error = f"HTTP {self._status}: {text[:300]}"
        self._finish(None)
        return False

    def _chunk(self, now: float) -> bool:
        end = self._buf.find(b"\r\n")
        if end < 0:
            return False
        size = int(self._buf[:end].split(b";")[0], 16)
        if len(self._buf) < end + 2 + size + 2:
            return False
        data, self._buf = self._buf[end + 2 : end + 2 + size], self._buf[end + 2 + size + 2 :]
        if size == 0:
            self._finish(None)
            return False
        self._text += data
        *lines, self._text = self._text.split(b"\n")
        for line in lines:
            if line:
                self._recorder.line(line.decode(), now)
        return True

    def _finish(self, exc: Exception | None) -> None:
        self._state = "idle"
        if self._status == 200:
            self._recorder.finish()
        if exc is not None:
            self._done.set_exception(exc)
        elif not self._done.done():
            self._done.set_result(None)
