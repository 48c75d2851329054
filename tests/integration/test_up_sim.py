"""`tandem up --engine sim --decode 16`: a 16-worker simulated cluster on one machine comes up, serves a
request, and on SIGTERM leaves no process behind."""

import signal
import subprocess
import sys

import httpx

from services.common.grpc_server import make_sync_channel
from services.common.protos import router_pb2, router_pb2_grpc
from tandem.launcher import free_port
from tandem.stack_certs import operator_tls
from tests.integration.helpers import alive, children_of, services_of, wait_for_banner

NUM_DECODE = 16


def test_up_sim_cluster_of_16_serves_then_stops_everything(tmp_path):
    from tandem.models.init import init_model

    model = init_model(tmp_path / "model", "llama", tiny=True, config_only=True)  # sim workers load no weights
    port = free_port()
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
        "0",
        "--decode",
        str(NUM_DECODE),
        "--num-threads",
        "1",
        "--log-dir",
        str(tmp_path / "logs"),
    ]
    launcher = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        banner = wait_for_banner(launcher, timeout_s=180)
        assert f"tandem is up: http://127.0.0.1:{port}" in banner
        assert f"0 prefill · {NUM_DECODE} decode · engine sim" in banner
        services, pids = services_of(launcher.pid), children_of(launcher.pid)
        assert len(services) == NUM_DECODE + 2, f"router, {NUM_DECODE} decode workers and gateway expected: {services}"
        router_port = int(banner.split("router 127.0.0.1:")[1].split()[0])
        assert len(registered_workers(router_port, tmp_path / "pki")) == NUM_DECODE
        reply = httpx.post(
            f"http://127.0.0.1:{port}/v1/completions",
            timeout=30,
            json={"model": model.name, "prompt": "hello", "max_tokens": 4},
        )
        assert reply.status_code == 200, reply.text
        assert reply.json()["usage"]["completion_tokens"] == 4
        launcher.send_signal(signal.SIGTERM)
        assert launcher.wait(timeout=60) == 0
        lingering = [p for p in pids if alive(p)]
        assert not lingering, f"processes left behind: {lingering}"
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()


def registered_workers(router_port: int, pki_dir) -> list[str]:
    # NOTE: `tandem up` runs mutual TLS; its operator certificate is in the PKI directory beside its logs
    with make_sync_channel(f"127.0.0.1:{router_port}", operator_tls(pki_dir)) as channel:
        reply = router_pb2_grpc.RouterStub(channel).ListWorkers(router_pb2.ListWorkersRequest(), timeout=5)
    return [w.worker.worker_id for w in reply.workers]
