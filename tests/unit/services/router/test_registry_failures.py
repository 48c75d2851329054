"""The registry when workers fail: quarantine, lapsed leases extended or evicted, and an evicted worker that comes
back with its in-flight requests."""

import pytest

from services.router.registry import Registry
from services.router.types import WorkerLoad
from tests.unit.services.router.helpers import FakeClock, info


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def reg(clock) -> Registry:
    reg = Registry(clock, lease_ttl_s=10.0, inflight_ttl_s=600.0)
    for worker_id in ("d1", "d2"):
        reg.register(info(worker_id), WorkerLoad())
    return reg


def test_quarantine_lasts_its_duration_and_a_new_registration_ends_it(reg, clock):
    assert reg.quarantine("d1", 5.0) is True
    assert reg.quarantine("ghost", 5.0) is False
    assert reg.quarantine_left_s("d1") == 5.0 and reg.quarantine_left_s("d2") == 0.0
    clock.advance(3)
    reg.quarantine("d1", 1.0)  # a shorter report never cuts a running quarantine
    assert reg.quarantine_left_s("d1") == 2.0
    clock.advance(2)
    assert reg.quarantine_left_s("d1") == 0.0
    reg.quarantine("d2", 5.0)
    reg.register(info("d2"), WorkerLoad())  # restarted: it listens again
    assert reg.quarantine_left_s("d2") == 0.0


def test_lapsed_lease_waits_for_the_probe_extend_is_bounded(reg, clock):
    reg.heartbeat("d2", WorkerLoad())
    clock.advance(10)
    reg.heartbeat("d2", WorkerLoad())
    assert reg.lapsed() == ["d1"] and reg.is_lapsed("d1") and not reg.is_lapsed("d2")
    assert reg.info("d1").worker_id == "d1"  # still held while it is probed
    assert reg.extend("d1", max_extensions=2) is True
    assert reg.lapsed() == []
    clock.advance(10)
    assert reg.extend("d1", max_extensions=2) is True
    clock.advance(10)
    assert reg.extend("d1", max_extensions=2) is False  # answers probes but never heartbeats: enough
    reg.heartbeat("d1", WorkerLoad())  # a heartbeat resets the count
    clock.advance(10)
    assert reg.extend("d1", max_extensions=2) is True
    assert reg.extend("ghost", max_extensions=2) is False


def test_evicted_worker_that_registers_again_gets_its_inflight_back(reg, clock):
    reg.add_inflight("r1", ["d1"], num_tokens=100, num_uncached=100)
    reg.add_inflight("r2", ["d1"], num_tokens=50)
    reg.add_inflight("r3", ["d2"])
    reg.heartbeat("d2", WorkerLoad())
    clock.advance(10)
    reg.heartbeat("d2", WorkerLoad())
    assert reg.evict("d1") is True
    assert [v.worker_id for v in reg.views()] == ["d2"]
    assert reg.num_inflight() == 3  # its requests are still counted: their streams may well go on
    assert reg.complete("r2") is True  # one ends while it is away
    reg.add_inflight("r3", ["d2"])
    assert reg.register(info("d1"), WorkerLoad()) is True
    d1, _ = reg.views()
    assert (d1.num_inflight, d1.num_inflight_tokens) == (1, 100)
    assert reg.complete("r1") is True
    assert reg.views()[0].num_inflight == 0


def test_a_request_migrated_away_is_not_given_back(reg):
    reg.add_inflight("r1", ["d1"])
    reg.evict("d1")
    reg.add_inflight("r1", ["d2"])  # the gateway re-routed it after d1 failed
    reg.register(info("d1"), WorkerLoad())
    d1, d2 = reg.views()
    assert (d1.num_inflight, d2.num_inflight) == (0, 1)


def test_a_lapsed_worker_that_registers_keeps_its_inflight(reg, clock):
    reg.add_inflight("r1", ["d1"])
    clock.advance(10)
    assert reg.register(info("d1"), WorkerLoad()) is True  # lapsed, unswept: counts as new, keeps r1
    assert reg.views()[0].num_inflight == 1


def test_deregister_forgets_inflight_and_evicted_ones_expire_with_the_ttl(reg, clock):
    reg.add_inflight("r1", ["d1"])
    reg.evict("d1")
    clock.advance(600)
    reg.heartbeat("d2", WorkerLoad())
    assert reg.expire_inflight() == ["r1"]
    reg.register(info("d1"), WorkerLoad())
    assert reg.views()[0].num_inflight == 0
