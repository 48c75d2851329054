"""NativeEngine: the async face of EngineCore. A dedicated thread runs the step loop; callers
talk to it through a command queue and read one asyncio queue of deltas per request."""
import asyncio
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future

from engines.base.events import KvEvent, KvSnapshot
from engines.base.requests import queue_stream
from engines.base.errors import EngineError, InvalidRequestError
from engines.base.types import EngineRequest, EngineStats, FinishReason, KvExport, KvLayout, RequestOutput
from engines.native.config import EngineConfig
from engines.native.core import EngineCore

log = logging.getLogger(__name__)
_IDLE_WAIT_S = 0.05


class NativeEngine:
    def __init__(self, config: EngineConfig):
        self.config = config
        self._commands: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._streams: dict[str, asyncio.Queue[RequestOutput]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._started = threading.Event()
        self._stopping = threading.Event()
        self._kv_lock = threading.Lock()  # NOTE: the engine thread records KV events; readers run on the loop
        self._kv_changed = asyncio.Event()  # replaced after each set: waiters hold the one they saw
        # NOTE: the model is built on the thread that will run it. Torch's OpenMP pool stays with the
        # thread that first used it; stepping from another thread measured 55% slower per step.
        built: Future = Future()
        self._thread = threading.Thread(target=self._main, args=(built,), name="tandem-engine", daemon=True)
        self._thread.start()
        self.core: EngineCore = built.result()  # raises the core's typed errors (bad directory, ...)
        self._stats = self.core.stats()

    # -- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._started.set()

    async def shutdown(self) -> None:
        if not self._thread.is_alive():
            return
        self._stopping.set()
        self._started.set()  # a never-started engine's thread is waiting for this
        await asyncio.to_thread(self._thread.join)
        for req_id, stream in list(self._streams.items()):
            stream.put_nowait(RequestOutput(req_id, (), finish_reason=FinishReason.ABORT))
        self._streams.clear()

    # -- the Engine protocol -----------------------------------------------------------------
    def add_request(self, request: EngineRequest) -> AsyncIterator[RequestOutput]:
        if self._loop is None or self._stopping.is_set():
            raise EngineError("engine is not started")
        if request.req_id in self._streams:
            raise InvalidRequestError(f"request id {request.req_id!r} is already in use")
        self.core.validate(request)  # reads only immutable config: safe off the engine thread
        stream: asyncio.Queue[RequestOutput] = asyncio.Queue()
        self._streams[request.req_id] = stream
        self._commands.put(lambda: self._add(request))
        return self._stream(request.req_id, stream)

    async def abort(self, req_id: str) -> None:
        self._commands.put(lambda: self._publish([out] if (out := self.core.abort(req_id)) else []))

    def stats(self) -> EngineStats:
        return self._stats

    @property
    def kv_layout(self) -> KvLayout:
        return self.core.runner.kv_layout

    async def export_kv(self, req_id: str) -> KvExport:
        return await self._call(lambda: self.core.export_kv(req_id))

    async def release_kv(self, req_id: str) -> None:
        await self._call(lambda: self.core.release_kv(req_id))

    async def reset_prefix_cache(self) -> int:
        """Drop every cached prefix; the CLEARED event follows. Raises EngineBusyError while requests hold blocks."""
        return await self._call(self.core.reset_prefix_cache)

    async def prompt_logits(self, token_ids: list[int]):
        """Next-token logits at every prompt position (evaluation only; see EngineCore)."""
        return await self._call(lambda: self.core.prompt_logits(token_ids))

    # -- KV events (the KvEventSource capability) --------------------------------------------
    async def kv_events_since(self, after_seq: int) -> list[KvEvent] | None:
        with self._kv_lock:
            return self.core.kv_events.since(after_seq)

    async def kv_snapshot(self) -> KvSnapshot:
        with self._kv_lock:
            return self.core.kv_events.snapshot()

    async def wait_kv_events(self, after_seq: int) -> None:
        changed = self._kv_changed
        if self.core.kv_events.last_seq <= after_seq:
            await changed.wait()

    # -- internals ---------------------------------------------------------------------------
    def _stream(self, req_id: str, stream: asyncio.Queue) -> AsyncIterator[RequestOutput]:
        return queue_stream(req_id, stream, lambda: self._streams.pop(req_id, None), self.abort)

    async def _call(self, fn: Callable):
        future: Future = Future()

        def run() -> None:
            try:
                future.set_result(fn())
            except Exception as exc:
                future.set_exception(exc)

        self._commands.put(run)
        return await asyncio.wrap_future(future)

    def _add(self, request: EngineRequest) -> None:
        try:
            self.core.add(request)
        except EngineError as exc:
            self._publish([RequestOutput(request.req_id, (), finish_reason=FinishReason.ERROR, error=str(exc))])

    def _main(self, built: Future) -> None:
        try:
            built.set_result(EngineCore(self.config))
        except BaseException as exc:  # handed to the constructor's caller
            built.set_exception(exc)
            return
        self._started.wait()
        self._run()

    def _run(self) -> None:
        while not self._stopping.is_set():
            self._drain_commands(block=not self.core.has_work)
            try:
                outputs = self.core.step()
            except Exception:  # NOTE: a bug must not silently kill the loop and hang every stream
                log.exception("engine step crashed; failing live requests")
                outputs = [o for req_id in list(self.core.seqs) if (o := self.core.abort(req_id))]
                outputs = [RequestOutput(o.req_id, o.new_token_ids, o.logprobs, FinishReason.ERROR,
                                         error="engine step crashed") for o in outputs]
            self.core.expire_held(time.monotonic())
            self._stats = self.core.stats()
            self._publish(outputs)
            self._publish_kv_events()

    def _drain_commands(self, block: bool) -> None:
        try:
            command = self._commands.get(timeout=_IDLE_WAIT_S) if block else self._commands.get_nowait()
        except queue.Empty:
            return
        while True:
            command()
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return

    def _publish(self, outputs: list[RequestOutput]) -> None:
        if outputs and self._loop is not None:
            self._loop.call_soon_threadsafe(self._deliver, outputs)

    def _publish_kv_events(self) -> None:
        with self._kv_lock:
            events = self.core.drain_kv_events()
        if events and self._loop is not None:
            self._loop.call_soon_threadsafe(self._notify_kv)

    def _notify_kv(self) -> None:
        self._kv_changed.set()
        self._kv_changed = asyncio.Event()

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        for out in outputs:
            stream = self._streams.get(out.req_id)
            if stream is not None:
                stream.put_nowait(out)
