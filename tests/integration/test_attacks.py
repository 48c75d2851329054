"""Attacks on the gRPC plane of a live `tandem up` stack (mutual TLS and per-role authorization, the default) while
legitimate chat load runs through the gateway: every attack is refused with the right status, the router's pool
is what it was, and every legitimate request succeeds."""

import threading
import time
from functools import partial

import grpc
import httpx
import pytest

from services.common.identity import Identity
from services.common.protos import (
    common_pb2,
    router_pb2,
    router_pb2_grpc,
    worker_pb2,
    worker_pb2_grpc,
)
from services.common.tls import GrpcTls
from tandem.certs import pki
from tandem.launcher import served_name
from tests.integration.conftest import running_stack, workers

DENIED, REFUSED = grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAVAILABLE


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from tandem.models.init import init_model

    return init_model(tmp_path_factory.mktemp("attack-model") / "tiny", "llama", tiny=True, config_only=True)


@pytest.fixture(scope="module")
def stack(model, tmp_path_factory):
    with running_stack(model, tmp_path_factory.mktemp("attacks"), engine="zero", num_prefill=1, num_decode=2) as s:
        yield s


class ChatLoad:
    """Chat requests through the gateway, two at a time, until stopped: what users see during the attacks."""

    def __init__(self, stack, model):
        self.url, self.model = f"{stack.url}/v1/chat/completions", served_name(str(model))
        self.statuses: list[int] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(2)]

    def __enter__(self):
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=60)

    def _run(self) -> None:
        body = {"model": self.model, "max_tokens": 8, "messages": [{"role": "user", "content": "hello there"}]}
        with httpx.Client(timeout=60) as http:
            while not self._stop.is_set():
                self.statuses.append(http.post(self.url, json=body).status_code)


def _code(call) -> grpc.StatusCode:
    try:
        reply = call()
        if hasattr(reply, "__iter__") and not hasattr(reply, "ListFields"):
            list(reply)  # a stream: its status comes with its first message
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def _addresses(stack) -> dict[str, str]:
    return {w.worker.worker_id: w.worker.address for w in workers(stack)}


def _router(stack, identity: Identity | None = None, channel: grpc.Channel | None = None):
    return router_pb2_grpc.RouterStub(channel or stack.channel(f"127.0.0.1:{stack.router_port}", identity))


def _evil_register(worker_id: str, role=common_pb2.WORKER_ROLE_DECODE) -> router_pb2.RegisterRequest:
    info = router_pb2.WorkerInfo(
        worker_id=worker_id, role=role, address="127.0.0.1:1", model="tiny", max_num_seqs=1, max_model_len=1
    )
    return router_pb2.RegisterRequest(worker=info)


def test_every_attack_is_refused_while_legitimate_chat_goes_on(stack, model, tmp_path):
    before = _addresses(stack)
    assert set(before) == {"prefill-0", "decode-0", "decode-1"}
    router = f"127.0.0.1:{stack.router_port}"
    with ChatLoad(stack, model) as load:
        outcomes = {**_without_a_trusted_certificate(router, stack, tmp_path), **_wrong_roles(stack, before)}
        time.sleep(0.5)  # NOTE: some load after the last attack too
    refused = {name: code for name, code in outcomes.items() if code not in (DENIED, REFUSED)}
    assert not refused, f"attacks that got through: {refused}"
    assert outcomes["no certificate (plaintext)"] == REFUSED and outcomes["gateway calls Register"] == DENIED
    assert _addresses(stack) == before  # the pool is untouched: no evil-0, nobody moved, nobody gone
    assert load.statuses and set(load.statuses) == {200}, load.statuses
    text = httpx.get(stack.metrics_urls["router"], timeout=10).text
    assert 'tandem_grpc_denied_total{method="Register",role="gateway",service="tandem.v1.Router"} 1.0' in text


def _without_a_trusted_certificate(router: str, stack, tmp_path) -> dict[str, grpc.StatusCode]:
    ca = stack.pki.directory / pki.CA_CERT
    rogue_ca = pki.new_authority("rogue")
    rogue = pki.write_identity(tmp_path / "rogue", rogue_ca, Identity("operator", "operator"))
    clients = {
        "no certificate (plaintext)": grpc.insecure_channel(router),
        "no certificate (TLS)": grpc.secure_channel(router, GrpcTls(ca=str(ca)).channel_credentials()),
        "another CA's certificate": grpc.secure_channel(
            router, GrpcTls(cert=str(rogue.cert), key=str(rogue.key), ca=str(ca)).channel_credentials()
        ),
    }
    outcomes = {}
    for name, channel in clients.items():
        with channel:
            stub = router_pb2_grpc.RouterStub(channel)
            outcomes[f"{name}: ListWorkers"] = _code(
                partial(stub.ListWorkers, router_pb2.ListWorkersRequest(), timeout=5)
            )
            outcomes[name] = _code(partial(stub.Register, _evil_register("evil-0"), timeout=5))
    return outcomes


