"""The response store's two backends against the same contract — SQLite in a file, and a real redis-server:
round trips, absence, deletion, expiry, two gateways sharing one store; and the API's 503 when the store is down."""

import asyncio
import time

import pytest

from services.gateway.response_store import RedisStore, SqliteStore, StoredResponse, make_store
from tandem.launcher import free_port
from tests.integration.helpers import assert_error
from tests.redis_server import running_redis
from tests.unit.services.gateway.conftest import MODEL

RECORD = {"response": {"id": "resp_1", "output": [{"type": "message", "text": "héllo 😀"}]}, "conversation": []}


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory):
    with running_redis(tmp_path_factory.mktemp("redis")) as url:
        yield url


@pytest.fixture(params=["sqlite", "redis"])
def open_store(request, tmp_path):
    """`open_store(ttl_s)`: a new store on the one backing file or server (as another gateway would open it)."""
    url = request.getfixturevalue("redis_url") if request.param == "redis" else ""
    prefix = f"{request.node.name}-{time.monotonic_ns()}-"  # NOTE: one Redis serves every test of the module

    def make(ttl_s: float = 60.0):
        return make_store(request.param, path=tmp_path / "store.sqlite3", redis_url=url, ttl_s=ttl_s)

    make.prefix = prefix
    return make


async def _closing(*stores):
    for store in stores:
        await store.close()


async def test_a_stored_response_reads_back_and_deletes(open_store):
    store, rid = open_store(), open_store.prefix + "a"
    try:
        assert await store.get(rid) is None
        await store.put(StoredResponse(rid, "owner-1", RECORD))
        assert await store.get(rid) == StoredResponse(rid, "owner-1", RECORD)
        assert await store.delete(rid) is True
        assert await store.get(rid) is None and await store.delete(rid) is False
    finally:
        await _closing(store)


async def test_two_gateways_share_one_store(open_store):
    first, second, rid = open_store(), open_store(), open_store.prefix + "b"
    try:
        await first.put(StoredResponse(rid, "", RECORD))
        assert (await second.get(rid)).record == RECORD
        assert await second.delete(rid) and await first.get(rid) is None
    finally:
        await _closing(first, second)


async def test_a_response_expires_after_its_ttl(open_store):
    store, rid = open_store(ttl_s=0.3), open_store.prefix + "c"
    try:
        await store.put(StoredResponse(rid, "", RECORD))
        assert await store.get(rid) is not None
        await asyncio.sleep(0.6)
        assert await store.get(rid) is None
    finally:
        await _closing(store)


def test_the_setting_picks_the_backend(tmp_path):
    assert isinstance(make_store("sqlite", path=tmp_path / "s", redis_url="", ttl_s=1), SqliteStore)
    assert isinstance(make_store("redis", path=tmp_path / "s", redis_url="redis://127.0.0.1:1/0", ttl_s=1), RedisStore)


async def test_a_store_that_is_down_is_a_503_not_a_500(stack_with):
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    async with stack_with(response_store="redis", redis_url=url) as s:
        reply = await s.http.post("/v1/responses", json={"model": MODEL, "input": "Hi"})
        assert_error(reply, 503, type="service_unavailable_error", code="store_unavailable", retry_after="1")
        assert_error(
            await s.http.get("/v1/responses/resp_x"),
            503,
            type="service_unavailable_error",
            code="store_unavailable",
            retry_after="1",
        )
        ok = await s.http.post("/v1/responses", json={"model": MODEL, "input": "Hi", "store": False})
        assert ok.status_code == 200 and ok.json()["status"] == "completed"  # nothing to store: it still answers


async def test_responses_through_redis_survive_a_second_gateway(stack_with, redis_url):
    async with stack_with(response_store="redis", redis_url=redis_url) as a:
        first = await a.client.responses.create(model=MODEL, input="Hi")
    async with stack_with(response_store="redis", redis_url=redis_url) as b:
        assert (await b.client.responses.retrieve(first.id)).output_text == first.output_text
        second = await b.client.responses.create(model=MODEL, input="Again", previous_response_id=first.id)
        assert second.status == "completed"


def test_store_settings_from_env_and_flags(monkeypatch, tmp_path):
    from services.common.settings import SettingsError
    from services.gateway.settings import GatewaySettings, parse_args

    monkeypatch.setenv("TANDEM_CACHE_DIR", str(tmp_path))
    assert GatewaySettings(model_dir="/m").response_store_file == tmp_path / "responses.sqlite3"
    monkeypatch.setenv("TANDEM_RESPONSE_STORE", "redis")
    monkeypatch.setenv("TANDEM_REDIS_URL", "redis://cache:6379/2")
    settings = parse_args(["--model", "/m", "--response-ttl-s", "60"])
    assert (settings.response_store, settings.redis_url, settings.response_ttl_s) == (
        "redis",
        "redis://cache:6379/2",
        60.0,
    )
    assert (
        parse_args(
            ["--model", "/m", "--response-store", "sqlite", "--response-store-path", "/x/r.db"]
        ).response_store_file.as_posix()
        == "/x/r.db"
    )
    for bad, words in (
        ({"response_store": "mongo"}, "response_store"),
        ({"response_store": "redis"}, "redis-url"),
        ({"response_store": "redis", "redis_url": "cache:6379"}, "redis://"),
        ({"response_ttl_s": 0}, "response_ttl_s"),
    ):
        with pytest.raises(SettingsError, match=words):
            GatewaySettings(model_dir="/m", **bad)


def test_the_redis_store_sends_the_password_given_apart_from_the_url():
    from services.gateway.response_store import RedisStore

    kwargs = RedisStore("redis://redis:6379/0", 60, "s3cret")._redis.connection_pool.connection_kwargs
    assert kwargs["password"] == "s3cret"
    assert RedisStore("redis://redis:6379/0", 60)._redis.connection_pool.connection_kwargs.get("password") is None
    in_url = RedisStore("redis://:fromurl@redis:6379/0", 60)._redis.connection_pool.connection_kwargs
    assert in_url["password"] == "fromurl"  # a URL's own password still works when none is given apart
