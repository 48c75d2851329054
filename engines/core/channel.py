"""Where the engine loop runs and how its messages travel: a child process over a pipe (msgspec; what a worker
uses, so the engine's steps never share a GIL with the gRPC process) or a thread in this process (tests,
in-process benchmarks; messages pass as objects). The client and the loop are the same for both.

Pipes were chosen on measurements (bench/ipc_bench.py, bench/RESULTS.md): round trips and step streams as fast as
ZMQ's or faster, and EOF tells the client at once that the engine process died.
"""

import asyncio
import logging
import multiprocessing as mp
import os
import queue
import signal
import threading
from collections.abc import Callable

from engines.base.errors import EngineDiedError
from engines.core import messages
from engines.core.engine_core import EngineCore
from engines.core.loop import EngineLoop, EngineSpec, build, serve

log = logging.getLogger(__name__)


class ThreadChannel:
    """The loop on a thread of this process; messages are handed over as objects."""

    def __init__(self, spec: EngineSpec, overlap: bool):
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()
        self._notify: Callable[[], object] = lambda: None
        self.core: EngineCore | None = None  # NOTE: the engine thread's; tests may reach in, nothing else does
        # NOTE: the engine is built on the thread that runs it: torch's OpenMP pool stays with the thread that
        # first used it, and stepping from another one measured 55% slower per step
        self._thread = threading.Thread(target=self._run, args=(spec, overlap), name="tandem-engine", daemon=True)
        self._thread.start()

    def _run(self, spec: EngineSpec, overlap: bool) -> None:
        self.core = build(spec, self)
        if self.core is not None:
            EngineLoop(self.core, self, overlap).run()

    # the engine's side
    def recv(self, timeout: float | None) -> list:
        try:
            first = self._commands.get(timeout=timeout) if timeout else self._commands.get_nowait()
        except queue.Empty:
            return []
        return [first, *_drain(self._commands)]

    def send(self, message) -> None:
        self._outbox.put(message)
        self._notify()

    # the client's side
    def first(self):
        return self._outbox.get()

    def attach(self, loop: asyncio.AbstractEventLoop, on_message: Callable[[], None]) -> None:
        self._notify = lambda: loop.call_soon_threadsafe(on_message)
        self._notify()  # whatever was sent before

    def receive_all(self) -> list:
        return _drain(self._outbox)

    def post(self, message) -> None:
        self._commands.put(message)

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout_s)

    def close(self) -> None:
        pass

    @property
    def exit_reason(self) -> str:
        return "the engine thread ended"


class ProcessChannel:
    """The loop in a spawned child process; msgspec-encoded messages over a pipe. The child dies with this process."""

    def __init__(self, spec: EngineSpec, overlap: bool, log_setup: Callable[[], None] | None = None):
        """`log_setup` (picklable) configures the child's logging as its parent's; default plain text."""
        ctx = mp.get_context("spawn")  # NOTE: never fork a process whose gRPC threads are running
        self._conn, child = ctx.Pipe()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.process = ctx.Process(
            target=engine_process,
            args=(child, spec, overlap, os.getpid(), log_setup),
            name="tandem-engine",
            daemon=True,
        )
        self.process.start()
        child.close()

    def first(self):
        try:
            return messages.decode(self._conn.recv_bytes())
        except EOFError:
            self.process.join(5)
            raise EngineDiedError(f"the engine process exited while starting ({self.exit_reason})") from None

    def attach(self, loop: asyncio.AbstractEventLoop, on_message: Callable[[], None]) -> None:
        self._loop = loop
        loop.add_reader(self._conn.fileno(), on_message)

    def receive_all(self) -> list:
        """Every message waiting; raises EngineDiedError once the child is gone (after the last one)."""
        received = []
        try:
            while self._conn.poll():
                received.append(messages.decode(self._conn.recv_bytes()))
        except (EOFError, OSError):
            self._detach()
            if received:
                return received
            raise EngineDiedError(f"the engine process died ({self.exit_reason})") from None
        return received

    def post(self, message) -> None:
        try:
            self._conn.send_bytes(messages.encode(message))
        except OSError:
            raise EngineDiedError(f"the engine process died ({self.exit_reason})") from None

    def join(self, timeout_s: float) -> None:
        self.process.join(timeout_s)
        if self.process.is_alive():
            log.warning("engine process %d did not stop within %.0f s; killing it", self.process.pid, timeout_s)
            self.process.kill()
            self.process.join(5)

    def close(self) -> None:
        self._detach()
        self._conn.close()

    @property
    def exit_reason(self) -> str:
        self.process.join(0.5)
        code = self.process.exitcode
        if code is None:
            return "pipe closed"
        return f"killed by signal {-code}" if code < 0 else f"exit code {code}"

    def _detach(self) -> None:
        if self._loop is not None and not self._conn.closed:
            self._loop.remove_reader(self._conn.fileno())
        self._loop = None


class _PipeEngineSide:
    """The child's end: commands in, messages out, msgspec-encoded."""

    def __init__(self, conn):
        self.conn = conn

    def recv(self, timeout: float | None) -> list:
        received = []
        if self.conn.poll(timeout or 0):
            received.append(messages.decode(self.conn.recv_bytes()))
            while self.conn.poll(0):
                received.append(messages.decode(self.conn.recv_bytes()))
        return received

    def send(self, message) -> None:
        self.conn.send_bytes(messages.encode(message))


def engine_process(
    conn, spec: EngineSpec, overlap: bool, parent_pid: int, log_setup: Callable[[], None] | None = None
) -> None:
    """The engine process: dies with its parent, leaves signals to it, serves until Stop or the pipe closes."""
    _die_with(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # NOTE: the worker decides when its engine stops
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if log_setup is not None:
        log_setup()
    else:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        serve(spec, _PipeEngineSide(conn), overlap)
    except (EOFError, OSError):  # the worker is gone: nothing left to serve
        pass


def _die_with(parent_pid: int) -> None:
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:  # not Linux: the closed pipe still ends the loop
        pass
    if os.getppid() != parent_pid:
        os._exit(1)


def _drain(q: queue.SimpleQueue) -> list:
    items = []
    while True:
        try:
            items.append(q.get_nowait())
        except queue.Empty:
            return items
