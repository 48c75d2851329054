"""The attacker of `tandem chaos --scenario attacks`: a process of its own (its CPU and sockets are not the load's),
told by stdin to run one round of every attack of issue 24 item 8 against a live stack, writing one JSON line per
attempt (name, what a safe stack answers, what it answered). It judges nothing: attacks.py does.

Usage: python -m tandem.chaos.attacker CONFIG_JSON, then "round N" lines on stdin (EOF ends it).
"""

import asyncio
import hashlib
import hmac
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx

from services.common.grpc_server import make_sync_channel
from services.common.kv_signing import signed_bytes
from services.common.protos import common_pb2, router_pb2, router_pb2_grpc, worker_pb2, worker_pb2_grpc
from services.common.tls import GrpcTls

OK, DENIED, REFUSED, INVALID = "OK", "PERMISSION_DENIED", "UNAVAILABLE", "INVALID_ARGUMENT"
KV_PROMPT_LEN = 40  # three blocks of 16, the last one partial
PROBE_LEN = 264  # four full blocks of 64 (the sim's), 16 of 16: a hit shows in cached_tokens
GRPC_TIMEOUT_S = 30.0
FLOOD_TOKENS = 256  # the admitted part of a flood streams this long at most: it is cut once all have answered
FLOOD_PREFIX = "one key floods at 10x its limit"


@dataclass(frozen=True, slots=True)
class Target:
    """What the attacker knows: the scenario hands it over as JSON."""

    url: str
    model: str
    router: str
    prefill: str
    decode: str
    tls: dict[str, dict]  # name -> GrpcTls fields: "gateway" (a stolen gateway cert), "decode-0", "rogue", "ca-only"
    kv_key: str  # the deployment's signing key file (a retired prefill worker's, or a stolen one)
    keys: dict[str, str]  # "owner", "prober", "flood" -> an API key
    max_inflight_per_key: int
    max_prompt_chars: int


def _tls(target: Target, name: str) -> GrpcTls:
    return GrpcTls(**target.tls[name])


def _code(call) -> str:
    try:
        reply = call()
        if hasattr(reply, "__iter__") and not hasattr(reply, "ListFields"):
            list(reply)  # a stream: its status comes with its end
    except grpc.RpcError as exc:
        return exc.code().name
    return OK


def _register(worker_id: str) -> router_pb2.RegisterRequest:
    info = router_pb2.WorkerInfo(
        worker_id=worker_id,
        role=common_pb2.WORKER_ROLE_DECODE,
        address="127.0.0.1:1",
        model="evil",
        max_num_seqs=1,
        max_model_len=1,
    )
    return router_pb2.RegisterRequest(worker=info)


def _router_call(target: Target, channel: grpc.Channel, worker_id: str) -> str:
    with channel:
        return _code(lambda: router_pb2_grpc.RouterStub(channel).Register(_register(worker_id), timeout=GRPC_TIMEOUT_S))


def plane_attacks(target: Target) -> list[tuple[str, str, str]]:
    """Who may talk to the router, and as whom: (name, expected, got)."""
    router = target.router
    ca_only = _tls(target, "ca-only")
    return [
        ("no certificate (plaintext)", REFUSED, _router_call(target, grpc.insecure_channel(router), "evil-0")),
        (
            "no certificate (TLS)",
            REFUSED,
            _router_call(target, grpc.secure_channel(router, ca_only.channel_credentials()), "evil-0"),
        ),
        (
            "certificate from another CA",
            REFUSED,
            _router_call(target, make_sync_channel(router, _tls(target, "rogue")), "evil-0"),
        ),
        (
            "gateway certificate calls Register",
            DENIED,
            _router_call(target, make_sync_channel(router, _tls(target, "gateway")), "evil-0"),
        ),
        (
            "worker registers another's id",
            DENIED,
            _router_call(target, make_sync_channel(router, _tls(target, "decode-0")), "decode-1"),
        ),
    ]


def _prompt(tag: int, length: int) -> list[int]:
    return [2000 + (tag * 7919 + j * 31) % 30000 for j in range(length)]


def _copy(handle: common_pb2.KvHandle, key: bytes | None = None, **fields) -> common_pb2.KvHandle:
    """The handle with `fields` changed, re-signed with `key` when one is given (else the old signature stays)."""
    out = common_pb2.KvHandle()
    out.CopyFrom(handle)
    for name, value in fields.items():
        setattr(out, name, value)
    if key is not None:
        out.signature = hmac.new(key, signed_bytes(out), hashlib.sha256).digest()
    return out


