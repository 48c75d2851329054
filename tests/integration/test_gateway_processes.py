"""Several gateway processes on one port (`tandem serve gateway --workers N`), as real processes against fake
router and worker gRPC services in this test's event loop: the in-flight limit holds across processes, /metrics
merges them, SIGTERM lets streams finish and refuses new ones (bounded), a dead process is replaced."""

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from services.common.protos import router_pb2_grpc
from tandem.launcher import free_port
from tests.integration.helpers import alive, children_of
from tests.unit.services.gateway.fakes import FakeRouter, FakeWorker, add_worker, start_server

MODEL = "tiny-chat"
TOKENS = list(range(300, 320))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    from tandem.models.init import init_model

    return init_model(tmp_path_factory.mktemp("gateway-processes") / MODEL, "llama", tiny=True, config_only=True)


@dataclass
class Gateway:
    proc: subprocess.Popen
    url: str
    worker: FakeWorker
    log_path: Path

    def records(self) -> list[dict]:
        lines = self.log_path.read_text().splitlines()
        return [json.loads(line) for line in lines if line.startswith("{")]

    def request_records(self) -> list[dict]:
        return [r for r in self.records() if "status" in r and "gateway_process" in r]


@asynccontextmanager
async def gateway(model_dir: Path, tmp_path: Path, *args: str):
    router, worker = FakeRouter(), FakeWorker(TOKENS)
    servers = []
    for add, servicer in ((router_pb2_grpc.add_RouterServicer_to_server, router), (add_worker, worker)):
        server, servicer.address = await start_server(add, servicer)
        servers.append(server)
    router.decode_address, router.model = worker.address, str(model_dir)  # the model as the gateway routes it
    port, log_path = free_port(), tmp_path / "gateway.log"
    command = [
        sys.executable,
        "-m",
        "tandem.cli",
        "serve",
        "gateway",
        "--model-dir",
        str(model_dir),
        "--router-address",
        router.address,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *args,
    ]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"}
        )
    gw = Gateway(proc, f"http://127.0.0.1:{port}", worker, log_path)
    try:
        await wait_ready(gw)
        yield gw
    finally:
        if proc.poll() is None:  # NOTE: SIGTERM, so the supervisor removes its metrics directory
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for server in servers:
            await server.stop(0)


async def wait_ready(gw: Gateway, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(timeout=1.0) as http:
        while time.monotonic() < deadline:
            assert gw.proc.poll() is None, gw.log_path.read_text()[-3000:]
            try:
                if (await http.get(f"{gw.url}/ready")).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.1)
    raise AssertionError("gateway not ready:\n" + gw.log_path.read_text()[-3000:])


def gateway_processes(gw: Gateway) -> set[int]:
    """The supervisor's serving children (not multiprocessing's resource tracker)."""
    return {pid for pid in children_of(gw.proc.pid) if "spawn_main" in _cmdline(pid)}


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
    except OSError:
        return ""


async def metrics(gw: Gateway) -> dict[tuple, float]:
    async with httpx.AsyncClient(timeout=5) as http:
        text = (await http.get(f"{gw.url}/metrics")).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def total(samples: dict[tuple, float], name: str, **labels) -> float:
    return sum(v for (n, ls), v in samples.items() if n == name and all((k, v2) in ls for k, v2 in labels.items()))


async def open_stream(url: str, **body) -> tuple[httpx.AsyncClient, httpx.Response]:
    """A streaming completion on its own connection (so the kernel may hand it to either process)."""
    http = httpx.AsyncClient(timeout=20)
    request = http.build_request(
        "POST",
        f"{url}/v1/completions",
        json={"model": MODEL, "prompt": [1, 2, 3], "max_tokens": 16, "stream": True, **body},
    )
    return http, await http.send(request, stream=True)


