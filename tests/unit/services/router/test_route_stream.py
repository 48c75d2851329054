"""RouteStream on the real Router servicer over loopback: Routes answered by call_id as soon as each is decided (a
waiting one holds up no other), refusals carried as the same status a unary Route ends with, Complete and
ReportFailure acted on without an answer, and a stream that ends completing nothing (as a vanished unary caller)."""

import asyncio
import dataclasses
import time

import grpc
import pytest

from services.common.errors import detail_of
from services.common.grpc_server import make_channel
from services.common.protos import router_pb2, router_pb2_grpc
from services.router.server import RouterService
from tests.unit.services.router.helpers import FakeClock
from tests.unit.services.router.test_server import SETTINGS, register_pool

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
async def started():
    services = []

    async def start(**changes) -> tuple[RouterService, router_pb2_grpc.RouterStub]:
        service = RouterService(dataclasses.replace(SETTINGS, **changes), FakeClock())
        await service.start()
        services.append(service)
        channel = make_channel(f"127.0.0.1:{service.port}")
        return service, router_pb2_grpc.RouterStub(channel)

    yield start
    for service in services:
        await service.stop(grace_s=0)


def route(call_id: int, req_id: str, model: str = "m", timeout_s: float = 5.0, **fields):
    message = router_pb2.RouteRequest(req_id=req_id, model=model, token_ids=range(32), **fields)
    return router_pb2.RouteStreamRequest(call_id=call_id, timeout_s=timeout_s, route=message)


def inflight(service: RouterService) -> dict[str, int]:
    return {v.worker_id: v.num_inflight for v in service.registry.views()}


async def test_routes_are_answered_by_call_id_and_completes_act_without_an_answer(started):
    service, stub = await started()
    await register_pool(stub)
    call = stub.RouteStream()
    await call.write(route(7, "r1"))
    await call.write(route(8, "r2"))
    first, second = await call.read(), await call.read()
    assert (first.call_id, first.route.decode.worker_id, first.route.prefill.worker_id) == (7, "d1", "p1")
    assert (second.call_id, second.route.decode.worker_id) == (8, "d2")
    assert inflight(service) == {"d1": 1, "d2": 1, "p1": 2}
    await call.write(router_pb2.RouteStreamRequest(complete=router_pb2.CompleteRequest(req_id="r1")))
    failed = router_pb2.ReportFailureRequest(worker_id="d2", req_id="r2", reason="UNAVAILABLE")
    await call.write(router_pb2.RouteStreamRequest(report_failure=failed))
    await call.done_writing()
    assert await call.read() is grpc.aio.EOF  # NOTE: nothing answers a Complete or a failure report
    assert await call.code() is grpc.StatusCode.OK
    assert inflight(service) == {"d1": 0, "d2": 1, "p1": 1}
    assert service.registry.quarantine_left_s("d2") > 0
    assert service.registry.num_inflight() == 1


async def test_a_refusal_is_the_status_a_unary_route_ends_with(started):
    _, stub = await started()
    await register_pool(stub)
    with pytest.raises(grpc.aio.AioRpcError) as unary:
        await stub.Route(route(0, "u", exclude_worker_ids=["d1", "d2"]).route)
    call = stub.RouteStream()
    await call.write(route(3, "s", exclude_worker_ids=["d1", "d2"]))
    await call.write(route(4, "ok"))
    refused, answered = await call.read(), await call.read()
    assert (refused.call_id, refused.WhichOneof("outcome"), answered.route.decode.worker_id) == (3, "error", "d1")
    assert refused.error.code == unary.value.code().value[0] == grpc.StatusCode.UNAVAILABLE.value[0]
    assert refused.error.message == unary.value.details() == "no live decode worker for model 'm' (excluding d1, d2)"
    trailing = dict(unary.value.trailing_metadata())
    assert refused.error.status_details == trailing["grpc-status-details-bin"]
    assert detail_of(unary.value).kind == "NoWorkerAvailableError"
    call.cancel()


async def test_a_route_that_waits_holds_up_no_other_and_is_bounded_by_its_timeout(started):
    _, stub = await started(startup_grace_s=2.0)
    await register_pool(stub)
    call = stub.RouteStream()
    await call.write(route(1, "slow", model="other", timeout_s=0.5))  # NOTE: unknown model: waited on in the grace
    await call.write(route(2, "fast"))
    fast = await asyncio.wait_for(call.read(), 0.4)
    assert (fast.call_id, fast.route.decode.worker_id) == (2, "d1")
    slow = await asyncio.wait_for(call.read(), 2.0)
    assert (slow.call_id, slow.error.code) == (1, grpc.StatusCode.DEADLINE_EXCEEDED.value[0])
    await call.write(route(3, "late", model="other", timeout_s=5.0))  # waits, then the grace ends: NOT_FOUND
    await call.done_writing()  # NOTE: half-closed: what still waits is answered before the call ends
    late = await asyncio.wait_for(call.read(), 4.0)
    assert (late.call_id, late.error.code) == (3, grpc.StatusCode.NOT_FOUND.value[0])
    assert await call.read() is grpc.aio.EOF


async def test_a_stream_that_dies_completes_nothing_as_a_unary_caller_that_died(started):
    service, stub = await started()
    await register_pool(stub)
    call = stub.RouteStream()
    await call.write(route(1, "r1"))
    assert (await call.read()).call_id == 1
    call.cancel()  # the gateway died mid-request: no Complete came
    await asyncio.sleep(0.2)
    assert service.registry.num_inflight() == 1  # NOTE: parity with unary: the in-flight TTL ends it
    assert service.registry.expire_inflight(now=1000.0 + SETTINGS.inflight_ttl_s) == ["r1"]


async def test_a_message_without_a_call_is_refused_alone(started):
    _, stub = await started()
    await register_pool(stub)
    call = stub.RouteStream()
    await call.write(router_pb2.RouteStreamRequest(call_id=5))
    await call.write(route(6, "r1"))
    bad, good = await call.read(), await call.read()
    assert (bad.call_id, bad.error.code, good.call_id) == (5, grpc.StatusCode.INVALID_ARGUMENT.value[0], 6)
    call.cancel()


async def test_stopping_the_router_ends_its_streams_instead_of_waiting_out_the_grace(started):
    service, stub = await started()
    await register_pool(stub)
    call = stub.RouteStream()
    await call.write(route(1, "r1"))
    assert (await call.read()).call_id == 1
    began = time.monotonic()
    await service.stop(grace_s=5)
    assert time.monotonic() - began < 2.0  # NOTE: an open stream held the stop for the whole 5 s before
    with pytest.raises(grpc.aio.AioRpcError):
        await call.read()  # ended by the router: the gateway goes unary (and fails over) from here
