"""Whole routing decisions over a real registry: liveness, exclusion, errors, recorded in-flight load."""

import pytest

from services.router.core import RouterCore
from services.router.policy import DisaggregationPolicy, make_policy
from services.router.registry import Registry
from services.router.types import (
    InvalidArgumentError,
    NoWorkerAvailableError,
    RouteInput,
    UnknownModelError,
    WorkerLoad,
)
from tests.unit.services.router.helpers import DECODE, PREFILL, FakeClock, info


def make_core(policy: str = "least_loaded", min_tokens: int = 1, workers=("d1", "d2"), clock=None) -> RouterCore:
    """Workers named p* are prefill, the rest decode; all serve model "m"."""
    registry = Registry(clock or FakeClock(), lease_ttl_s=10.0)
    for worker_id in workers:
        registry.register(info(worker_id, PREFILL if worker_id.startswith("p") else DECODE), WorkerLoad())
    return RouterCore(registry, make_policy(policy), DisaggregationPolicy(min_tokens, 4))


def route(core: RouterCore, req_id: str, n_tokens: int = 16, exclude=()) -> tuple[str, str | None]:
    d = core.route(RouteInput(req_id, "m", tuple(range(n_tokens)), frozenset(exclude)))
    return d.decode.worker_id, d.prefill.worker_id if d.prefill else None


def test_least_loaded_spreads_by_inflight_until_heartbeats_arrive():
    core = make_core(workers=("d1", "d2", "p1"))
    assert [route(core, f"r{i}") for i in range(3)] == [("d1", "p1"), ("d2", "p1"), ("d1", "p1")]
    core.registry.heartbeat("d1", WorkerLoad(num_running=2))  # now reports r0 and r2 itself
    assert route(core, "r3")[0] == "d2"  # d1: 2 running, none unreflected vs d2: 1 unreflected


def test_decision_fields_and_inflight_recorded():
    core = make_core(workers=("d1", "p1"))
    decision = core.route(RouteInput("r1", "m", tuple(range(16))))
    assert (decision.policy, decision.num_cached_tokens) == ("least_loaded", 0)
    assert decision.reason == "disaggregated: 16 uncached tokens >= 1; p1 has 0 waiting"
    assert [v.num_inflight for v in core.registry.views()] == [1, 1]
    core.registry.complete("r1")
    assert [v.num_inflight for v in core.registry.views()] == [0, 0]


def test_huge_threshold_forces_aggregation():
    core = make_core(min_tokens=10**9, workers=("d1", "p1"))
    assert route(core, "r1", n_tokens=4096) == ("d1", None)


@pytest.mark.parametrize("policy", ["round_robin", "least_loaded"])
def test_expired_workers_are_never_chosen(policy):
    clock = FakeClock()
    core = make_core(policy, workers=("d1", "d2", "d3"), clock=clock)
    clock.advance(6)
    core.registry.heartbeat("d2", WorkerLoad(num_running=3))  # busiest, but the only one alive at t+10
    clock.advance(4)
    assert {route(core, f"r{i}")[0] for i in range(6)} == {"d2"}


@pytest.mark.parametrize("policy", ["round_robin", "least_loaded"])
def test_excluded_workers_are_never_chosen(policy):
    core = make_core(policy, workers=("d1", "d2", "d3", "p1", "p2"))
    picks = set()
    for i in range(6):
        picks.add(route(core, f"r{i}", exclude=("d1", "d3", "p1")))
        core.registry.complete(f"r{i}")  # else p2's unreported queue saturates it
    assert picks == {("d2", "p2")}


def test_everything_excluded_is_unavailable():
    core = make_core(workers=("d1", "d2"))
    with pytest.raises(NoWorkerAvailableError, match=r"no live decode worker for model 'm' \(excluding d1, d2\)"):
        route(core, "r1", exclude=("d1", "d2"))


def test_no_workers_at_all_is_unavailable_not_unknown():
    with pytest.raises(NoWorkerAvailableError, match="no live decode worker for model 'm'"):
        route(make_core(workers=()), "r1")


def test_known_model_with_only_prefill_or_lapsed_workers_is_unavailable():
    core = make_core(workers=("d1", "p1"))
    core.registry.deregister("d1")
    with pytest.raises(NoWorkerAvailableError):
        route(core, "r1")


def test_unknown_model_is_not_found():
    core = make_core()
    with pytest.raises(UnknownModelError, match="model 'llama' is not served by any worker"):
        core.route(RouteInput("r1", "llama", (1, 2)))
    assert core.registry.num_inflight() == 0


def test_route_requires_req_id():
    with pytest.raises(InvalidArgumentError, match="req_id is required"):
        make_core().route(RouteInput("", "m", (1,)))


def test_quarantined_workers_are_avoided_while_others_are_left():
    core = make_core(workers=("d1", "d2", "p1", "p2"))
    core.registry.quarantine("d1", 5.0)
    core.registry.quarantine("p1", 5.0)
    assert {route(core, f"r{i}") for i in range(4)} == {("d2", "p2")}
    core.registry.quarantine("d2", 5.0)
    assert route(core, "r9", exclude=["d2"])[0] == "d1"  # all quarantined: still served


def test_every_decode_worker_past_the_busy_threshold_sheds_load():
    from services.router.core import BusyThresholds
    from services.router.types import WorkersBusyError

    core = make_core(workers=("d1", "d2"))
    core.busy = BusyThresholds(load=2.0, kv=0.9)  # info(): 4 sequence slots per worker
    core.registry.heartbeat("d1", WorkerLoad(num_running=4, num_waiting=4))
    core.registry.heartbeat("d2", WorkerLoad(num_running=4, num_waiting=3))
    assert route(core, "r1")[0] == "d2"  # 7 + 1 routed, unreported: now d2 is at 2.0 too
    with pytest.raises(WorkersBusyError, match="all 2 decode workers for model 'm' are busy"):
        route(core, "r2")
    core.registry.heartbeat("d2", WorkerLoad(num_running=1, num_blocks_used=95, num_blocks_total=100))
    with pytest.raises(WorkersBusyError):  # KV nearly full counts as busy as well
        route(core, "r3")
    core.busy = BusyThresholds()  # off: the queue just grows
    assert route(core, "r4")[0] == "d2"
