"""Tenants at the gateway: keyed tenant ids, the cache salt each request carries to the router and workers, per-key
concurrency and token-rate limits (429 with Retry-After), `n` taking one slot per choice, and the per-request caps."""

import asyncio

import pytest

from engines.base.block_hash import chain_block_hashes, chain_root
from services.common.settings import SettingsError
from services.gateway.admission import Admission
from services.gateway.errors import InvalidRequestError, RateLimitError
from services.gateway.model_info import check_chars
from services.gateway.openai_protocol import (
    MAX_STOP_CHARS,
    ChatCompletionRequest,
    parse_request,
)
from services.gateway.settings import GatewaySettings
from services.gateway.tenancy import KeyLimits, cache_salt, tenant_id
from tests.unit.services.gateway.conftest import MODEL

KEYS = ("sk-alpha", "sk-beta")


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


# -- pure pieces -------------------------------------------------------------------------------------------------
def test_tenant_ids_are_keyed_digests_never_the_key():
    ids = {tenant_id(k, "s") for k in KEYS}
    assert len(ids) == 2 and not any(k in i for k in KEYS for i in ids)
    assert tenant_id("sk-alpha", "s") == tenant_id("sk-alpha", "s") != tenant_id("sk-alpha", "other")


def test_cache_salt_per_key_and_shared():
    assert cache_salt("t1", None, "per-key") == "t1"
    assert cache_salt("t1", "x", "per-key") == "t1:x"  # a client's salt never escapes its key's
    assert cache_salt("", "x", "per-key") == "x"  # no API keys: the client's salt alone
    assert cache_salt("t1", None, "shared") == "" and cache_salt("t1", "x", "shared") == "x"


def test_key_concurrency_counts_sequences_and_keys_apart():
    limits = KeyLimits(max_inflight=4)
    limits.acquire("a", 3)
    with pytest.raises(RateLimitError) as caught:
        limits.acquire("a", 2)
    assert caught.value.status == 429 and caught.value.code == "key_concurrency_exceeded"
    assert caught.value.headers() == {"Retry-After": "1"}
    limits.acquire("b", 4)  # another key is untouched
    limits.release("a", 3)
    limits.acquire("a", 4)
    assert limits.num_inflight("a") == 4


def test_token_rate_refuses_an_overspent_key_until_it_refills():
    clock = Clock()
    limits = KeyLimits(tokens_per_minute=600, clock=clock)  # 10 tokens/s
    limits.acquire("a")
    limits.charge("a", 650)  # what it really used: 50 over its minute's budget
    with pytest.raises(RateLimitError) as caught:
        limits.acquire("a")
    assert caught.value.code == "key_token_rate_exceeded" and caught.value.headers() == {"Retry-After": "6"}
    limits.acquire("b")  # another key's budget is its own
    clock.now += 6.0  # refilled past zero
    limits.acquire("a")


def test_admission_takes_n_slots_of_both_limits_or_none():
    admission = Admission(max_inflight=20, api_keys=KEYS, limits=KeyLimits(max_inflight=16))
    tenant = admission.check_key(f"Bearer {KEYS[0]}")
    assert tenant == tenant_id(KEYS[0]) and admission.check_key(f"Bearer {KEYS[1]}") != tenant
    slot = admission.acquire(tenant, 16)
    assert admission.num_inflight == 16
    with pytest.raises(RateLimitError):
        admission.acquire(tenant, 1)  # the key is full
    other = admission.check_key(f"Bearer {KEYS[1]}")
    with pytest.raises(RateLimitError):
        admission.acquire(other, 5)  # the gateway is: and the other key's slots are given back
    assert admission.limits.num_inflight(other) == 0 and admission.num_inflight == 16
    charged = []
    slot.on_release = lambda: charged.append(1)
    slot.release()
    slot.release()
    assert admission.num_inflight == 0 and admission.limits.num_inflight(tenant) == 0 and charged == [1]


def _chat(**kw) -> bytes:
    import json

    return json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **kw}).encode()


@pytest.mark.parametrize(
    "body,param",
    [
        ({"stop": ["x" * (MAX_STOP_CHARS + 1)]}, "stop"),
        ({"stop": [str(i) for i in range(17)]}, "stop"),
        ({"max_tokens": 2**32}, "max_tokens"),
        ({"max_tokens": 2**64}, "max_tokens"),
        ({"n": 17}, "n"),
        ({"cache_salt": ""}, "cache_salt"),
        ({"cache_salt": "s" * 257}, "cache_salt"),
    ],
    ids=["stop-too-long", "too-many-stops", "max-tokens-2^32", "max-tokens-2^64", "n-17", "empty-salt", "long-salt"],
)
def test_oversize_fields_are_400s(body, param):
    with pytest.raises(InvalidRequestError) as caught:
        parse_request(ChatCompletionRequest, _chat(**body))
    assert caught.value.param == param


def test_a_stop_string_of_exactly_the_cap_is_accepted():
    assert parse_request(ChatCompletionRequest, _chat(stop="x" * MAX_STOP_CHARS)).stop_strings()


