"""The planner's service shell over a fake connector and source: decisions reach the connector, a failing
connector is retried and counted, missing metrics hold, GetPlan answers over real gRPC, bad settings exit 2."""

import subprocess
import sys
from dataclasses import replace

import pytest

from services.common.grpc_server import make_channel
from services.common.protos import common_pb2, planner_pb2, planner_pb2_grpc
from services.planner.server import PlannerService
from services.planner.settings import PlannerSettings
from services.planner.types import ConnectorError, Observation, Replicas, WorkerRole, WorkerSample
from tests.unit.services.planner.helpers import round_profile

P, D = WorkerRole.PREFILL, WorkerRole.DECODE


class FakeConnector:
    name = "fake"

    def __init__(self, failures: int = 0):
        self.counts = {P: 1, D: 1}
        self.calls: list[tuple[WorkerRole, int]] = []
        self.failures = failures

    def replicas(self):
        return {role: Replicas(n) for role, n in self.counts.items()}

    def scale(self, role, target):
        self.calls.append((role, target))
        if self.failures:
            self.failures -= 1
            raise ConnectorError("the API said no")
        self.counts[role] = target


class FakeSource:
    def __init__(self, observations):
        self.observations = list(observations)

    async def observe(self, replicas):
        return replace(self.observations.pop(0), replicas=replicas)


def settings(tmp_path, **kw) -> PlannerSettings:
    profile = tmp_path / "round.json"
    profile.write_text(__import__("json").dumps(round_profile().to_dict()))
    return PlannerSettings(host="127.0.0.1", port=0, profile=str(profile), connector_backoff_s=0.01, up_ticks=2, **kw)


def slow(itl_s: float) -> Observation:
    return Observation(
        5.0, 20, 990.0, itl_s=itl_s, ttft_s=0.1, num_output_tokens=400, workers=(WorkerSample("d0", D, num_running=1),)
    )


def metric(service, name, **labels) -> float:
    return service.metrics.registry.get_sample_value(name, labels)


async def test_decisions_reach_the_connector_and_the_plan(tmp_path):
    clock = {"now": 0.0}
    connector = FakeConnector()
    service = PlannerService(settings(tmp_path), connector, FakeSource([slow(0.09)] * 2), lambda: clock["now"])
    await service.tick()
    clock["now"] = 5.0
    result = await service.tick()
    assert [(d.role, d.target) for d in result.decisions] == [(D, 2)] and connector.calls == [(D, 2)]
    assert metric(service, "tandem_planner_decisions_total", role="decode", direction="up") == 1
    assert metric(service, "tandem_planner_replicas_desired", role="decode") == 2
    assert metric(service, "tandem_planner_observed_latency_seconds", slo="itl") == 0.09
    await service.start()
    try:
        async with make_channel(f"127.0.0.1:{service.port}") as channel:
            plan = await planner_pb2_grpc.PlannerStub(channel).GetPlan(planner_pb2.GetPlanRequest())
    finally:
        await service.stop()
    decode = next(t for t in plan.targets if t.role == common_pb2.WORKER_ROLE_DECODE)
    assert (decode.target_replicas, decode.current_replicas, decode.reason) == (2, 1, "SLO violated")
    assert plan.connector == "fake" and plan.observed_request_rate == 4.0


async def test_a_failing_connector_is_retried_and_counted(tmp_path, caplog):
    connector = FakeConnector(failures=2)
    service = PlannerService(settings(tmp_path, connector_retries=3), connector, FakeSource([slow(0.09)] * 2))
    await service.tick()
    await service.tick()
    assert connector.calls == [(D, 2)] * 3 and connector.counts[D] == 2
    assert metric(service, "tandem_planner_connector_failures_total", connector="fake", operation="scale") == 2
    assert "attempt 2 of 3" in caplog.text


async def test_a_connector_that_keeps_failing_gives_up_for_the_tick(tmp_path, caplog):
    connector = FakeConnector(failures=10)
    service = PlannerService(settings(tmp_path, connector_retries=2), connector, FakeSource([slow(0.09)] * 3))
    await service.tick()
    await service.tick()
    assert connector.calls == [(D, 2)] * 2 and "the next tick tries again" in caplog.text
    await service.tick()
    assert connector.calls == [(D, 2)] * 4  # the target stands: asked again


async def test_missing_metrics_or_replicas_hold_every_count(tmp_path):
    class Broken(FakeConnector):
        def replicas(self):
            raise ConnectorError("unreachable")

    missing = Observation(5.0, None)
    service = PlannerService(settings(tmp_path), FakeConnector(), FakeSource([missing] * 3))
    for _ in range(3):
        assert (await service.tick()).decisions == ()
    assert metric(service, "tandem_planner_missing_observations_total") == 3
    broken = PlannerService(settings(tmp_path), Broken(), FakeSource([slow(0.09)] * 3))
    for _ in range(3):
        assert (await broken.tick()).decisions == ()
    assert metric(broken, "tandem_planner_connector_failures_total", connector="fake", operation="replicas") == 3


@pytest.mark.parametrize(
    "env, message",
    [
        ({"TANDEM_PLANNER_MIN_DECODE": "0"}, "need 1 <= min_decode <= max_decode"),
        ({"TANDEM_PLANNER_SOURCE": "graphite"}, "source must be one of router, prometheus"),
        ({"TANDEM_PLANNER_PROFILE": "/nonexistent.json"}, "no profile"),
        ({"TANDEM_PLANNER_FEEDBACK_DOWN_FACTOR": "1.5"}, "feedback_*: need up_gain >= 0, down_factor in (0, 1]"),
    ],
)
def test_a_bad_setting_is_one_line_and_exit_2(env, message):
    done = subprocess.run(
        [sys.executable, "-m", "tandem.cli", "serve", "planner"],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", **env},
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and message in done.stderr, done.stderr
