"""Attacks one tenant can make on another, against a live disaggregated stack with three API keys: probing the shared
prefix cache for another key's prompt, oversize fields, and flooding past the key's limit while another key works."""

import asyncio

import httpx
import pytest

from engines.base.block_hash import chain_block_hashes, chain_root
from services.common.grpc_server import make_sync_channel
from services.common.protos import common_pb2, worker_pb2, worker_pb2_grpc
from services.gateway.tenancy import tenant_id
from tandem.launcher import KV_HASH_SECRET_ENV
from tests.integration.conftest import ENDLESS_CONTEXT, running_stack, workers
from tests.integration.helpers import assert_error

KEYS = ("sk-tenant-a", "sk-tenant-b", "sk-tenant-flood")
MAX_INFLIGHT_PER_KEY = 2
MAX_PROMPT_CHARS = 20000
PROMPT = list(range(10, 63))  # 3 full blocks of 16 and 5 tokens more


def _auth(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def stack(endless_model, tmp_path_factory):
    # NOTE: 16 uncached tokens or more go to the prefill worker: a first request is disaggregated, so the decode
    # worker's copy of its blocks arrives by import
    env = {"TANDEM_ROUTER_DISAGG_MIN_TOKENS": "16", "TANDEM_KV_TRANSPORT": "grpc"}
    gateway_args = (
        "--api-keys",
        ",".join(KEYS),
        "--max-inflight-per-key",
        str(MAX_INFLIGHT_PER_KEY),
        "--max-prompt-chars",
        str(MAX_PROMPT_CHARS),
    )
    with running_stack(
        endless_model,
        tmp_path_factory.mktemp("tenants"),
        num_prefill=1,
        num_decode=1,
        env=env,
        gateway_args=gateway_args,
    ) as running:
        yield running


@pytest.fixture(scope="module")
def model(endless_model) -> str:
    return endless_model.name


def _cached_tokens(stack, model: str, key: str) -> int:
    response = httpx.post(
        f"{stack.url}/v1/completions",
        headers=_auth(key),
        timeout=60,
        json={"model": model, "prompt": PROMPT, "max_tokens": 2, "temperature": 0},
    )
    assert response.status_code == 200, response.text
    return response.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


def _stored_events(address: str) -> list:
    """Every STORED event the worker has published so far (the first batch of its event stream holds them all)."""
    with make_sync_channel(address) as channel:
        stream = worker_pb2_grpc.WorkerControlStub(channel).StreamKvEvents(
            worker_pb2.StreamKvEventsRequest(), timeout=10
        )
        batch = next(stream)
        stream.cancel()
    return [e for e in batch.events if e.kind == common_pb2.KV_EVENT_KIND_STORED]


def test_a_tenant_cannot_see_anothers_cached_prompt(stack, model):
    assert _cached_tokens(stack, model, KEYS[0]) == 0
    assert _cached_tokens(stack, model, KEYS[1]) == 0  # the probe: same prompt, other key, no hit
    assert _cached_tokens(stack, model, KEYS[0]) == 48  # the owner's repeat hits its three full blocks
    assert _cached_tokens(stack, model, KEYS[1]) == 48  # and so does the prober's own, on its own blocks


def test_every_worker_publishes_each_tenants_salted_hashes_and_never_a_root(stack, model):
    for key in KEYS[:2]:
        _cached_tokens(stack, model, key)  # cached already when the test above ran: then nothing new is stored
    secret = stack.cfg.env[KV_HASH_SECRET_ENV]
    salted = {key: chain_block_hashes(PROMPT, 16, chain_root(tenant_id(key, secret), secret)) for key in KEYS[:2]}
    public = chain_block_hashes(PROMPT, 16) + chain_block_hashes(PROMPT, 16, chain_root("", secret))
    for worker in workers(stack):  # NOTE: the decode worker's blocks came by import: they landed salted too
        events = _stored_events(worker.worker.address)
        stored = {h for e in events for h in e.block_hashes}
        assert all(set(hashes) <= stored for hashes in salted.values()), worker.worker.worker_id
        assert not stored & set(public)
        assert {e.parent_hash for e in events} <= stored | {0}  # a chain starts at 0: its root is never published


def test_a_client_salt_splits_one_keys_cache(stack, model):
    body = {"model": model, "prompt": PROMPT[::-1], "max_tokens": 2, "cache_salt": "session-1"}
    cached = []
    for salt in ("session-1", "session-2", "session-1"):
        response = httpx.post(
            f"{stack.url}/v1/completions", headers=_auth(KEYS[0]), timeout=60, json=body | {"cache_salt": salt}
        )
        assert response.status_code == 200, response.text
        cached.append(response.json()["usage"]["prompt_tokens_details"]["cached_tokens"])
    assert cached == [0, 0, 48]


def _chat(model: str, **kw) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **kw}