def _wrong_roles(stack, addresses: dict[str, str]) -> dict[str, grpc.StatusCode]:
    gateway, decode0 = Identity("gateway", "gateway-attacker"), Identity("decode", "decode-0")
    stranger = Identity("router", "router-stranger")
    prefill, decode = addresses["prefill-0"], addresses["decode-1"]
    generate = worker_pb2.GenerateRequest(
        req_id="attack", token_ids=[1, 2, 3], params=common_pb2.SamplingParams(max_tokens=2)
    )
    attacks = {
        "gateway calls Register": lambda: _router(stack, gateway).Register(_evil_register("evil-0"), timeout=5),
        "decode-0 registers as decode-1": lambda: _router(stack, decode0).Register(
            _evil_register("decode-1"), timeout=5
        ),
        "decode-0 registers as prefill": lambda: _router(stack, decode0).Register(
            _evil_register("decode-0", common_pb2.WORKER_ROLE_PREFILL), timeout=5
        ),
        "decode-0 deregisters decode-1": lambda: _router(stack, decode0).Deregister(
            router_pb2.DeregisterRequest(worker_id="decode-1"), timeout=5
        ),
        "decode-0 heartbeats as prefill-0": lambda: _router(stack, decode0).Heartbeat(
            router_pb2.HeartbeatRequest(worker_id="prefill-0"), timeout=5
        ),
        "decode-0 reports decode-1 failed": lambda: _router(stack, decode0).ReportFailure(
            router_pb2.ReportFailureRequest(worker_id="decode-1"), timeout=5
        ),
        "decode-0 calls Generate on decode-1": lambda: _worker(stack, decode, decode0, "decode").Generate(
            generate, timeout=5
        ),
        "operator calls Generate": lambda: _worker(stack, decode, Identity("operator", "operator"), "decode").Generate(
            generate, timeout=5
        ),
        "decode-0 calls Prefill": lambda: _worker(stack, prefill, decode0, "prefill").Prefill(
            worker_pb2.PrefillRequest(req_id="attack", token_ids=[1, 2, 3]), timeout=5
        ),
        "gateway pulls KV": lambda: _worker(stack, prefill, gateway, "prefill").PullKv(
            worker_pb2.PullKvRequest(req_id="attack"), timeout=5
        ),
        "stranger lists workers": lambda: _router(stack, stranger).ListWorkers(
            router_pb2.ListWorkersRequest(), timeout=5
        ),
        "stranger resets a prefix cache": lambda: _worker(stack, decode, stranger, "control").ResetPrefixCache(
            worker_pb2.ResetPrefixCacheRequest(), timeout=5
        ),
        "stranger aborts": lambda: _worker(stack, decode, stranger, "control").Abort(
            worker_pb2.AbortRequest(req_id="anything"), timeout=5
        ),
        "gateway resets a prefix cache": lambda: _worker(stack, decode, gateway, "control").ResetPrefixCache(
            worker_pb2.ResetPrefixCacheRequest(), timeout=5
        ),
    }
    return {name: _code(attack) for name, attack in attacks.items()}


def _worker(stack, address: str, identity: Identity, kind: str):
    stub = {
        "decode": worker_pb2_grpc.DecodeWorkerStub,
        "prefill": worker_pb2_grpc.PrefillWorkerStub,
        "control": worker_pb2_grpc.WorkerControlStub,
    }[kind]
    return stub(stack.channel(address, identity))


def test_the_stack_runs_mutual_tls_with_one_identity_per_service(stack):
    directory = stack.pki.directory
    assert {p.name for p in directory.iterdir() if p.is_dir()} >= {
        "router",
        "gateway",
        "prefill-0",
        "decode-0",
        "decode-1",
        "operator",
    }
    assert (directory / pki.KV_SIGNING_KEY).stat().st_mode & 0o077 == 0
    gateway_env = (stack.child("gateway").proc.args, stack.pki.child_env("gateway"))
    assert gateway_env[1]["TANDEM_GRPC_TLS_CERT"].endswith("gateway/tls.crt")
    with stack.channel(f"127.0.0.1:{stack.router_port}") as channel:  # this process: the operator
        assert router_pb2_grpc.RouterStub(channel).ListWorkers(router_pb2.ListWorkersRequest(), timeout=5).workers
