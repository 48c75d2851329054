"""KV handle attacks against a live disaggregated stack, while legitimate requests run through the gateway: a forged,
foreign-key, replayed or expired handle, one naming an address that is not a registered prefill worker, and
engine params smuggled in GenerateRequest's retired field 7 (kv_params), each sent straight to the decode worker's
Generate. Every attack is refused (or ignored)
before any pull or READ; every legitimate request succeeds with the same greedy answer."""

import hashlib
import hmac
import os
import socket
import threading
import time

import grpc
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from services.common.identity import Identity
from services.common.kv_signing import KvSigner, signed_bytes
from services.common.protos import common_pb2, worker_pb2, worker_pb2_grpc
from tests.integration.conftest import running_stack, workers

PROMPT = list(range(3, 43))  # 40 tokens: three blocks, the last one partial
IMPORTED = len(PROMPT)  # cached tokens of a request whose KV came from the prefill worker (a prefix-cache hit
# covers whole blocks only: 32 at most; the staging and NIXL paths do not set kv_imported)
LEGIT = {
    "prompt": [7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24],
    "max_tokens": 8,
    "temperature": 0,
}


GATEWAY = Identity("gateway", "gateway-0")  # under mutual TLS only a gateway may call Prefill and Generate


@pytest.fixture(scope="module")
def key_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("key") / "kv-signing.key"
    path.write_text(os.urandom(32).hex())
    path.chmod(0o600)
    return path


@pytest.fixture(scope="module")
def stack(tiny_stack_model, tmp_path_factory, key_file):
    env = {"TANDEM_ROUTER_DISAGG_MIN_TOKENS": "1", "TANDEM_KV_SIGNING_KEY_FILE": str(key_file)}
    with running_stack(
        tiny_stack_model, tmp_path_factory.mktemp("attacks"), num_prefill=1, num_decode=1, env=env
    ) as running:
        yield running


def _address(stack, role: str) -> str:
    return next(w.worker.address for w in workers(stack) if w.worker.worker_id == f"{role}-0")


def _prefill(stack, req_id: str) -> worker_pb2.PrefillResponse:
    """A genuine handle: what the gateway gets from the prefill worker."""
    with stack.channel(_address(stack, "prefill"), GATEWAY) as channel:
        request = worker_pb2.PrefillRequest(
            req_id=req_id, token_ids=PROMPT, params=common_pb2.SamplingParams(max_tokens=4)
        )
        reply = worker_pb2_grpc.PrefillWorkerStub(channel).Prefill(request, timeout=30)
    assert reply.HasField("kv") and reply.kv.signature
    return reply


def _generate(
    stack, req_id: str, kv: common_pb2.KvHandle | None, first_token: int = 1
) -> tuple[grpc.StatusCode, list[worker_pb2.GenerateResponse]]:
    request = worker_pb2.GenerateRequest(
        req_id=req_id,
        token_ids=PROMPT,
        output_token_ids=[first_token],
        params=common_pb2.SamplingParams(max_tokens=4),
        kv=kv,
    )
    with stack.channel(_address(stack, "decode"), GATEWAY) as channel:
        try:
            return grpc.StatusCode.OK, list(worker_pb2_grpc.DecodeWorkerStub(channel).Generate(request, timeout=30))
        except grpc.RpcError as exc:
            return exc.code(), []


def _signed(key: bytes, handle: common_pb2.KvHandle, **fields) -> common_pb2.KvHandle:
    forged = common_pb2.KvHandle()
    forged.CopyFrom(handle)
    for name, value in fields.items():
        setattr(forged, name, value)
    forged.signature = hmac.new(key, signed_bytes(forged), hashlib.sha256).digest()
    return forged


@pytest.fixture(scope="module")
def legit_load(stack):
    """Greedy completions through the gateway for as long as the attacks run; their answers, or errors."""
    answers, stop = [], threading.Event()

    def send():
        with httpx.Client(timeout=60) as http:
            while not stop.is_set():
                reply = http.post(stack.url + "/v1/completions", json={"model": "tiny", **LEGIT})
                answers.append(
                    (reply.status_code, reply.json()["choices"][0]["text"] if reply.status_code == 200 else reply.text)
                )

    model = httpx.get(stack.url + "/v1/models", timeout=10).json()["data"][0]["id"]
    LEGIT["model"] = model
    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    yield answers
    stop.set()
    thread.join(60)


def test_a_genuine_handle_is_used_once_and_its_replay_is_refused(stack, legit_load):
    first = _prefill(stack, "genuine")
    code, replies = _generate(stack, "genuine", first.kv, first.first_token_id)
    assert code == grpc.StatusCode.OK and replies[0].num_cached_tokens == IMPORTED and replies[-1].finish_reason
    code, _ = _generate(stack, "genuine-replay", first.kv, first.first_token_id)
    assert code == grpc.StatusCode.PERMISSION_DENIED


