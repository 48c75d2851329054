"""The registry: leases under a fake clock, heartbeats, re-registration, in-flight load and its expiry."""

import pytest

from services.router.registry import Registry
from services.router.types import InvalidArgumentError, WorkerInfo, WorkerLoad
from tests.unit.services.router.helpers import DECODE, PREFILL, FakeClock, info


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def reg(clock) -> Registry:
    return Registry(clock, lease_ttl_s=10.0, inflight_ttl_s=600.0)


def ids(reg: Registry, **kw) -> list[str]:
    return [v.worker_id for v in reg.views(**kw)]


def test_lease_lapses_after_ttl_and_expire_removes_it(reg, clock):
    assert reg.register(info("d2"), WorkerLoad()) is True
    assert reg.register(info("d1"), WorkerLoad()) is True
    clock.advance(9.5)
    assert ids(reg) == ["d1", "d2"]
    assert reg.views()[0].lease_expires_in_s == pytest.approx(0.5)
    assert reg.expire() == []
    clock.advance(0.5)
    assert ids(reg) == []  # invisible at once, before any sweep
    assert len(reg) == 2
    assert reg.expire() == ["d1", "d2"]
    assert len(reg) == 0


def test_heartbeat_renews_lease_and_records_load(reg, clock):
    reg.register(info("d1"), WorkerLoad())
    clock.advance(8)
    assert reg.heartbeat("d1", WorkerLoad(num_running=3, num_blocks_used=7)) is True
    clock.advance(9)
    assert reg.expire() == []
    (v,) = reg.views()
    assert (v.load.num_running, v.load.num_blocks_used, v.lease_expires_in_s) == (3, 7, 1.0)
    clock.advance(1)
    assert reg.expire(clock.now) == ["d1"]


def test_heartbeat_from_unknown_or_evicted_worker_must_reregister(reg, clock):
    assert reg.heartbeat("ghost", WorkerLoad()) is False
    reg.register(info("d1"), WorkerLoad())
    clock.advance(10)
    assert ids(reg) == []  # lapsed: not routed to
    assert reg.heartbeat("d1", WorkerLoad()) is True  # not yet swept: it was slow, not gone
    assert ids(reg) == ["d1"]
    clock.advance(10)
    assert reg.expire() == ["d1"]
    assert reg.heartbeat("d1", WorkerLoad()) is False
    assert reg.register(info("d1"), WorkerLoad()) is True
    assert reg.heartbeat("d1", WorkerLoad()) is True
    assert ids(reg) == ["d1"]


def test_reregistering_live_worker_replaces_info_and_keeps_inflight(reg):
    reg.register(info("d1", max_num_seqs=4), WorkerLoad())
    reg.add_inflight("r1", ["d1"])
    assert reg.register(info("d1", max_num_seqs=8), WorkerLoad()) is False
    (v,) = reg.views()
    assert (v.info.max_num_seqs, v.num_inflight) == (8, 1)


def test_deregister_removes_worker_and_its_inflight(reg):
    reg.register(info("d1"), WorkerLoad())
    reg.register(info("d2"), WorkerLoad())
    reg.add_inflight("r1", ["d1"])
    reg.add_inflight("r2", ["d2"])
    assert reg.deregister("d1") is True
    assert reg.deregister("d1") is False
    assert ids(reg) == ["d2"]
    assert reg.num_inflight() == 1
    assert reg.complete("r1") is False


def test_views_filter_by_model_and_role_sorted(reg):
    reg.register(info("p1", PREFILL), WorkerLoad())
    reg.register(info("d2"), WorkerLoad())
    reg.register(info("d1"), WorkerLoad())
    reg.register(WorkerInfo("x1", DECODE, "x:1", "other"), WorkerLoad())
    assert ids(reg) == ["d1", "d2", "p1", "x1"]
    assert ids(reg, model="m", role=DECODE) == ["d1", "d2"]
    assert ids(reg, model="m", role=PREFILL) == ["p1"]
    assert ids(reg, model="nope") == []


