"""`tandem up --engine sim --planner` under a load step: the planner's local connector adds a decode worker
while the load lasts and removes it (drained) after, and not one request fails."""

import asyncio
import json
import os
import signal
import subprocess
import sys
import time

import httpx

from services.common.grpc_server import make_sync_channel
from services.common.protos import router_pb2, router_pb2_grpc
from tandem.launcher import free_port
from tandem.stack_certs import operator_tls
from tests.integration.helpers import alive, children_of, wait_for, wait_for_banner

# decode steps of 20 ms + 2 ms per running sequence: one worker keeps ~10 streams within 40 ms (80% of the 50 ms
# ITL SLO), so 16 streams need two
SLOW_PROFILE = {
    "name": "slow-test",
    "block_size": 16,
    "num_blocks": 4096,
    "max_num_seqs": 64,
    "max_num_batched_tokens": 2048,
    "prefill_ms_coeffs": [0.0, 0.01, 5.0],
    "decode_ms_coeffs": [0, 0, 20],
    "min_step_ms": 1.0,
    "decode_ms_points": [[1, 64, 22.0], [64, 64, 148.0]],
    "prefill_ms_points": [[16, 5.2], [2048, 25.5]],
}
PLANNER_ENV = {
    "TANDEM_PLANNER_MAX_PREFILL": "0",
    "TANDEM_PLANNER_MIN_DECODE": "1",
    "TANDEM_PLANNER_MAX_DECODE": "2",
    "TANDEM_PLANNER_TICK_S": "0.5",
    "TANDEM_PLANNER_ADJUSTMENT_INTERVAL_S": "2",
    "TANDEM_PLANNER_PREDICTOR": "constant",
    "TANDEM_PLANNER_DOWN_STABILIZATION": "1",
    "TANDEM_PLANNER_DOWN_TICKS": "4",
}


def registered(router_port: int, pki_dir) -> list[str]:
    # NOTE: `tandem up` runs mutual TLS; its operator certificate is in the PKI directory beside its logs
    with make_sync_channel(f"127.0.0.1:{router_port}", operator_tls(pki_dir)) as channel:
        reply = router_pb2_grpc.RouterStub(channel).ListWorkers(router_pb2.ListWorkersRequest(), timeout=5)
    return sorted(w.worker.worker_id for w in reply.workers)


async def load(url: str, model: str, concurrency: int, until, outcomes: list) -> None:
    """`concurrency` clients, each sending 48-token completions back to back until `until()`."""

    async def client(http: httpx.AsyncClient) -> None:
        while not until():
            reply = await http.post(f"{url}/v1/completions", json={"model": model, "prompt": "hello", "max_tokens": 48})
            tokens = reply.json().get("usage", {}).get("completion_tokens") if reply.status_code == 200 else None
            outcomes.append((reply.status_code, tokens))

    async with httpx.AsyncClient(timeout=60) as http:
        await asyncio.gather(*(client(http) for _ in range(concurrency)))


def test_the_planner_adds_a_decode_worker_under_load_and_drains_it_after(tmp_path):
    from tandem.models.init import init_model

    model = init_model(tmp_path / "model", "llama", tiny=True, config_only=True)
    profile = tmp_path / "slow.json"
    profile.write_text(json.dumps(SLOW_PROFILE))
    port = free_port()
    env = {**os.environ, "TANDEM_WORKER_SIM_PROFILE": str(profile), **PLANNER_ENV}
    cmd = [
        sys.executable,
        "-m",
        "tandem.cli",
        "up",
        "--engine",
        "sim",
        "--planner",
        "--model",
        str(model),
        "--port",
        str(port),
        "--prefill",
        "0",
        "--decode",
        "1",
        "--num-threads",
        "1",
        "--log-dir",
        str(tmp_path / "logs"),
    ]
    launcher = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        banner = wait_for_banner(launcher, timeout_s=180)
        router_port = int(banner.split("router 127.0.0.1:")[1].split()[0])
        assert registered(router_port, tmp_path / "pki") == ["decode-0"]
        url, outcomes = f"http://127.0.0.1:{port}", []
        # the step: 16 streams until the planner's second worker has served a while
        grown = {"at": None, "name": ""}

        def enough() -> bool:
            if (
                grown["at"] is None and len(now := registered(router_port, tmp_path / "pki")) == 2
            ):  # NOTE: named by the launcher
                grown["at"], grown["name"] = time.monotonic(), next(w for w in now if w != "decode-0")
            return grown["at"] is not None and time.monotonic() - grown["at"] > 5 or len(outcomes) > 3000

        asyncio.run(load(url, model.name, 16, enough, outcomes))
        assert grown["at"] is not None, f"no second worker under load; planner log:\n{_log(tmp_path, 'planner')}"
        # after the step: one stream, until the planner has drained and stopped the second worker.
        # NOTE: on a loaded host the drain may begin while the step's last requests finish (they are then the ones
        # in flight); the stream sends at least one request either way, and no request may fail (below)
        quiet = len(outcomes)
        asyncio.run(
            load(
                url,
                model.name,
                1,
                lambda: len(outcomes) > quiet and registered(router_port, tmp_path / "pki") == ["decode-0"],
                outcomes,
            )
        )
        added = grown["name"]
        wait_for(lambda: added not in {c for c in _live_names(launcher.pid)}, bool, 60, f"{added} exited")
        failed = [o for o in outcomes if o != (200, 48)]
        assert not failed, f"{len(failed)} of {len(outcomes)} requests failed: {failed[:5]}"
        log = _log(tmp_path, "planner")
        assert "scaling decode from 1 to 2" in log and "scaling decode from 2 to 1" in log, log[-3000:]
        launcher.send_signal(signal.SIGTERM)
        assert launcher.wait(timeout=60) == 0
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    out = launcher.stdout.read()
    assert f"planner: started {added}" in out and f"planner: draining {added}" in out, out[-2000:]


def _live_names(pid: int) -> set[str]:
    names = set()
    for child in children_of(pid):
        if not alive(child):
            continue
        cmdline = open(f"/proc/{child}/cmdline").read().split("\0")
        if "--worker-id" in cmdline:
            names.add(cmdline[cmdline.index("--worker-id") + 1])
    return names


def _log(tmp_path, name: str) -> str:
    path = tmp_path / "logs" / f"{name}.log"
    return path.read_text() if path.exists() else "(no log)"
