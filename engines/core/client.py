"""EngineClient: the Engine protocol over an engine loop in a child process (workers) or on a thread (tests,
in-process benchmarks). It validates requests, owns one asyncio queue of deltas per request, mirrors the stats
and KV events each step message carries, and fails every live stream at once if the engine dies."""

import asyncio
import itertools
import logging
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future

from engines.base.engine import EngineCapabilities
from engines.base.errors import EngineDiedError, EngineError, InvalidRequestError
from engines.base.events import KvEvent, KvEventLog, KvSnapshot
from engines.base.requests import queue_stream
from engines.base.types import EngineRequest, EngineStats, FinishReason, KvExport, KvLayout, RequestOutput
from engines.core.channel import ProcessChannel, ThreadChannel
from engines.core.engine_core import validate
from engines.core.loop import EngineSpec
from engines.core.messages import Abort, Add, Call, Failed, Reply, StepOutputs, Stop

log = logging.getLogger(__name__)
STOP_TIMEOUT_S = 10.0


class EngineClient:
    def __init__(
        self,
        spec: EngineSpec,
        *,
        process: bool = False,
        overlap: bool = False,
        log_setup: Callable[[], None] | None = None,
    ):
        """Builds the engine where it runs; raises the engine's typed errors (bad directory, ...). `log_setup`:
        how an engine process logs (picklable; its records join the worker's log in the worker's format)."""
        self.channel = ProcessChannel(spec, overlap, log_setup) if process else ThreadChannel(spec, overlap)
        first = self.channel.first()
        if isinstance(first, Failed):
            self.channel.join(STOP_TIMEOUT_S)
            self.channel.close()
            raise first.error
        self.info = first.info
        self.capabilities = EngineCapabilities(
            kv_events=True, reset_prefix_cache=True, kv_export=True, kv_transport=self.info.kv_transport
        )
        self._stats = first.stats
        self._streams: dict[str, asyncio.Queue[RequestOutput]] = {}
        self._calls: dict[int, Future] = {}
        self._call_ids = itertools.count()
        self._kv_log = KvEventLog()  # NOTE: a mirror of the engine's log, so readers never wait on the engine
        self._kv_changed = asyncio.Event()  # replaced after each set: waiters hold the one they saw
        self._loop: asyncio.AbstractEventLoop | None = None
        self.failure: str | None = None
        self._failed = asyncio.Event()
        self._is_stopping = False

    # -- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self.channel.attach(self._loop, self._on_message)

    async def shutdown(self) -> None:
        if self._is_stopping:
            return
        self._is_stopping = True
        if self.failure is None:
            try:
                self.channel.post(Stop())
            except EngineDiedError:
                pass
        await asyncio.to_thread(self.channel.join, STOP_TIMEOUT_S)
        if self._loop is not None and self.failure is None:
            self._on_message()  # the loop's last message: every live request, aborted
        self.channel.close()
        self._end_streams(FinishReason.ABORT, None)

    async def wait_failed(self) -> str:
        await self._failed.wait()
        return self.failure or "engine failed"

    # -- the Engine protocol -----------------------------------------------------------------
    @property
    def kv_layout(self) -> KvLayout:
        return self.info.kv_layout

    @property
    def max_model_len(self) -> int:
        return self.info.max_model_len

    def add_request(self, request: EngineRequest) -> AsyncIterator[RequestOutput]:
        if self.failure is not None:
            raise EngineDiedError(f"the engine cannot serve: {self.failure}")
        if self._loop is None or self._is_stopping:
            raise EngineError("engine is not started")
        if request.req_id in self._streams:
            raise InvalidRequestError(f"request id {request.req_id!r} is already in use")
        validate(request, self.info)
        stream: asyncio.Queue[RequestOutput] = asyncio.Queue()
        self._streams[request.req_id] = stream
        self._post(Add(request))
        return queue_stream(request.req_id, stream, lambda: self._streams.pop(request.req_id, None), self.abort)

    async def abort(self, req_id: str) -> None:
        if self.failure is None and not self._is_stopping:
            self._post(Abort(req_id))

    def stats(self) -> EngineStats:
        return self._stats

    async def export_kv(self, req_id: str, into: str = "", offset: int = 0) -> KvExport | bytes:
        """A held request's KV as bytes, or written into a staging file by the engine process (its handle)."""
        return await self._call("export_kv", (req_id, into, offset) if into else req_id)

    async def release_kv(self, req_id: str) -> None:
        await self._call("release_kv", req_id)

    async def reset_prefix_cache(self) -> int:
        """Drop every cached prefix; the CLEARED event follows. Raises EngineBusyError while requests hold blocks."""
        return await self._call("reset_prefix_cache")

    # -- KV events ---------------------------------------------------------------------------
    async def kv_events_since(self, after_seq: int) -> list[KvEvent] | None:
        return self._kv_log.since(after_seq)

    async def kv_snapshot(self) -> KvSnapshot:
        return self._kv_log.snapshot()

    async def wait_kv_events(self, after_seq: int) -> None:
        changed = self._kv_changed
        if self._kv_log.last_seq <= after_seq:
            await changed.wait()

    # -- internals ---------------------------------------------------------------------------
    def _post(self, message) -> None:
        try:
            self.channel.post(message)
        except EngineDiedError as exc:
            self._die(str(exc))
            raise

    async def _call(self, name: str, arg: str | tuple | None = None):
        if self.failure is not None:
            raise EngineDiedError(f"the engine cannot serve: {self.failure}")
        call_id = next(self._call_ids)
        future: Future = Future()
        self._calls[call_id] = future
        self._post(Call(call_id, name, arg))
        return await asyncio.wrap_future(future)

    def _on_message(self) -> None:
        try:
            received = self.channel.receive_all()
        except EngineDiedError as exc:
            if not self._is_stopping:  # NOTE: after Stop, the pipe closing is the engine's goodbye
                self._die(str(exc))
            return
        for message in received:
            if isinstance(message, StepOutputs):
                self._on_step(message)
            elif isinstance(message, Reply):
                self._on_reply(message)

    def _on_step(self, message: StepOutputs) -> None:
        self._stats = message.stats
        for out in message.outputs:
            stream = self._streams.get(out.req_id)
            if stream is not None:
                stream.put_nowait(out)
        if message.events:
            for event in message.events:
                self._kv_log.replay(event)
            self._kv_changed.set()
            self._kv_changed = asyncio.Event()

    def _on_reply(self, reply: Reply) -> None:
        future = self._calls.pop(reply.call_id, None)
        if future is None:
            return
        if reply.error is not None:
            future.set_exception(reply.error)
        else:
            future.set_result(reply.value)

    def _die(self, reason: str) -> None:
        """The engine is gone: every live stream ends with ERROR, every call fails, health goes down."""
        if self.failure is not None:
            return
        self.failure = reason
        log.error("engine failed: %s; failing %d live requests", reason, len(self._streams))
        self._end_streams(FinishReason.ERROR, f"engine failed: {reason}")
        for future in self._calls.values():
            future.set_exception(EngineDiedError(reason))
        self._calls.clear()
        self._failed.set()

    def _end_streams(self, reason: FinishReason, error: str | None) -> None:
        for req_id, stream in list(self._streams.items()):
            stream.put_nowait(RequestOutput(req_id, (), finish_reason=reason, error=error))
        self._streams.clear()