def test_forged_and_foreign_key_handles_are_refused(stack, legit_load):
    genuine = _prefill(stack, "victim").kv
    unsigned = common_pb2.KvHandle()
    unsigned.CopyFrom(genuine)
    unsigned.ClearField("signature")
    tampered = common_pb2.KvHandle()
    tampered.CopyFrom(genuine)
    tampered.num_blocks = 1  # a shorter read of the same blocks, under the genuine signature
    for i, handle in enumerate([unsigned, tampered, _signed(os.urandom(32), genuine)]):
        assert _generate(stack, f"forged-{i}", handle)[0] == grpc.StatusCode.PERMISSION_DENIED
    unsealed = common_pb2.KvHandle(
        worker_id="prefill-0",
        address=genuine.address,
        req_id="victim",
        layout=genuine.layout,
        num_tokens=len(PROMPT),
        num_blocks=3,
        lease_expires_unix_s=time.time() + 30,
    )
    KvSigner(None).seal(unsealed, PROMPT)  # everything right but the key
    assert _generate(stack, "forged-3", unsealed)[0] == grpc.StatusCode.PERMISSION_DENIED
    # the genuine handle was never consumed by those attempts: its owner still gets its KV
    code, replies = _generate(stack, "victim", genuine)
    assert code == grpc.StatusCode.OK and replies[0].num_cached_tokens == IMPORTED


def test_an_expired_handle_is_refused(stack, legit_load, key_file):
    genuine = _prefill(stack, "late").kv
    expired = _signed(bytes.fromhex(key_file.read_text()), genuine, lease_expires_unix_s=time.time() - 1)
    assert _generate(stack, "late", expired)[0] == grpc.StatusCode.INVALID_ARGUMENT


def test_a_handle_naming_an_unregistered_address_is_refused_before_any_connection(stack, legit_load, key_file):
    genuine = _prefill(stack, "elsewhere").kv
    with socket.create_server(("127.0.0.1", 0)) as trap:
        trap.settimeout(1.0)
        address = f"127.0.0.1:{trap.getsockname()[1]}"
        # signed with the deployment's own key (a retired or stolen prefill identity), at an address it never had
        moved = _signed(bytes.fromhex(key_file.read_text()), genuine, address=address)
        assert _generate(stack, "elsewhere", moved)[0] == grpc.StatusCode.PERMISSION_DENIED
        with pytest.raises(TimeoutError):
            trap.accept()  # the decode worker never dialled it


def test_engine_params_in_the_retired_kv_params_field_are_ignored(stack, legit_load):
    genuine = _prefill(stack, "params").kv
    request = worker_pb2.GenerateRequest(
        req_id="params-only", token_ids=PROMPT, output_token_ids=[1], params=common_pb2.SamplingParams(max_tokens=4)
    )
    # NOTE: field 7 (length-delimited) as an old client wrote it: an unknown field to the decode worker now
    smuggled = request.SerializeToString() + b"\x3a" + _varint(len(genuine.engine_params)) + genuine.engine_params
    with stack.channel(_address(stack, "decode"), GATEWAY) as channel:
        generate = channel.unary_stream(
            "/tandem.v1.DecodeWorker/Generate",
            request_serializer=bytes,
            response_deserializer=worker_pb2.GenerateResponse.FromString,
        )
        replies = list(generate(smuggled, timeout=30))
    assert replies[0].num_cached_tokens < IMPORTED  # prefilled locally


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    return bytes(out + bytes([n]))


def test_refusals_are_counted_and_the_legitimate_load_lost_nothing(stack, legit_load):
    deadline = time.monotonic() + 60
    while len(legit_load) < 3 and time.monotonic() < deadline:
        time.sleep(0.2)
    answers = list(legit_load)
    assert len(answers) >= 3
    assert all(status == 200 for status, _ in answers), [a for a in answers if a[0] != 200][:3]
    assert len({text for _, text in answers}) == 1  # greedy: every answer the same, none corrupted
    text = httpx.get(stack.metrics_urls["decode-0"], timeout=5).text
    refused = {
        s.labels["reason"]: s.value
        for f in text_string_to_metric_families(text)
        if f.name == "tandem_worker_kv_handles_refused"
        for s in f.samples
        if s.name.endswith("_total")
    }
    assert refused == {"replayed": 1, "unsigned": 2, "bad_signature": 2, "expired": 1, "unregistered_source": 1}
