"""The response store across gateway processes, as real processes against fake router and worker gRPC services:
several processes behind one port (`--workers 2`) share the SQLite file, and separate gateways (as on several
hosts or pods) share a real redis-server. A response made by one process reads back, continues and deletes on
any other."""

import asyncio

import httpx

from tests.integration.test_gateway_processes import MODEL, gateway, model_dir  # noqa: F401 (a fixture)
from tests.redis_server import running_redis

NUM_RESPONSES = 12


async def _post(url: str, **body) -> dict:
    async with httpx.AsyncClient(timeout=20) as http:  # NOTE: a connection each, so either process may take it
        reply = await http.post(f"{url}/v1/responses", json={"model": MODEL, **body})
    assert reply.status_code == 200, reply.text
    return reply.json()


async def _get(url: str, response_id: str) -> httpx.Response:
    async with httpx.AsyncClient(timeout=20) as http:
        return await http.get(f"{url}/v1/responses/{response_id}")


async def test_gateway_processes_on_one_port_share_the_sqlite_store(model_dir, tmp_path):  # noqa: F811
    store = tmp_path / "responses.sqlite3"
    async with gateway(model_dir, tmp_path, "--workers", "2", "--response-store-path", str(store)) as gw:
        made = await asyncio.gather(*(_post(gw.url, input=f"question {i}") for i in range(NUM_RESPONSES)))
        served_by = {r["gateway_process"] for r in gw.request_records()}
        assert served_by == {0, 1}  # NOTE: 12 connections all hashed to one process: p = 2^-11
        reads = await asyncio.gather(*(_get(gw.url, r["id"]) for r in made for _ in range(2)))
        assert [r.status_code for r in reads] == [200] * 2 * NUM_RESPONSES
        assert [r.json() for r in reads[::2]] == made
        follow_ups = await asyncio.gather(
            *(_post(gw.url, input="and then?", previous_response_id=r["id"]) for r in made)
        )
        assert all(f["status"] == "completed" for f in follow_ups)
        # the second turn's prompt replays the first: it is longer than the first turn's by the reply and more
        prompts = sorted(len(g.token_ids) for g in gw.worker.generate_requests)
        assert prompts[-1] > prompts[0] + len(gw.worker.tokens)
        async with httpx.AsyncClient(timeout=20) as http:
            assert (await http.delete(f"{gw.url}/v1/responses/{made[0]['id']}")).status_code == 200
        assert [(await _get(gw.url, made[0]["id"])).status_code for _ in range(4)] == [404] * 4
    assert store.exists()


async def test_separate_gateways_share_a_redis_store(model_dir, tmp_path):  # noqa: F811
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with running_redis(tmp_path) as url:
        args = ("--response-store", "redis", "--redis-url", url)
        async with gateway(model_dir, tmp_path / "a", *args) as a, gateway(model_dir, tmp_path / "b", *args) as b:
            first = await _post(a.url, input="My name is Ada.")
            assert (await _get(b.url, first["id"])).json() == first
            second = await _post(b.url, input="What is my name?", previous_response_id=first["id"])
            assert second["previous_response_id"] == first["id"]
            [replayed] = b.worker.generate_requests
            [original] = a.worker.generate_requests
            assert len(replayed.token_ids) > len(original.token_ids) + len(a.worker.tokens)
            async with httpx.AsyncClient(timeout=20) as http:
                assert (await http.delete(f"{b.url}/v1/responses/{first['id']}")).json()["deleted"] is True
            assert (await _get(a.url, first["id"])).status_code == 404
            assert (await _get(a.url, second["id"])).status_code == 200
