"""The load stream: a worker sends its load when its queue changes, the registry records it as a heartbeat's load
(routes before it count as reflected) without renewing the lease, and the disaggregation check then reads the real
queue instead of every route since the last heartbeat."""

import asyncio

from services.common.kv_events import load_changes
from services.common.protos import common_pb2
from services.router.core import RouterCore
from services.router.policy import DisaggregationPolicy, LeastLoadedPolicy
from services.router.registry import Registry
from services.router.types import RouteInput, WorkerLoad
from tests.unit.services.router.helpers import DECODE, PREFILL, FakeClock, info


async def test_load_changes_sends_only_what_changed():
    loads = iter([(0, 0), (0, 0), (1, 0), (1, 0), (0, 1)])
    current = [common_pb2.WorkerLoad()]
    stopped = asyncio.Event()

    def load() -> tuple[common_pb2.WorkerLoad, int]:
        waiting, running = next(loads, (0, 1))
        current[0] = common_pb2.WorkerLoad(num_waiting=waiting, num_running=running)
        return current[0], 0

    sent = []
    async for msg in load_changes(load, 0.001, stopped):
        sent.append((msg.num_waiting, msg.num_running))
        if len(sent) == 3:
            stopped.set()
    assert sent == [(0, 0), (1, 0), (0, 1)]


async def test_load_changes_sends_a_load_after_work_that_came_and_went_between_two_samples():
    samples = iter([(0, 0), (0, 0), (0, 300), (0, 300), (1, 300)])  # (waiting, tokens admitted so far)
    stopped = asyncio.Event()

    def load() -> tuple[common_pb2.WorkerLoad, int]:
        waiting, admitted = next(samples, (1, 300))
        return common_pb2.WorkerLoad(num_waiting=waiting), admitted

    sent = []
    async for msg in load_changes(load, 0.001, stopped):
        sent.append(msg.num_waiting)
        if len(sent) == 3:
            stopped.set()
    assert sent == [0, 0, 1]  # the second: same queue, but a request was admitted (and done) since the first


def test_streamed_loads_let_the_check_see_a_short_queue_where_heartbeats_guess_a_long_one():
    clock = FakeClock()
    registry = Registry(clock, lease_ttl_s=10.0)
    registry.register(info("p0", PREFILL), WorkerLoad())
    registry.register(info("d0", DECODE), WorkerLoad())
    core = RouterCore(registry, LeastLoadedPolicy(), DisaggregationPolicy(min_tokens=4, max_waiting=4))
    prompt = tuple(range(8))
    picks = [core.route(RouteInput(f"r{i}", "m", prompt)).prefill is not None for i in range(6)]
    assert picks == [True] * 4 + [False] * 2  # six still decoding: guessed as waiting on the prefill worker
    assert registry.report_load("p0", WorkerLoad(num_waiting=1))  # the worker says: one queued, the rest done
    assert core.route(RouteInput("r6", "m", prompt)).prefill is not None
    expires = registry.views("m", PREFILL)[0].lease_expires_in_s
    clock.advance(1.0)
    registry.report_load("p0", WorkerLoad())
    assert registry.views("m", PREFILL)[0].lease_expires_in_s == expires - 1.0  # no lease renewed
    assert not registry.report_load("gone", WorkerLoad())