async def test_the_inflight_limit_and_metrics_hold_across_processes_and_a_dead_one_is_replaced(model_dir, tmp_path):
    async with gateway(model_dir, tmp_path, "--workers", "2", "--max-inflight", "3") as gw:
        gw.worker.hang_after = 1  # every stream sends one token, then waits until it is cancelled
        opened = await asyncio.gather(*(open_stream(gw.url) for _ in range(16)))
        statuses = sorted(response.status_code for _, response in opened)
        assert statuses == [200] * 3 + [429] * 13
        m = await metrics(gw)
        assert total(m, "tandem_gateway_requests_total", status="429") == 13
        assert total(m, "tandem_gateway_requests_in_flight") == 3
        for http, response in opened:
            await response.aclose()
            await http.aclose()
        await wait_for(lambda: len(gw.worker.cancelled) == 3, "the 3 streams to be cancelled at the worker")
        m = await metrics(gw)
        assert total(m, "tandem_gateway_requests_total", status="499") == 3
        assert total(m, "tandem_gateway_requests_in_flight") == 0
        served_by = {r["gateway_process"] for r in gw.request_records()}
        assert served_by == {0, 1}  # NOTE: 16 connections all hashed to one process: p = 2^-15

        # both processes die holding 3 slots: their replacements start from free slots and the counts so far
        held = await asyncio.gather(*(open_stream(gw.url) for _ in range(3)))
        assert [response.status_code for _, response in held] == [200] * 3
        old = gateway_processes(gw)
        assert len(old) == 2
        for pid in old:
            os.kill(pid, signal.SIGKILL)
        await wait_for(lambda: len(gateway_processes(gw) - old) == 2, "two new gateway processes")
        await wait_ready(gw)
        gw.worker.hang_after = None
        async with httpx.AsyncClient(timeout=10) as fresh:
            reply = await fresh.post(
                f"{gw.url}/v1/completions", json={"model": MODEL, "prompt": [1, 2], "max_tokens": 2}
            )
        assert reply.status_code == 200, reply.text  # not a 429: the dead processes' slots were freed
        m = await metrics(gw)
        assert total(m, "tandem_gateway_requests_total", status="429") == 13  # kept from the dead processes
        assert total(m, "tandem_gateway_requests_in_flight") == 0  # their live gauges went with them
        for http, _ in held:
            await http.aclose()


@pytest.mark.parametrize("workers", ["1", "2"])  # 1: uvicorn alone, no supervisor
async def test_sigterm_lets_streams_finish_refuses_new_requests_and_is_bounded(model_dir, tmp_path, workers):
    async with gateway(model_dir, tmp_path, "--workers", workers, "--drain-timeout-s", "3") as gw:
        gw.worker.token_delay_s = 0.1  # 16 tokens: 1.6 s a stream
        gw.worker.hang_after = 18  # a stream asking for 20 tokens stalls after 18: only the bound ends it
        streams = await asyncio.gather(*(open_stream(gw.url) for _ in range(3)), open_stream(gw.url, max_tokens=20))
        readers = [response.aiter_lines() for _, response in streams]
        firsts = [await anext(reader) for reader in readers]
        assert all(line.startswith("data: ") for line in firsts)
        children, started = gateway_processes(gw), time.monotonic()
        gw.proc.send_signal(signal.SIGTERM)
        await wait_for_async(lambda: refuses(gw.url), "no process to accept connections any more", 3.0)
        *finite, stalled = readers
        for reader in finite:
            lines = [line async for line in reader if line.startswith("data: ")]
            assert lines[-1] == "data: [DONE]"
            assert json.loads(lines[-2][6:])["choices"][0]["finish_reason"] == "length"
        with pytest.raises(httpx.RemoteProtocolError):  # cut at the bound: the response never completes
            async for line in stalled:
                assert line != "data: [DONE]"
        # uvicorn alone re-raises the signal once drained; the supervisor exits 0 once its processes have
        assert await asyncio.to_thread(gw.proc.wait, 20) == (-signal.SIGTERM if workers == "1" else 0)
        assert 3 <= time.monotonic() - started < 12
        assert not any(alive(pid) for pid in children)
        await wait_for(lambda: len(gw.worker.cancelled) == 1, "the stalled stream to be cancelled at the worker")
        for http, _ in streams:
            await http.aclose()


async def refuses(url: str) -> bool:
    """No new request is served: the connection is refused, or (accepted just before the sockets closed) it is
    closed without an answer."""
    try:
        async with httpx.AsyncClient(timeout=2) as http:
            await http.get(f"{url}/health")
    except (httpx.ConnectError, httpx.RemoteProtocolError):
        return True
    return False


async def wait_for_async(condition, what: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await condition():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


async def wait_for(condition, what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")
