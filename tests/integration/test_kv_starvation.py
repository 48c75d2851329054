"""Disaggregation at real KV sizes on CPU: `tandem up --engine sim --prefill 1 --decode 1` whose sim engines hold
Llama-3.1-8B-sized paged KV (128 KiB per token), 16 concurrent requests of 2000 prompt / 128 generated tokens.
Every request succeeds with its KV moved (the decode worker computes no prompt token), and the control plane
never starves: no lease lapses in the router, and no worker's heartbeat is late by more than a second."""

import asyncio
import os
import signal
import subprocess
import sys
import threading

import httpx
import pytest

from engines.transfer.nixl_link import is_available
from engines.transfer.staging import SHM_DIR, owner_pid
from services.common.grpc_server import make_sync_channel
from services.common.protos import router_pb2, router_pb2_grpc
from tandem.launcher import free_port
from tandem.stack_certs import operator_tls
from tests.integration.helpers import alive, children_of, log_warnings, wait_for_banner

NUM_REQUESTS, PROMPT_TOKENS, OUTPUT_TOKENS = 16, 2000, 128
LEASE_S, HEARTBEAT_S = 10.0, 1.0
POOL_MB = 1024  # per worker, and its staging buffer: 3-4 requests' KV at a time (each 32 blocks of 8 MiB) (memory stays a few GB with staging)


@pytest.mark.parametrize(
    "transport",
    [pytest.param("nixl", marks=pytest.mark.skipif(not is_available(), reason="NIXL is not installed")), "grpc"],
)
def test_pd_with_8b_sized_kv_under_load_loses_nothing_and_keeps_leases(tmp_path, transport):
    from tandem.models.init import init_model

    model = init_model(tmp_path / "model", "llama", tiny=True, config_only=True)
    port, logs = free_port(), tmp_path / "logs"
    env = {
        **os.environ,
        "TANDEM_WORKER_SIM_KV_CACHE_MB": str(POOL_MB),
        "TANDEM_KV_TRANSPORT": transport,
        "TANDEM_WORKER_KV_STAGING_MB": str(POOL_MB),
        "TANDEM_ROUTER_LEASE_TTL_S": str(LEASE_S),
        "TANDEM_ROUTER_HEARTBEAT_INTERVAL_S": str(HEARTBEAT_S),
        "TANDEM_ROUTER_DISAGG_MIN_TOKENS": "256",
        "TANDEM_ROUTER_PREFILL_MAX_WAITING": str(NUM_REQUESTS),
    }
    cmd = [
        sys.executable,
        "-m",
        "tandem.cli",
        "up",
        "--engine",
        "sim",
        "--model",
        str(model),
        "--port",
        str(port),
        "--prefill",
        "1",
        "--decode",
        "1",
        "--num-threads",
        "1",
        "--log-dir",
        str(logs),
    ]
    launcher = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        banner = wait_for_banner(launcher, timeout_s=180)
        router = f"127.0.0.1:{banner.split('router 127.0.0.1:')[1].split()[0]}"
        watch = LeaseWatch(router, operator_tls(tmp_path / "pki"))
        watch.start()
        results = asyncio.run(load(port, model.name))
        watch.stop()
        errors = [r for r in results if r[0] != 200]
        assert not errors, f"{errors[:3]}\n{log_warnings(logs)}"
        assert all(r[1]["completion_tokens"] == OUTPUT_TOKENS for r in results)
        assert watch.num_workers_seen == {2}, f"workers listed: {watch.num_workers_seen}"
        late = HEARTBEAT_S + 1.0
        assert watch.min_lease_left_s >= LEASE_S - late - watch.poll_s, (
            f"a heartbeat came {LEASE_S - watch.min_lease_left_s:.2f}s after the one before (allowed {late}s)"
        )
        router_log = (logs / "router.log").read_text()
        assert "lease expired" not in router_log and "lapsed" not in router_log
        decode = worker_stats(router, "decode", operator_tls(tmp_path / "pki"))
        assert decode.num_prompt_tokens_computed == 0, (
            f"the decode worker prefilled instead of loading the KV\n{log_warnings(logs)}"
        )
        assert decode.kv_bytes_imported == NUM_REQUESTS * 32 * 64 * 131072  # whole blocks of 64 tokens
        pids = children_of(launcher.pid)
        launcher.send_signal(signal.SIGTERM)
        assert launcher.wait(timeout=60) == 0
        assert not [p for p in pids if alive(p)]
        assert not [f for f in staging_files() if owner_pid(f) in pids], "staging files left behind"
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()


async def load(port: int, model: str) -> list[tuple[int, dict | str]]:
    async def one(client: httpx.AsyncClient, i: int):
        prompt = [(i * 7919 + j * 31) % 500 + 10 for j in range(PROMPT_TOKENS)]  # distinct: no prefix hits
        reply = await client.post(
            f"http://127.0.0.1:{port}/v1/completions",
            timeout=300,
            json={"model": model, "prompt": prompt, "max_tokens": OUTPUT_TOKENS, "ignore_eos": True},
        )
        return reply.status_code, reply.json()["usage"] if reply.status_code == 200 else reply.text

    async with httpx.AsyncClient() as client:
        return await asyncio.gather(*(one(client, i) for i in range(NUM_REQUESTS)))


class LeaseWatch:
    """Polls the router's worker list on a thread: the least lease time any worker had left."""

    poll_s = 0.1

    def __init__(self, router: str, tls):
        self.channel = make_sync_channel(router, tls)  # NOTE: as `tandem up`'s operator (it runs mutual TLS)
        self.stub = router_pb2_grpc.RouterStub(self.channel)
        self.min_lease_left_s = LEASE_S
        self.num_workers_seen: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.channel.close()

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            workers = self.stub.ListWorkers(router_pb2.ListWorkersRequest(), timeout=5).workers
            self.num_workers_seen.add(len(workers))
            for w in workers:
                self.min_lease_left_s = min(self.min_lease_left_s, w.lease_expires_in_s)


def worker_stats(router: str, role: str, tls):
    from services.common.protos import worker_pb2, worker_pb2_grpc

    with make_sync_channel(router, tls) as channel:
        workers = router_pb2_grpc.RouterStub(channel).ListWorkers(router_pb2.ListWorkersRequest(), timeout=5).workers
    (address,) = [w.worker.address for w in workers if w.worker.worker_id.startswith(role)]
    with make_sync_channel(address, tls) as channel:
        return worker_pb2_grpc.WorkerControlStub(channel).GetStats(worker_pb2.GetStatsRequest(), timeout=5)


def staging_files() -> set[str]:
    return {f for f in os.listdir(SHM_DIR) if f.startswith("tandem-kv-")}
