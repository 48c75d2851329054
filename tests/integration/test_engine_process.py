"""A live decode worker whose engine process is SIGKILLed mid-stream: the stream ends at once with a clear
error (never a hang), the worker says NOT_SERVING, leaves the router and refuses new requests; the gateway
keeps serving on the other worker."""

import os
import signal
import time

import grpc
import httpx
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.common.identity import Identity
from services.common.protos import common_pb2, worker_pb2, worker_pb2_grpc
from tests.integration.conftest import ENDLESS_CONTEXT, running_stack, workers
from tests.integration.helpers import busy_counts, children_of, sse_json, wait_for

MAX_ERROR_DELAY_S = 5.0


def _cmdline(pid: int) -> bytes:
    with open(f"/proc/{pid}/cmdline", "rb") as f:  # the engine process runs multiprocessing's spawn_main
        return f.read()


def _health(stack, address: str) -> int:
    with stack.channel(address) as channel:
        return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5).status


def _generate(stack, address: str) -> worker_pb2.GenerateResponse:
    with stack.channel(address, Identity("gateway", "gateway-test")) as channel:  # only a gateway may Generate
        request = worker_pb2.GenerateRequest(
            req_id="after", token_ids=[1, 2, 3], params=common_pb2.SamplingParams(max_tokens=2)
        )
        return list(worker_pb2_grpc.DecodeWorkerStub(channel).Generate(request, timeout=5))


def test_killing_a_workers_engine_process_fails_its_stream_and_takes_it_out(endless_model, tmp_path):
    with running_stack(endless_model, tmp_path, num_prefill=0, num_decode=2) as stack:
        body = {
            "model": endless_model.name,
            "prompt": "the long story goes",
            "max_tokens": ENDLESS_CONTEXT - 100,
            "temperature": 0,
            "stream": True,
        }
        addresses = {w.worker.worker_id: w.worker.address for w in workers(stack)}
        with (
            httpx.Client(timeout=httpx.Timeout(3 * MAX_ERROR_DELAY_S)) as http,
            http.stream("POST", f"{stack.url}/v1/completions", json=body) as response,
        ):
            assert response.status_code == 200
            events = sse_json(response)
            [next(events) for _ in range(3)]
            counts = wait_for(
                lambda: busy_counts(stack), lambda c: any(v["num_running"] for v in c.values()), 5.0, "a worker serving"
            )
            victim = next(w for w, c in counts.items() if c["num_running"])
            worker = next(c for c in stack.children if c.name == victim)
            (engine_pid,) = [pid for pid in children_of(worker.proc.pid) if b"spawn_main" in _cmdline(pid)]
            os.kill(engine_pid, signal.SIGKILL)
            killed_at = time.monotonic()
            rest = list(events)
            took_s = time.monotonic() - killed_at
        assert took_s < MAX_ERROR_DELAY_S
        last = rest[-1] if rest[-1] != "[DONE]" else rest[-2]
        assert "engine failed" in last["error"]["message"] and "killed by signal 9" in last["error"]["message"]
        assert worker.proc.poll() is None  # the worker lives on, to say it cannot serve
        assert _health(stack, addresses[victim]) == health_pb2.HealthCheckResponse.NOT_SERVING
        wait_for(
            lambda: [w.worker.worker_id for w in workers(stack)],
            lambda ids: victim not in ids,
            5.0,
            "the worker leaves the router",
        )
        try:
            _generate(stack, addresses[victim])
            raise AssertionError("a worker whose engine died took a request")
        except grpc.RpcError as exc:
            assert exc.code() is grpc.StatusCode.UNAVAILABLE
        reply = httpx.post(f"{stack.url}/v1/completions", json={**body, "stream": False, "max_tokens": 4}, timeout=30)
        assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 4
