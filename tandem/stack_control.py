"""`tandem up --planner`: a Stack whose workers the planner adds and drains at run time, and the launcher's control
endpoint through which the planner's local connector reads and changes them. HTTP/JSON on loopback, a daemon thread:
    GET  /workers                               -> {"prefill": {"ready", "starting", "draining"}, "decode": {...}}
    POST /scale {"role": "decode", "replicas": N} -> the same, after starting or draining workers"""

import json
import os
import signal
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tandem.launcher import Stack, free_ports

ROLES = ("prefill", "decode")
MAX_WORKERS_PER_ROLE = 64


class ControlServer:
    def __init__(self, stack, host: str = "127.0.0.1", port: int = 0):
        self.stack = stack
        self._lock = threading.Lock()  # one change at a time
        self.httpd = ThreadingHTTPServer((host, port), _handler(self))
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="tandem-control", daemon=True)

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> None:
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def counts(self) -> dict[str, dict[str, int]]:
        with self._lock:
            return self.stack.worker_counts()

    def scale(self, role: str, replicas: int) -> dict[str, dict[str, int]]:
        if role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
        if not 0 <= replicas <= MAX_WORKERS_PER_ROLE:
            raise ValueError(f"replicas must be in [0, {MAX_WORKERS_PER_ROLE}], got {replicas}")
        with self._lock:
            live = self.stack.live_workers(role)
            for _ in range(replicas - len(live)):
                self.stack.add_worker(role)
            for name in live[replicas:][::-1]:  # the newest first
                self.stack.remove_worker(name)
            return self.stack.worker_counts()


def _handler(control: ControlServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path != "/workers":
                return self._reply(404, {"error": f"no such path {self.path}"})
            self._reply(200, control.counts())

        def do_POST(self):
            if self.path != "/scale":
                return self._reply(404, {"error": f"no such path {self.path}"})
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                self._reply(200, control.scale(str(body.get("role")), int(body.get("replicas"))))
            except (ValueError, TypeError) as exc:
                self._reply(400, {"error": str(exc)})

        def _reply(self, status: int, doc: dict) -> None:
            data = json.dumps(doc).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args) -> None:  # NOTE: the planner polls every tick; no line per request
            pass

    return Handler


class ScalableStack(Stack):
    """A Stack whose workers the planner adds and removes at run time (`tandem up --planner`)."""

    def start(self) -> None:
        super().start()
        if self.cfg.planner:
            self._start_planner(f"127.0.0.1:{self.router_port}")
            self.write_targets()

    def _start_planner(self, router: str) -> None:
        from tandem.stack_control import ControlServer

        self.control = ControlServer(self)
        self.control.start()
        grpc_port, metrics_port = free_ports(2, exclude=self._ports_in_use())
        self.metrics_ports["planner"] = metrics_port
        from services.common.worker_settings import SOURCE as WORKER
        from services.planner.settings import SOURCE as PLANNER

        profile = WORKER.read("sim_profile")  # NOTE: size with what sim workers run
        has_own_profile = PLANNER.setting("profile").env in os.environ
        self._spawn(
            "planner",
            [
                "planner",
                "--port",
                str(grpc_port),
                "--metrics-port",
                str(metrics_port),
                "--router-address",
                router,
                "--connector",
                "local",
                "--local-control-url",
                self.control.url,
                *(["--profile", profile] if profile and not has_own_profile else []),
                *self.cfg.planner_args,
            ],
        )

    def live_workers(self, role: str) -> list[str]:
        """Running workers of `role` not asked to leave, oldest first."""
        return [c.name for c in self.children if c.name.startswith(f"{role}-") and c.proc.poll() is None]

    def add_worker(self, role: str) -> str:
        taken = {c.name for c in [*self.children, *self.retired]}
        name = next(f"{role}-{i}" for i in range(len(taken) + 1) if f"{role}-{i}" not in taken)
        grpc_port, metrics_port = free_ports(2, exclude=self._ports_in_use())
        self.worker_ports[name], self.metrics_ports[name] = grpc_port, metrics_port
        threads = str(self.cfg.num_threads or 1)
        self._spawn(
            name,
            [
                role,
                "--model",
                self.cfg.model,
                "--router-address",
                f"127.0.0.1:{self.router_port}",
                "--engine",
                self.cfg.engine,
                "--dtype",
                self.cfg.dtype,
                "--num-threads",
                threads,
                *self.cfg.worker_args,
                *self._worker_args(name),
            ],
        )
        self.write_targets()
        print(f"planner: started {name}", flush=True)
        return name

    def remove_worker(self, name: str) -> None:
        """SIGTERM: the worker deregisters, finishes what it holds, and exits; it is counted as draining until then."""
        child = next(c for c in self.children if c.name == name)
        self.children.remove(child)
        self.retired.append(child)
        child.proc.send_signal(signal.SIGTERM)
        self.metrics_ports.pop(name, None)
        self.write_targets()
        print(f"planner: draining {name}", flush=True)

    def worker_counts(self) -> dict[str, dict[str, int]]:
        registered = self._registered_ids()
        self.retired = [c for c in self.retired if c.proc.poll() is None]
        counts = {}
        for role in ("prefill", "decode"):
            live = self.live_workers(role)
            ready = sum(1 for name in live if name in registered)
            counts[role] = {
                "ready": ready,
                "starting": len(live) - ready,
                "draining": sum(1 for c in self.retired if c.name.startswith(f"{role}-")),
            }
        return counts

    def _ports_in_use(self) -> set[int]:
        return {self.cfg.port, self.router_port, *self.worker_ports.values(), *self.metrics_ports.values()}

    def _registered_ids(self) -> set[str]:
        import grpc

        from services.common.grpc_server import make_sync_channel
        from services.common.protos import router_pb2, router_pb2_grpc

        try:
            with make_sync_channel(f"127.0.0.1:{self.router_port}") as channel:
                reply = router_pb2_grpc.RouterStub(channel).ListWorkers(router_pb2.ListWorkersRequest(), timeout=2)
        except grpc.RpcError:
            return set()
        return {w.worker.worker_id for w in reply.workers}
