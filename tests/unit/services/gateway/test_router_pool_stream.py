"""The router pool over RouteStream against a real router on loopback: once the stream is open Route, Complete and
ReportFailure ride it (no unary call), concurrent Routes get their own answers, a refusal is the very error a unary
Route raises, closing the pool lets the router act on what was sent, and a broken stream falls back to unary calls
and opens again later."""

import asyncio
import dataclasses

import grpc
import pytest

from services.common.domain import FailureReport, RouteRequest
from services.common.errors import detail_of
from services.common.grpc_server import make_channel
from services.gateway import errors, router_pool_stream
from services.gateway.router_pool import RouterPool
from services.router.server import RouterService, RouterServicer
from tests.unit.services.router.helpers import FakeClock
from tests.unit.services.router.test_server import SETTINGS, register_pool

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def unary_calls(monkeypatch) -> list[str]:
    """The unary Route/Complete/ReportFailure calls the router served (patched before any router is built)."""
    calls: list[str] = []
    for name in ("Route", "Complete", "ReportFailure"):
        original = getattr(RouterServicer, name)

        async def counted(self, request, context, original=original, name=name):
            calls.append(name)
            return await original(self, request, context)

        monkeypatch.setattr(RouterServicer, name, counted)
    return calls


async def start_router(port: int = 0) -> RouterService:
    service = RouterService(dataclasses.replace(SETTINGS, port=port), FakeClock())
    await service.start()
    return service


async def open_pool(service: RouterService) -> RouterPool:
    pool = RouterPool([make_channel(f"127.0.0.1:{service.port}")])
    await register_pool(pool._replicas[0].stub)
    await pool.route(RouteRequest("warm", "m", list(range(32))), timeout_s=5)  # NOTE: unary; opens the stream
    await pool.complete("warm", timeout_s=5)
    await wait_until(lambda: pool._replicas[0].stream.is_open)
    return pool


async def wait_until(check, timeout_s: float = 5.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not check():
            await asyncio.sleep(0.01)


def request(req_id: str, exclude: tuple[str, ...] = ()) -> RouteRequest:
    return RouteRequest(req_id, "m", list(range(32)), list(exclude))


async def test_calls_ride_the_stream_and_concurrent_routes_get_their_own_answers(unary_calls):
    service = await start_router()
    pool = await open_pool(service)
    unary_calls.clear()
    # NOTE: even requests exclude d1, odd ones d2: each answer must come back to its own request
    asked = [request(f"r{i}", ("d1",) if i % 2 == 0 else ("d2",)) for i in range(8)]  # NOTE: 4 a worker: all fit
    routes = await asyncio.gather(*(pool.route(r, timeout_s=5) for r in asked))
    assert [r.decode.worker_id for r in routes] == ["d2" if i % 2 == 0 else "d1" for i in range(8)]
    assert service.registry.num_inflight() == 8
    await pool.report_failure(FailureReport("d2", "r0", "UNAVAILABLE"), timeout_s=5)
    for r in asked:
        await pool.complete(r.req_id, timeout_s=5)
    await wait_until(lambda: service.registry.num_inflight() == 0)
    assert service.registry.quarantine_left_s("d2") > 0
    assert unary_calls == []
    await pool.close()
    await service.stop(grace_s=0)


async def test_a_refusal_on_the_stream_is_the_error_a_unary_route_raises(unary_calls):
    service = await start_router()
    pool = await open_pool(service)
    unary_calls.clear()
    with pytest.raises(grpc.aio.AioRpcError) as streamed:
        await pool.route(request("s", ("d1", "d2")), timeout_s=5)
    with pytest.raises(grpc.aio.AioRpcError) as unary:
        await pool._replicas[0].stub.Route(pool_message(request("u", ("d1", "d2"))), timeout=5)
    assert (streamed.value.code(), streamed.value.details()) == (unary.value.code(), unary.value.details())
    assert detail_of(streamed.value) == detail_of(unary.value) != None  # noqa: E711
    as_client = errors.from_rpc_error(streamed.value, "route"), errors.from_rpc_error(unary.value, "route")
    assert type(as_client[0]) is type(as_client[1]) is errors.NoWorkerError
    assert unary_calls.count("Route") == 1  # NOTE: only the direct stub call
    await pool.close()
    await service.stop(grace_s=0)


def pool_message(route: RouteRequest):
    from services.common import convert

    return convert.route_request_to_pb(route)


async def test_closing_the_pool_lets_the_router_act_on_every_complete_sent():
    service = await start_router()
    pool = await open_pool(service)
    for i in range(8):
        await pool.route(request(f"r{i}"), timeout_s=5)
    for i in range(8):
        await pool.complete(f"r{i}", timeout_s=5)  # NOTE: written, not answered
    await pool.close()  # NOTE: half-closes and waits for the router to end the stream
    assert service.registry.num_inflight() == 0
    await service.stop(grace_s=0)


async def test_a_broken_stream_falls_back_to_unary_and_opens_again(unary_calls, monkeypatch):
    monkeypatch.setattr(router_pool_stream, "REOPEN_AFTER_S", 0.2)
    service = await start_router()
    port = service.port
    pool = await open_pool(service)
    stream = pool._replicas[0].stream
    await service.stop(grace_s=0)  # the router restarts: the stream breaks
    await wait_until(lambda: not stream.is_open)
    service = await start_router(port)
    await register_pool(pool._replicas[0].stub)
    unary_calls.clear()
    assert (await pool.route(request("r1"), timeout_s=5)).decode.worker_id == "d1"
    assert unary_calls == ["Route"]  # NOTE: the stream was down: the call went unary (and waited for the router)
    await asyncio.sleep(0.25)
    await pool.route(request("r2"), timeout_s=5)  # NOTE: past REOPEN_AFTER_S a call tries a new stream
    await wait_until(lambda: stream.is_open)
    unary_calls.clear()
    await pool.route(request("r3"), timeout_s=5)
    assert unary_calls == []
    await pool.close()
    await service.stop(grace_s=0)


async def test_callers_cancelled_mid_write_break_nothing_for_the_others(unary_calls):
    service = await start_router()
    pool = await open_pool(service)
    stream = pool._replicas[0].stream
    unary_calls.clear()
    for round_ in range(20):  # NOTE: clients that leave at once, while their messages are being written
        leaving = [asyncio.create_task(pool.route(request(f"x{round_}-{i}"), timeout_s=5)) for i in range(4)]
        await asyncio.sleep(0)
        for task in leaving:
            task.cancel()
        await asyncio.gather(*leaving, return_exceptions=True)
        for i in range(4):
            await pool.complete(f"x{round_}-{i}", timeout_s=5)
    assert stream.is_open
    assert (await pool.route(request("stays"), timeout_s=5)).decode.worker_id in ("d1", "d2")
    await pool.complete("stays", timeout_s=5)
    assert unary_calls == []
    await wait_until(lambda: service.registry.num_inflight() == 0)
    await pool.close()
    await service.stop(grace_s=0)
