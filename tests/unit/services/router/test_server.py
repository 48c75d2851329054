"""The Router servicer over a real in-process grpc.aio server on a free loopback port, via a real stub."""

import asyncio

import grpc
import pytest

from engines.base.block_hash import chain_block_hashes
from services.common.grpc_server import make_channel
from services.common.protos import common_pb2, router_pb2, router_pb2_grpc
from services.router.server import RouterService
from services.router.settings import RouterSettings
from tests.unit.services.router.helpers import FakeClock

DECODE, PREFILL = common_pb2.WORKER_ROLE_DECODE, common_pb2.WORKER_ROLE_PREFILL
SETTINGS = RouterSettings(host="127.0.0.1", port=0, disagg_min_tokens=1, sweep_interval_s=0.02, startup_grace_s=0)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def service(clock):
    service = RouterService(SETTINGS, clock)
    await service.start()
    yield service
    await service.stop(grace_s=0)


@pytest.fixture
async def stub(service):
    async with make_channel(f"127.0.0.1:{service.port}") as channel:
        yield router_pb2_grpc.RouterStub(channel)


def worker(worker_id: str, role: int = DECODE, model: str = "m") -> router_pb2.WorkerInfo:
    layout = common_pb2.KvLayout(num_layers=2, num_kv_heads=1, head_dim=8, dtype="float32", block_size=16)
    return router_pb2.WorkerInfo(
        worker_id=worker_id,
        role=role,
        address=f"{worker_id}:1",
        model=model,
        layout=layout,
        max_num_seqs=4,
        max_model_len=512,
    )


async def register_pool(stub) -> None:
    for worker_id, role in (("d1", DECODE), ("d2", DECODE), ("p1", PREFILL)):
        await stub.Register(router_pb2.RegisterRequest(worker=worker(worker_id, role)))


async def route(stub, req_id: str, exclude=(), model="m") -> router_pb2.RouteResponse:
    return await stub.Route(
        router_pb2.RouteRequest(req_id=req_id, model=model, token_ids=range(32), exclude_worker_ids=exclude)
    )


async def test_register_route_complete(stub):
    reply = await stub.Register(router_pb2.RegisterRequest(worker=worker("d1")))
    assert (reply.lease_ttl_s, reply.heartbeat_interval_s) == (10.0, 2.0)
    await register_pool(stub)
    first, second = await route(stub, "r1"), await route(stub, "r2")
    assert (first.decode.worker_id, first.decode.address, first.prefill.worker_id) == ("d1", "d1:1", "p1")
    assert (first.policy, first.num_cached_tokens) == ("least_loaded", 0)
    assert first.reason == "disaggregated: 32 uncached tokens >= 1; p1 has 0 waiting"
    assert second.decode.worker_id == "d2"
    await stub.Complete(router_pb2.CompleteRequest(req_id="r1"))
    await stub.Complete(router_pb2.CompleteRequest(req_id="r1"))  # idempotent
    listed = (await stub.ListWorkers(router_pb2.ListWorkersRequest())).workers
    assert [(s.worker.worker_id, s.num_inflight) for s in listed] == [("d1", 0), ("d2", 1), ("p1", 1)]
    assert (listed[0].worker.layout.block_size, listed[0].lease_expires_in_s) == (16, 10.0)


async def test_heartbeat_load_steers_routing(stub):
    await register_pool(stub)
    load = common_pb2.WorkerLoad(num_running=3, num_blocks_used=9)
    assert (await stub.Heartbeat(router_pb2.HeartbeatRequest(worker_id="d1", load=load))).known
    assert not (await stub.Heartbeat(router_pb2.HeartbeatRequest(worker_id="ghost"))).known
    assert (await route(stub, "r1")).decode.worker_id == "d2"
    listed = (await stub.ListWorkers(router_pb2.ListWorkersRequest())).workers
    assert (listed[0].load.num_running, listed[0].load.num_blocks_used) == (3, 9)