def test_text_past_the_character_cap_is_refused_before_tokenizing():
    check_chars(10, 10, "prompt", "the prompt")
    check_chars(10**9, 0, "prompt", "the prompt")  # 0: no cap
    with pytest.raises(InvalidRequestError) as caught:
        check_chars(11, 10, "messages", "the messages")
    assert caught.value.param == "messages"


@pytest.mark.parametrize(
    "bad",
    [
        {"cache_sharing": "none"},
        {"max_inflight_per_key": -1},
        {"tokens_per_minute_per_key": -5},
        {"max_prompt_chars": 0},
    ],
)
def test_bad_tenancy_settings_stop_the_gateway(bad):
    with pytest.raises(SettingsError):
        GatewaySettings(model_dir="m", **bad)


def test_the_secret_never_shows_in_the_settings_repr():
    assert "hunter2" not in repr(GatewaySettings(model_dir="m", kv_hash_secret="hunter2"))


# -- live gateway over fake router and workers -------------------------------------------------------------------
async def test_each_key_salts_its_prompts_and_the_router_gets_the_salted_hashes(stack_with):
    async with stack_with(api_keys=KEYS, kv_hash_secret="sec") as s:
        s.router.block_size = 4
        for key in (KEYS[0], KEYS[1], KEYS[0]):
            reply = await s.http.post(
                "/v1/chat/completions",
                json={"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "the same prompt"}]},
                headers={"Authorization": f"Bearer {key}"},
            )
            assert reply.status_code == 200, reply.text
        salts = [r.params.cache_salt for r in s.decode.generate_requests]
        assert salts == [tenant_id(KEYS[0], "sec"), tenant_id(KEYS[1], "sec"), tenant_id(KEYS[0], "sec")]
        assert not any(k in salt for k in KEYS for salt in salts)
        route = s.router.routes[-1]
        assert route.cache_salt == salts[-1]
        assert list(route.block_hashes) == chain_block_hashes(list(route.token_ids), 4, chain_root(salts[-1], "sec"))


async def test_shared_caching_passes_only_the_clients_salt(stack_with):
    async with stack_with(cache_sharing="shared") as s:
        for salt in (None, "team-x"):
            body = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
            reply = await s.http.post("/v1/chat/completions", json=body | ({"cache_salt": salt} if salt else {}))
            assert reply.status_code == 200, reply.text
        assert [r.params.cache_salt for r in s.decode.generate_requests] == ["", "team-x"]


async def test_one_key_at_its_limit_gets_429_while_another_key_is_served(stack_with):
    async with stack_with(api_keys=KEYS, max_inflight_per_key=2) as s:
        s.decode.token_delay_s = 0.2

        def post(key: str, n: int = 1):
            return s.http.post(
                "/v1/completions",
                json={"model": MODEL, "prompt": "hi", "max_tokens": 3, "n": n},
                headers={"Authorization": f"Bearer {key}"},
            )

        flood = await asyncio.gather(*(post(KEYS[0]) for _ in range(6)), post(KEYS[1]), post(KEYS[1]))
        statuses = [r.status_code for r in flood[:6]]
        assert statuses.count(200) == 2 and statuses.count(429) == 4
        limited = next(r for r in flood[:6] if r.status_code == 429)
        assert limited.headers["retry-after"] == "1"
        assert limited.json()["error"]["code"] == "key_concurrency_exceeded"
        assert [r.status_code for r in flood[6:]] == [200, 200]
        assert (await post(KEYS[0], n=3)).status_code == 429  # n=3 needs three of its two slots


async def test_a_key_past_its_token_rate_waits_while_another_key_is_served(stack_with, reply_ids):
    async with stack_with(api_keys=KEYS, tokens_per_minute_per_key=60) as s:

        def post(key: str):
            return s.http.post(
                "/v1/completions",
                headers={"Authorization": f"Bearer {key}"},
                json={"model": MODEL, "prompt": list(range(1, 41)), "max_tokens": 30},
            )

        first = await post(KEYS[0])
        assert first.status_code == 200, first.text
        assert first.json()["usage"]["total_tokens"] > 60  # 40 prompt tokens charged at admission, the rest after
        refused = await post(KEYS[0])
        assert refused.status_code == 429 and refused.json()["error"]["code"] == "key_token_rate_exceeded"
        assert int(refused.headers["retry-after"]) >= 2  # what it overspent, refilled at one token a second
        assert (await post(KEYS[1])).status_code == 200


async def test_a_disaggregated_request_carries_its_salt_to_both_workers(stack_with):
    async with stack_with(api_keys=KEYS) as s:
        s.disaggregate()
        reply = await s.http.post(
            "/v1/completions",
            headers={"Authorization": f"Bearer {KEYS[1]}"},
            json={"model": MODEL, "prompt": "hi", "max_tokens": 3},
        )
        assert reply.status_code == 200, reply.text
        (prefill,), (generate,) = s.prefill.prefill_requests, s.decode.generate_requests
        assert prefill.params.cache_salt == generate.params.cache_salt == tenant_id(KEYS[1])
