"""Busy is not dead: a lapsed lease is probed before eviction, and an evicted worker that registers again gets
its in-flight requests back."""
import dataclasses

from services.common.grpc_server import GrpcServer
from services.router.registry import Registry
from services.router.server import RouterService, probe
from services.router.settings import RouterSettings
from services.router.types import WorkerLoad
from tests.unit.services.router.helpers import FakeClock, info


def test_an_evicted_worker_that_registers_again_gets_its_requests_back():
    clock = FakeClock()
    reg = Registry(clock, lease_ttl_s=10.0)
    reg.register(info("d1"), WorkerLoad())
    reg.add_inflight("r1", ["d1"], num_tokens=100)
    reg.add_inflight("r2", ["d1"], num_tokens=50)
    clock.advance(11.0)
    assert reg.lapsed() == ["d1"] and reg.expire() == ["d1"]
    reg.complete("r2")  # finished while the worker was out
    assert reg.register(info("d1"), WorkerLoad())
    (view,) = reg.views()
    assert (view.num_inflight, view.num_inflight_tokens) == (1, 100)
    assert reg.complete("r1") and reg.views()[0].num_inflight == 0


def test_renew_keeps_a_lapsed_worker_and_a_deregistered_one_returns_empty():
    clock = FakeClock()
    reg = Registry(clock, lease_ttl_s=10.0)
    reg.register(info("d1"), WorkerLoad())
    reg.add_inflight("r1", ["d1"])
    clock.advance(10.0)
    assert reg.views() == [] and reg.renew("d1") and reg.expire() == []
    assert [v.worker_id for v in reg.views()] == ["d1"] and reg.address("d1") == info("d1").address
    reg.deregister("d1")
    reg.register(info("d1"), WorkerLoad())
    assert reg.views()[0].num_inflight == 0


async def test_the_sweep_keeps_a_lapsed_worker_that_answers_health_and_evicts_a_silent_one():
    clock = FakeClock()
    service = RouterService(RouterSettings(port=0, probe_timeout_s=1.0), clock)
    live = GrpcServer("127.0.0.1:0", [])
    await live.start()
    try:
        service.registry.register(dataclasses.replace(info("busy"), address=f"127.0.0.1:{live.port}"), WorkerLoad())
        service.registry.register(dataclasses.replace(info("dead"), address="127.0.0.1:1"), WorkerLoad())
        clock.advance(11.0)
        await service.probe_lapsed()
        service.sweep()
        assert [v.worker_id for v in service.registry.views()] == ["busy"]
        assert await probe(f"127.0.0.1:{live.port}", 1.0) and not await probe("127.0.0.1:1", 1.0)
    finally:
        await live.stop(0)