async def test_sweeper_removes_expired_worker(stub, service, clock):
    await register_pool(stub)
    clock.advance(8)
    for worker_id in ("d2", "p1"):
        await stub.Heartbeat(router_pb2.HeartbeatRequest(worker_id=worker_id))
    clock.advance(3)  # d1's lease lapsed at +10
    for _ in range(100):
        if len(service.registry) == 2:
            break
        await asyncio.sleep(0.01)
    assert len(service.registry) == 2  # the sweeper removed d1, no call needed
    assert {(await route(stub, f"r{i}")).decode.worker_id for i in range(3)} == {"d2"}
    assert not (await stub.Heartbeat(router_pb2.HeartbeatRequest(worker_id="d1"))).known


async def test_deregister_removes_worker(stub):
    await register_pool(stub)
    await stub.Deregister(router_pb2.DeregisterRequest(worker_id="d1"))
    listed = (await stub.ListWorkers(router_pb2.ListWorkersRequest())).workers
    assert [s.worker.worker_id for s in listed] == ["d2", "p1"]


async def expect_error(call, code: grpc.StatusCode, details: str) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call
    assert (err.value.code(), err.value.details()) == (code, details)


async def test_no_decode_worker_is_unavailable(stub):
    await expect_error(route(stub, "r1"), grpc.StatusCode.UNAVAILABLE, "no live decode worker for model 'm'")
    await stub.Register(router_pb2.RegisterRequest(worker=worker("p1", PREFILL)))
    await expect_error(route(stub, "r1"), grpc.StatusCode.UNAVAILABLE, "no live decode worker for model 'm'")


async def test_all_excluded_is_unavailable_and_unknown_model_not_found(stub):
    await register_pool(stub)
    await expect_error(
        route(stub, "r1", exclude=["d1", "d2"]),
        grpc.StatusCode.UNAVAILABLE,
        "no live decode worker for model 'm' (excluding d1, d2)",
    )
    await expect_error(
        route(stub, "r1", model="llama"), grpc.StatusCode.NOT_FOUND, "model 'llama' is not served by any worker"
    )


async def test_bad_registration_is_invalid_argument(stub):
    await expect_error(
        stub.Register(router_pb2.RegisterRequest(worker=worker("d1", role=0))),
        grpc.StatusCode.INVALID_ARGUMENT,
        "worker role must be PREFILL or DECODE, got 0",
    )
    await expect_error(
        stub.Register(router_pb2.RegisterRequest(worker=worker(""))),
        grpc.StatusCode.INVALID_ARGUMENT,
        "worker worker_id is required",
    )


async def test_block_hashes_that_do_not_fit_the_prompt_are_invalid_argument(stub):
    await register_pool(stub)
    bad = router_pb2.RouteRequest(req_id="r1", model="m", token_ids=range(32), block_hashes=[1, 2], hash_block_size=4)
    await expect_error(
        stub.Route(bad), grpc.StatusCode.INVALID_ARGUMENT, "2 block hashes do not fit 32 tokens in blocks of 4"
    )
    good = router_pb2.RouteRequest(
        req_id="r2", model="m", token_ids=range(32), hash_block_size=4, block_hashes=chain_block_hashes(range(32), 4)
    )
    assert (await stub.Route(good)).decode.worker_id == "d1"


async def test_report_failure_quarantines_the_worker_at_once(stub, clock):
    await register_pool(stub)
    report = router_pb2.ReportFailureRequest(worker_id="d1", req_id="r0", reason="UNAVAILABLE")
    reply = await stub.ReportFailure(report)
    assert reply.quarantine_s == 5.0
    assert (await stub.ReportFailure(router_pb2.ReportFailureRequest(worker_id="ghost"))).quarantine_s == 0.0
    assert {(await route(stub, f"r{i}")).decode.worker_id for i in range(3)} == {"d2"}
    statuses = (await stub.ListWorkers(router_pb2.ListWorkersRequest())).workers
    listed = {s.worker.worker_id: s.quarantine_left_s for s in statuses}
    assert listed == {"d1": 5.0, "d2": 0.0, "p1": 0.0}
    clock.advance(5)
    for worker_id in ("d1", "d2", "p1"):
        await stub.Heartbeat(router_pb2.HeartbeatRequest(worker_id=worker_id))
    assert (await route(stub, "r9")).decode.worker_id == "d1"  # quarantine over; d1 has the least in flight