OVERSIZE = {
    "max_tokens-2^32": ({"max_tokens": 2**32}, "max_tokens"),
    "max_tokens-2^64": ({"max_tokens": 2**64}, "max_tokens"),
    "max_tokens-past-context": ({"max_tokens": ENDLESS_CONTEXT}, "max_tokens"),
    "max_completion_tokens-2^32": ({"max_completion_tokens": 2**32}, "max_completion_tokens"),
    "stop-257-chars": ({"stop": ["s" * 257]}, "stop"),
    "17-stops": ({"stop": [f"s{i}" for i in range(17)]}, "stop"),
    "messages-past-cap": ({"messages": [{"role": "user", "content": "x" * (MAX_PROMPT_CHARS + 1)}]}, "messages"),
    "n-17": ({"n": 17}, "n"),
    "cache_salt-257": ({"cache_salt": "c" * 257}, "cache_salt"),
}


@pytest.mark.parametrize("name", sorted(OVERSIZE))
def test_oversize_fields_are_400(stack, model, name):
    fields, param = OVERSIZE[name]
    response = httpx.post(
        f"{stack.url}/v1/chat/completions", headers=_auth(KEYS[0]), timeout=30, json=_chat(model, **fields)
    )
    assert_error(response, 400, type="invalid_request_error", param=param)


def test_an_oversize_completion_prompt_is_400_before_tokenizing(stack, model):
    response = httpx.post(
        f"{stack.url}/v1/completions",
        headers=_auth(KEYS[0]),
        timeout=30,
        json={"model": model, "prompt": "y" * (MAX_PROMPT_CHARS + 1), "max_tokens": 1},
    )
    assert_error(response, 400, type="invalid_request_error", param="prompt")


def test_n_takes_one_of_the_keys_slots_per_choice(stack, model):
    response = httpx.post(
        f"{stack.url}/v1/chat/completions",
        headers=_auth(KEYS[0]),
        timeout=30,
        json=_chat(model, n=MAX_INFLIGHT_PER_KEY + 1),
    )
    assert_error(response, 429, type="rate_limit_error", code="key_concurrency_exceeded", retry_after="1")
    ok = httpx.post(
        f"{stack.url}/v1/chat/completions",
        headers=_auth(KEYS[0]),
        timeout=60,
        json=_chat(model, n=MAX_INFLIGHT_PER_KEY),
    )
    assert ok.status_code == 200 and len(ok.json()["choices"]) == MAX_INFLIGHT_PER_KEY


async def _flood(url: str, model: str) -> tuple[list[httpx.Response], list[httpx.Response]]:
    """One key sends 10x its limit at once; another key keeps its own two slots busy the whole time."""
    async with httpx.AsyncClient(base_url=url, timeout=120) as http:

        def chat(key: str, max_tokens: int):
            return http.post("/v1/chat/completions", headers=_auth(key), json=_chat(model, max_tokens=max_tokens))

        async def legitimate() -> list[httpx.Response]:
            out = []
            for _ in range(3):
                out += await asyncio.gather(chat(KEYS[1], 8), chat(KEYS[1], 8))
            return out

        flood = [chat(KEYS[2], 64) for _ in range(10 * MAX_INFLIGHT_PER_KEY)]
        results = await asyncio.gather(legitimate(), *flood)
        return results[0], list(results[1:])


def test_a_flooding_key_gets_429s_while_another_key_loses_nothing(stack, model):
    legitimate, flood = asyncio.run(_flood(stack.url, model))
    assert [r.status_code for r in legitimate] == [200] * 6
    assert all(r.json()["usage"]["completion_tokens"] == 8 for r in legitimate)
    statuses = [r.status_code for r in flood]
    assert set(statuses) <= {200, 429} and statuses.count(429) >= len(flood) // 2, statuses
    for refused in (r for r in flood if r.status_code == 429):
        assert_error(refused, 429, type="rate_limit_error", code="key_concurrency_exceeded", retry_after="1")
