"""A worker pod's termination as deploy/k8s sets it up, with real processes on loopback: the manifests' preStop
command (`tandem worker drain`) returns only once the router has stopped choosing the worker; the request that worker
was serving still finishes whole, every route asked for meanwhile goes to the other worker, and the worker then exits
on its own within its drain time (TANDEM_WORKER_DRAIN_S as the manifests set it)."""

import os
import subprocess
import sys
import threading
import uuid

import httpx

from services.common.identity import Identity
from services.common.protos import router_pb2, router_pb2_grpc
from tandem.launcher import served_name
from tests.integration.conftest import running_stack, workers
from tests.integration.helpers import wait_for
from tests.unit.deploy.kube import container_env, main_container

LONG_TOKENS = 1500  # the sim engine's ~6 ms decode steps: several seconds in flight


def test_the_prestop_hook_stops_routing_to_the_worker_before_it_drains(tmp_path):
    from tandem.models.init import init_model

    # sim workers load no weights; a context long enough for the long request
    model = init_model(
        tmp_path / "model", "llama", tiny=True, config_only=True, overrides={"max_position_embeddings": 4096}
    )
    container = main_container("cpu", "decode")
    drain_s = container_env("cpu", container)["TANDEM_WORKER_DRAIN_S"]
    hook = container["lifecycle"]["preStop"]["exec"]["command"]
    assert hook[:3] == ["tandem", "worker", "drain"]
    with running_stack(
        model, tmp_path, engine="sim", num_prefill=0, num_decode=2, env={"TANDEM_WORKER_DRAIN_S": drain_s}
    ) as stack:
        long = {}
        sender = threading.Thread(
            target=lambda: long.update(
                reply=httpx.post(
                    f"{stack.url}/v1/completions",
                    timeout=120,
                    json={"model": served_name(str(model)), "prompt": "hello", "max_tokens": LONG_TOKENS},
                )
            )
        )
        sender.start()
        busy = wait_for(
            lambda: [w.worker.worker_id for w in workers(stack) if w.num_inflight],
            lambda ids: len(ids) == 1,
            30,
            "the long request in flight",
        )[0]
        child = next(c for c in stack.children if c.name == busy)
        env = {
            **os.environ,
            "TANDEM_WORKER_WORKER_ID": busy,
            "TANDEM_WORKER_ROUTER_ADDRESS": f"127.0.0.1:{stack.router_port}",
        }
        drained = subprocess.run(
            [sys.executable, "-m", "tandem.cli", *hook[1:], "--pid", str(child.proc.pid)],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert drained.returncode == 0, drained.stderr
        assert f"{busy} deregistered" in drained.stdout
        assert busy not in {w.worker.worker_id for w in workers(stack)}
        assert child.proc.poll() is None, "the worker must still be finishing its request"
        other = {c.name for c in stack.children if c.name.startswith("decode-")} - {busy}
        assert {routed(stack, str(model)) for _ in range(20)} == other
        short = httpx.post(
            f"{stack.url}/v1/completions",
            timeout=60,
            json={"model": served_name(str(model)), "prompt": "hi", "max_tokens": 4},
        )
        assert short.status_code == 200, short.text
        sender.join(timeout=120)
        assert long["reply"].status_code == 200, long["reply"].text
        assert long["reply"].json()["usage"]["completion_tokens"] == LONG_TOKENS
        assert long["reply"].json()["choices"][0]["finish_reason"] == "length"
        assert child.proc.wait(timeout=float(drain_s) + 15) == 0


def routed(stack, model: str) -> str:
    """The decode worker the router chooses for a fresh request (then told it completed)."""
    req_id = uuid.uuid4().hex
    # NOTE: Route and Complete are the gateway's calls (mutual TLS, per-role authorization)
    with stack.channel(f"127.0.0.1:{stack.router_port}", Identity("gateway", "gateway-test")) as channel:
        stub = router_pb2_grpc.RouterStub(channel)
        reply = stub.Route(router_pb2.RouteRequest(req_id=req_id, model=model, token_ids=[1, 2, 3]), timeout=5)
        stub.Complete(router_pb2.CompleteRequest(req_id=req_id), timeout=5)
    return reply.decode.worker_id