async def test_a_lapsed_worker_that_answers_its_probe_stays(stub, service, clock):
    answers = {"d1:1": True}
    probed = []

    async def probe(address: str, timeout_s: float) -> bool:
        probed.append(address)
        return answers.get(address, False)

    service.prober._probe = probe
    await register_pool(stub)
    await route(stub, "r1")  # d1 holds one request
    clock.advance(11)  # every lease lapsed; only d1 answers
    for _ in range(100):
        if len(service.registry) == 1:
            break
        await asyncio.sleep(0.01)
    assert len(service.registry) == 1 and service.registry.info("d1") is not None
    assert {"d1:1", "d2:1", "p1:1"} <= set(probed)
    answers["d1:1"] = False
    clock.advance(11)
    for _ in range(100):
        if len(service.registry) == 0:
            break
        await asyncio.sleep(0.01)
    assert len(service.registry) == 0
    assert not (await stub.Heartbeat(router_pb2.HeartbeatRequest(worker_id="d1"))).known
    await stub.Register(router_pb2.RegisterRequest(worker=worker("d1")))  # back, with its request
    (d1,) = (await stub.ListWorkers(router_pb2.ListWorkersRequest())).workers
    assert d1.num_inflight == 1


async def test_every_worker_busy_is_resource_exhausted(stub):
    await register_pool(stub)
    load = common_pb2.WorkerLoad(num_running=4, num_waiting=4)  # 2x its 4 slots: the default busy threshold
    for worker_id in ("d1", "d2"):
        await stub.Heartbeat(router_pb2.HeartbeatRequest(worker_id=worker_id, load=load))
    await expect_error(
        route(stub, "r1"), grpc.StatusCode.RESOURCE_EXHAUSTED, "all 2 decode workers for model 'm' are busy"
    )


async def test_after_a_restart_an_empty_pool_is_waited_on_while_workers_register_again(clock):
    import dataclasses

    service = RouterService(dataclasses.replace(SETTINGS, startup_grace_s=1.5), clock)
    await service.start()
    try:
        async with make_channel(f"127.0.0.1:{service.port}") as channel:
            stub = router_pb2_grpc.RouterStub(channel)
            pending = asyncio.create_task(route(stub, "r1"))
            await asyncio.sleep(0.3)
            assert not pending.done()  # no worker yet: it waits instead of failing
            await stub.Register(router_pb2.RegisterRequest(worker=worker("d1")))
            assert (await pending).decode.worker_id == "d1"
            await asyncio.sleep(1.5)  # past the grace: an empty pool is an error at once
            await expect_error(
                route(stub, "r2", exclude=["d1"]),
                grpc.StatusCode.UNAVAILABLE,
                "no live decode worker for model 'm' (excluding d1)",
            )
    finally:
        await service.stop(grace_s=0)


async def test_a_kv_decision_replays_its_deferred_lru_touch_after_the_reply(clock):
    from dataclasses import replace

    from engines.base.block_hash import NONE_HASH
    from engines.base.events import KvEvent, KvEventKind

    service = RouterService(replace(SETTINGS, policy="kv"), clock)
    await service.start()
    index = service.core.policy.event_index
    async with make_channel(f"127.0.0.1:{service.port}") as channel:
        stub = router_pb2_grpc.RouterStub(channel)
        await stub.Register(router_pb2.RegisterRequest(worker=worker("d1")))
        index.apply("d1", [KvEvent(1, KvEventKind.STORED, NONE_HASH, tuple(chain_block_hashes(range(32), 16)))])
        pending = []
        flush = index.flush_touches
        index.flush_touches = lambda: pending.append(len(index._touches)) or flush()
        reply = await route(stub, "r1")
        assert reply.num_cached_tokens == 32 and pending == [1] and not index._touches
    await service.stop(grace_s=0)
