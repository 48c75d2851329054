"""Several gateway processes on one port: this supervisor binds one SO_REUSEPORT socket per process (the kernel
spreads new connections over them), starts the processes, restarts one that dies, and at SIGTERM lets each
drain. It owns what the processes share: the in-flight count (shared memory) and a fresh directory for
prometheus-client's multiprocess files, removed at exit. It serves no request itself.
"""

import logging
import multiprocessing
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from multiprocessing.connection import wait
from pathlib import Path

from services.common.process import PARENT_PID_ENV, ExitWindow, RestartPolicy, die_with_parent
from services.gateway.settings import GatewaySettings

log = logging.getLogger(__name__)
# more deaths than max_restarts in the window: give up, something is wrong (no backoff: the port must keep serving)
RESTART_POLICY = RestartPolicy()
METRICS_DIR_PREFIX = "tandem-gateway-metrics-"  # then the supervisor's pid


@dataclass
class _Child:
    index: int
    process: multiprocessing.Process


def remove_orphaned_metrics_dirs(root: str | None = None) -> list[str]:
    """Metrics directories of supervisors that are gone without cleaning up (killed outright)."""
    removed = []
    for path in Path(root or tempfile.gettempdir()).glob(METRICS_DIR_PREFIX + "*"):
        pid = path.name[len(METRICS_DIR_PREFIX) :].split("-", 1)[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(path, ignore_errors=True)
            removed.append(str(path))
    return removed


def reuse_port_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


class Supervisor:
    """`make_app(settings, inflight=...)` builds each process's app (server.create_app; handed in so this module
    never imports the routes that start it)."""

    def __init__(self, settings: GatewaySettings, make_app: Callable):
        self.settings = settings
        self._make_app = make_app
        self._ctx = multiprocessing.get_context("spawn")  # NOTE: never fork a process that may hold gRPC threads
        self.slots = self._ctx.Array("i", settings.num_workers)  # in flight per process (admission.SharedInflight)
        remove_orphaned_metrics_dirs()
        self.metrics_dir = tempfile.mkdtemp(prefix=f"{METRICS_DIR_PREFIX}{os.getpid()}-")
        self.port = settings.port
        self.children: list[_Child] = []
        self._deaths = ExitWindow()
        self._is_stopping = False
        self._wakeup_r, self._wakeup_w = os.pipe()  # NOTE: a signal wakes _watch at once, not at its next timeout

    def run(self) -> int:
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = self.metrics_dir  # NOTE: read by the children at import
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        try:
            self.children = [self._start(i) for i in range(self.settings.num_workers)]
            log.info("gateway: %d processes on %s:%d", len(self.children), self.settings.host, self.port)
            code = self._watch()
            self._stop()
            return code
        finally:
            shutil.rmtree(self.metrics_dir, ignore_errors=True)
            os.close(self._wakeup_r)
            os.close(self._wakeup_w)

    def _start(self, index: int) -> _Child:
        sock = reuse_port_socket(self.settings.host, self.port)
        self.port = sock.getsockname()[1]  # port 0: the first socket's port, for every other one
        process = self._ctx.Process(
            target=serve_child,
            name=f"gateway-{index}",
            args=(self._child_settings(), index, sock, self.slots, os.getpid(), self._make_app),
        )
        process.start()
        sock.close()  # NOTE: only the child may hold it, or connections hashed to it would wait for nobody
        return _Child(index, process)

    def _child_settings(self) -> GatewaySettings:
        return replace(self.settings, port=self.port)

    def _watch(self) -> int:
        while not self._is_stopping:
            dead = wait([c.process.sentinel for c in self.children] + [self._wakeup_r], timeout=5.0)
            for child in [c for c in self.children if c.process.sentinel in dead]:
                if self._is_stopping:
                    break
                if not self._may_restart():
                    log.error(
                        "gateway process %d exited with %s; too many deaths, stopping",
                        child.index,
                        child.process.exitcode,
                    )
                    return 1
                log.warning("gateway process %d exited with %s; restarting it", child.index, child.process.exitcode)
                self._forget(child)
                self.children[self.children.index(child)] = self._start(child.index)
        return 0

    def _may_restart(self) -> bool:
        num_recent = self._deaths.record(time.monotonic(), RESTART_POLICY.window_s)
        return not RESTART_POLICY.is_crash_loop(num_recent)

    def _forget(self, child: _Child) -> None:
        """A dead process's requests are gone: free its in-flight slot and its live gauges."""
        from prometheus_client import multiprocess

        with self.slots.get_lock():
            self.slots[child.index] = 0
        multiprocess.mark_process_dead(child.process.pid, self.metrics_dir)

    def _on_signal(self, signum, frame) -> None:
        self._is_stopping = True
        os.write(self._wakeup_w, b"\0")

    def _stop(self) -> None:
        """Each process stops accepting and finishes its streams (uvicorn's graceful shutdown, bounded)."""
        live = [c.process for c in self.children if c.process.is_alive()]
        for process in live:
            os.kill(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + self.settings.drain_timeout_s + 5.0
        for process in live:
            process.join(max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                log.error("gateway process %s did not stop in time; killing it", process.pid)
                process.kill()
                process.join()


def serve_child(
    settings: GatewaySettings, index: int, sock: socket.socket, slots, supervisor_pid: int, make_app: Callable
) -> None:
    """One gateway process: its own uvicorn server on the supervisor's socket, counting in-flight requests in
    its slot. Out of the terminal's process group, so a Ctrl-C reaches only the supervisor, which drains it."""
    os.setpgrp()
    _die_with(supervisor_pid)
    import uvicorn

    from services.common.logs import setup_logging
    from services.common.tracing import shutdown_tracing
    from services.gateway.admission import SharedInflight

    setup_logging("gateway", settings.log_level)
    _tag_records(index)
    app = make_app(settings, inflight=SharedInflight(slots, index, settings.max_inflight))
    config = uvicorn.Config(
        app,
        log_level=settings.log_level.lower(),
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=settings.drain_timeout_s,
    )
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        shutdown_tracing()


def _die_with(parent_pid: int) -> None:
    os.environ[PARENT_PID_ENV] = str(parent_pid)
    die_with_parent()


def _tag_records(index: int) -> None:
    """Every log record of this process says which gateway process wrote it."""
    factory = logging.getLogRecordFactory()

    def record(*args, **kwargs):
        rec = factory(*args, **kwargs)
        rec.gateway_process = index
        return rec

    logging.setLogRecordFactory(record)


def run_supervisor(settings: GatewaySettings, make_app: Callable) -> int:
    try:
        return Supervisor(settings, make_app).run()
    except OSError as exc:
        print(f"tandem gateway: error: {exc}", file=sys.stderr)
        return 1