def kv_attacks(target: Target, tag: int) -> list[tuple[str, str, str]]:
    """A genuine handle (the control: it works once), then forged, foreign, replayed, expired and moved copies of
    it, each sent straight to the decode worker's Generate with a stolen gateway certificate."""
    prompt, gateway = _prompt(tag, KV_PROMPT_LEN), _tls(target, "gateway")
    with make_sync_channel(target.prefill, gateway) as channel:
        request = worker_pb2.PrefillRequest(
            req_id=f"genuine-{tag}", token_ids=prompt, params=common_pb2.SamplingParams(max_tokens=4)
        )
        reply = worker_pb2_grpc.PrefillWorkerStub(channel).Prefill(request, timeout=GRPC_TIMEOUT_S)
    genuine, first = reply.kv, reply.first_token_id
    key = bytes.fromhex(Path(target.kv_key).read_text().strip())

    def generate(req_id: str, handle: common_pb2.KvHandle) -> str:
        request = worker_pb2.GenerateRequest(
            req_id=f"{req_id}-{tag}",
            token_ids=prompt,
            output_token_ids=[first],
            params=common_pb2.SamplingParams(max_tokens=4),
            kv=handle,
        )
        with make_sync_channel(target.decode, gateway) as channel:
            return _code(lambda: worker_pb2_grpc.DecodeWorkerStub(channel).Generate(request, timeout=GRPC_TIMEOUT_S))

    attempts = [
        ("forged KV handle (tampered)", DENIED, generate("forged", _copy(genuine, num_blocks=genuine.num_blocks + 1))),
        ("KV handle from another key", DENIED, generate("foreign", _copy(genuine, os.urandom(32)))),
        ("expired KV handle", INVALID, generate("expired", _copy(genuine, key, lease_expires_unix_s=time.time() - 1))),
        (
            "KV handle naming an unregistered address",
            DENIED,
            generate("moved", _copy(genuine, key, address="127.0.0.1:9")),
        ),
        ("genuine KV handle (control)", OK, generate("genuine", genuine)),
    ]
    return attempts + [("replayed KV handle", DENIED, generate("replay", genuine))]


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def _cached(http: httpx.AsyncClient, target: Target, key: str, prompt: list[int]) -> int:
    reply = await http.post(
        "/v1/completions",
        headers=_auth(key),
        json={"model": target.model, "prompt": prompt, "max_tokens": 2, "temperature": 0},
    )
    if reply.status_code != 200:
        return -reply.status_code
    return reply.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


async def probe_attack(http: httpx.AsyncClient, target: Target, tag: int) -> tuple[str, str, str]:
    """The owner sends a prompt twice (its repeat hits: the cache works), then the prober sends the same prompt."""
    prompt = _prompt(10_000 + tag, PROBE_LEN)
    owner = [await _cached(http, target, target.keys["owner"], prompt) for _ in range(2)]
    probed = await _cached(http, target, target.keys["prober"], prompt)
    got = (
        "no hit"
        if owner[0] == 0 and owner[1] > 0 and probed == 0
        else (f"owner cached {owner}, prober cached {probed}")
    )
    return "cross-tenant cache probe", "no hit", got


def _oversize(target: Target) -> dict[str, dict]:
    return {
        "max_tokens 2^32": {"max_tokens": 2**32},
        "max_tokens 2^64": {"max_tokens": 2**64},
        "stop string of 257 characters": {"stop": ["s" * 257]},
        "17 stop strings": {"stop": [f"s{i}" for i in range(17)]},
        "messages past the cap": {"messages": [{"role": "user", "content": "x" * (target.max_prompt_chars + 1)}]},
        "n = 17": {"n": 17},
    }


async def oversize_attacks(http: httpx.AsyncClient, target: Target) -> list[tuple[str, str, str]]:
    out = []
    for name, fields in _oversize(target).items():
        body = {"model": target.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **fields}
        reply = await http.post("/v1/chat/completions", headers=_auth(target.keys["owner"]), json=body)
        is_openai = reply.headers.get("content-type", "").startswith("application/json") and "error" in reply.json()
        out.append(
            (
                f"oversize: {name}",
                "400",
                str(reply.status_code) if is_openai else f"{reply.status_code} without an OpenAI error body",
            )
        )
    return out


async def flood_attack(http: httpx.AsyncClient, target: Target) -> tuple[str, str, str]:
    """One key sends 10x its in-flight limit at once and holds every admitted stream open until all have answered
    (then hangs up, which must stop their work): at least half must be 429 with Retry-After, nothing else."""
    num = 10 * target.max_inflight_per_key
    body = {
        "model": target.model,
        "prompt": _prompt(99, 16),
        "max_tokens": FLOOD_TOKENS,
        "ignore_eos": True,
        "stream": True,
    }
    answered, everyone = [], asyncio.Event()

    def count(status: int, retry_after: str | None) -> None:
        answered.append((status, retry_after))
        if len(answered) == num:
            everyone.set()

    async def one() -> None:
        try:
            async with http.stream("POST", "/v1/completions", headers=_auth(target.keys["flood"]), json=body) as reply:
                count(reply.status_code, reply.headers.get("retry-after"))
                await asyncio.wait_for(everyone.wait(), GRPC_TIMEOUT_S)
        except (httpx.HTTPError, TimeoutError) as exc:
            if not everyone.is_set():
                count(0, type(exc).__name__)  # no answer: the statuses show it

    await asyncio.gather(*(one() for _ in range(num)))
    statuses = [status for status, _ in answered]
    refused = [retry for status, retry in answered if status == 429]
    is_ok = set(statuses) <= {200, 429} and len(refused) >= num // 2 and all(refused)
    got = "429 with Retry-After" if is_ok else f"statuses {sorted(set(statuses))}, {len(refused)} of {num} refused"
    return f"{FLOOD_PREFIX} ({num} at once)", "429 with Retry-After", got


async def http_attacks(target: Target, tag: int) -> list[tuple[str, str, str]]:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=target.url, timeout=120, limits=limits) as http:
        return [
            await probe_attack(http, target, tag),
            *await oversize_attacks(http, target),
            await flood_attack(http, target),
        ]


def one_round(target: Target, tag: int) -> list[tuple[str, str, str]]:
    out = []
    for group in (
        lambda: plane_attacks(target),
        lambda: kv_attacks(target, tag),
        lambda: asyncio.run(http_attacks(target, tag)),
    ):
        try:
            out += group()
        except Exception as exc:  # noqa: BLE001 - an attack that could not run is reported, and fails the verdict
            out.append(("an attack group ran to its end", "yes", f"{type(exc).__name__}: {exc}"))
    return out


def main(argv: list[str]) -> int:
    target = Target(**json.loads(argv[1]))
    for line in sys.stdin:
        tag = int(line.split()[1])
        for name, expected, got in one_round(target, tag):
            print(json.dumps({"name": name, "expected": expected, "got": got}), flush=True)
        print(json.dumps({"done": tag}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
