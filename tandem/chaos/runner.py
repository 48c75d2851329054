"""Runs chaos scenarios: one stack per shape (scenarios of one shape share it, one after another, each starting on
a healed, idle stack), the reference answers, the load with the scenario's faults beside it, then the verdict.

Orchestration only: faults and checks are scenarios.py's, verdicts outcomes.py's.
"""

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from tandem.chaos.load import Load, LoadRunner
from tandem.chaos.outcomes import Check, ScenarioResult, classify, summarize
from tandem.chaos.stack import LiveStack, Shape

log = logging.getLogger(__name__)


@dataclass
class Run:
    """One scenario in progress: what its faults and checks share."""

    stack: LiveStack
    load: LoadRunner
    t0: float = 0.0
    since_s: float = 0.0  # recovery is measured from here (the fault, or a restart the fault waits for)
    events: list[tuple[float, str]] = field(default_factory=list)
    facts: dict[str, float | str] = field(default_factory=dict)

    async def at(self, t: float) -> None:
        await asyncio.sleep(max(self.t0 + t - time.monotonic(), 0.0))

    def note(self, what: str) -> float:
        now = time.monotonic()
        self.events.append((round(now - self.t0, 3), what))
        log.info("%.1f s: %s", now - self.t0, what)
        return now


Fault = Callable[[Run], Awaitable[None]]
Judge = Callable[[Run, ScenarioResult], Awaitable[list[Check]]]


@dataclass(frozen=True)
class Scenario:
    name: str
    goal: str
    shape: Shape
    load: Load
    fault: Fault
    judge: Judge


async def run_scenarios(scenarios: list[Scenario], model: str, log_dir: Path) -> list[ScenarioResult]:
    results = []
    for shape, group in _by_shape(scenarios):
        stack = LiveStack(shape, model, log_dir / f"stack-{len(results)}")
        try:
            await stack.start()
            for scenario in group:
                results.append(await run_one(scenario, stack))
        finally:
            await stack.stop()
    return results


def _by_shape(scenarios: list[Scenario]) -> list[tuple[Shape, list[Scenario]]]:
    groups: dict[Shape, list[Scenario]] = {}
    for s in scenarios:
        groups.setdefault(s.shape, []).append(s)
    return list(groups.items())


async def run_one(scenario: Scenario, stack: LiveStack) -> ScenarioResult:
    log.info("scenario %s: %s", scenario.name, scenario.goal)
    if not await stack.wait_ready(timeout_s=90):
        return _broken(scenario, "the stack did not come back to full strength before the scenario")
    load = LoadRunner(stack.url, served_model(stack), scenario.load)
    references = await load.reference()
    run = Run(stack, load)
    migrated_before = await stack.gateway_metric("tandem_gateway_migrations_total")
    run.t0 = run.since_s = time.monotonic()
    fault = asyncio.create_task(scenario.fault(run))
    await load.run(run.t0)
    await fault
    duration_s = time.monotonic() - run.t0
    outcomes = [(rec, classify(rec, scenario.load.osl, references[p])) for rec, p in load.records]
    migrated = int(await stack.gateway_metric("tandem_gateway_migrations_total") - migrated_before)
    result = summarize(scenario.name, scenario.goal, outcomes, duration_s, migrated, run.since_s)
    result.facts = {**run.facts, "events": "; ".join(f"{t:.1f} s {what}" for t, what in run.events)}
    result.checks = await scenario.judge(run, result)
    if stack.failure:
        result.checks.append(Check("stack stayed up", False, stack.failure))
    return result


def served_model(stack: LiveStack) -> str:
    from tandem.launcher import served_name

    return served_name(stack.model)


def _broken(scenario: Scenario, why: str) -> ScenarioResult:
    result = summarize(scenario.name, scenario.goal, [], 0.0, 0, 0.0)
    result.checks = [Check("ran", False, why)]
    return result