def test_models_stay_known_after_their_workers_leave(reg, clock):
    reg.register(info("d1"), WorkerLoad())
    clock.advance(10)
    reg.expire()
    assert reg.has_model("m") and not reg.has_model("other")


def test_register_rejects_missing_fields(reg):
    with pytest.raises(InvalidArgumentError, match="worker_id is required"):
        reg.register(WorkerInfo("", DECODE, "a:1", "m"), WorkerLoad())
    with pytest.raises(InvalidArgumentError, match="address is required"):
        reg.register(WorkerInfo("d1", DECODE, "", "m"), WorkerLoad())


def test_inflight_counts_until_complete_and_heartbeat_reflects_it(reg):
    reg.register(info("d1"), WorkerLoad())
    reg.register(info("p1", PREFILL), WorkerLoad())
    reg.add_inflight("r1", ["d1", "p1"])
    reg.add_inflight("r2", ["d1"])
    d1, p1 = reg.views()
    assert (d1.num_inflight, d1.num_unreflected, p1.num_inflight, p1.num_unreflected) == (2, 2, 1, 1)
    reg.heartbeat("d1", WorkerLoad(num_running=2))  # its load now includes both
    reg.add_inflight("r3", ["d1"])
    d1, _ = reg.views()
    assert (d1.num_inflight, d1.num_unreflected) == (3, 1)
    assert reg.complete("r1") is True
    assert reg.complete("r1") is False
    d1, p1 = reg.views()
    assert (d1.num_inflight, p1.num_inflight) == (2, 0)


def test_inflight_tokens_and_queued_prefill_follow_routes_heartbeats_and_completions(reg):
    # in-flight tokens are the KV the routes added (their uncached tokens): a cached prefix they share counts once
    reg.register(info("d1"), WorkerLoad())
    for req_id, tokens, uncached in (("r1", 100, 100), ("r2", 50, 10), ("r3", 70, 30)):
        reg.add_inflight(req_id, ["d1"], tokens, uncached)
    (d1,) = reg.views()
    assert (d1.num_inflight_tokens, d1.num_queued_prefill_tokens) == (140, 140)  # none reported yet
    reg.heartbeat("d1", WorkerLoad(num_running=2, num_waiting=1))  # one still waits: the newest, r3
    reg.add_inflight("r4", ["d1"], 40, 40)
    (d1,) = reg.views()
    assert (d1.num_unreflected, d1.num_inflight_tokens, d1.num_queued_prefill_tokens) == (1, 180, 40 + 30)
    reg.complete("r3")  # its slot in `num_waiting` now falls on r2 (an estimate from route order)
    reg.register(info("d1", max_num_seqs=8), WorkerLoad())  # re-registering keeps the account
    (d1,) = reg.views()
    assert (d1.num_inflight, d1.num_inflight_tokens) == (3, 150)


def test_reroute_of_same_req_id_replaces_entry(reg):
    reg.register(info("d1"), WorkerLoad())
    reg.register(info("d2"), WorkerLoad())
    reg.add_inflight("r1", ["d1"])
    reg.add_inflight("r1", ["d2"])  # migration after d1 failed it
    assert [v.num_inflight for v in reg.views()] == [0, 1]
    assert reg.num_inflight() == 1


def test_stale_inflight_expires_after_ttl(clock):
    reg = Registry(clock, lease_ttl_s=10_000.0, inflight_ttl_s=600.0)
    reg.register(info("d1"), WorkerLoad())
    reg.add_inflight("r1", ["d1"])
    clock.advance(300)
    reg.heartbeat("d1", WorkerLoad())
    reg.add_inflight("r2", ["d1"])
    assert reg.expire_inflight(clock.now + 299.9) == []
    assert reg.expire_inflight(clock.now + 300) == ["r1"]
    (d1,) = reg.views()
    assert (d1.num_inflight, d1.num_unreflected) == (1, 1)
    clock.advance(600)
    reg.heartbeat("d1", WorkerLoad())
    assert reg.expire_inflight() == ["r2"]
    assert reg.views()[0].num_inflight == 0
