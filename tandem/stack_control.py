"""`tandem up --planner`: the launcher's control endpoint, through which the planner's local connector reads and
changes the number of worker processes. HTTP/JSON on loopback in a daemon thread:
    GET  /workers                               -> {"prefill": {"ready", "starting", "draining"}, "decode": {...}}
    POST /scale {"role": "decode", "replicas": N} -> the same, after starting or draining workers
The process work itself is the Stack's (add_worker / remove_worker); this module only serves and counts."""
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

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
