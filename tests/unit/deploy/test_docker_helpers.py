"""docker/healthcheck.py against real gRPC health and HTTP servers; docker/pyproject_deps.py on pyproject.toml."""

import importlib.util
import socket
import threading
import tomllib
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from tests.unit.deploy.helpers import REPO


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "docker" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


healthcheck = _load("healthcheck")
pyproject_deps = _load("pyproject_deps")


@pytest.fixture
def health_server():
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield servicer, f"127.0.0.1:{port}"
    server.stop(0)


def test_grpc_check_follows_the_serving_status(health_server):
    servicer, address = health_server
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    assert healthcheck.main(["grpc", address]) == 0
    servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
    assert healthcheck.main(["grpc", address]) == 1
    servicer.set("tandem.v1.Worker", health_pb2.HealthCheckResponse.SERVING)
    assert healthcheck.main(["grpc", address, "tandem.v1.Worker"]) == 0


def test_grpc_check_fails_when_nothing_listens(capsys):
    with socket.socket() as sock:  # a port that was free a moment ago and has no listener now
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    assert healthcheck.main(["--timeout", "0.5", "grpc", f"127.0.0.1:{port}"]) == 1
    assert "unhealthy: UNAVAILABLE" in capsys.readouterr().err


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        self.send_response(200 if self.path == "/ready" else 503)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_http_check_wants_a_2xx():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        assert healthcheck.main(["http", f"{base}/ready"]) == 0
        assert healthcheck.main(["http", f"{base}/health"]) == 1
    finally:
        server.shutdown()
        server.server_close()


def test_dependencies_are_pyprojects_with_the_excluded_ones_left_out():
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    assert pyproject_deps.dependencies(REPO / "pyproject.toml") == declared
    without_torch = pyproject_deps.dependencies(REPO / "pyproject.toml", frozenset({"torch"}))
    assert [d for d in declared if not d.startswith("torch")] == without_torch
    assert any(d.startswith("grpcio-health-checking") for d in without_torch)


def test_requirement_names_are_normalized():
    assert pyproject_deps._name("uvicorn[standard]>=0.29") == "uvicorn"
    assert pyproject_deps._name("Grpcio_Tools>=1.60") == "grpcio-tools"
    assert pyproject_deps._name("opentelemetry-instrumentation-grpc>=0.46b0") == "opentelemetry-instrumentation-grpc"
