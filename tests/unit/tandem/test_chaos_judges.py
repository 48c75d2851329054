"""Every chaos scenario's judge can fail: fed a made-up bad outcome it says so, fed a good one it passes (a fake
stack stands in for the processes, so only the judges' logic is under test)."""

import math
from dataclasses import dataclass, replace
from types import SimpleNamespace

import pytest

from tandem.chaos import scenarios as sc
from tandem.chaos.outcomes import COMPLETED, FAILED_CLEANLY, LEFT, LOST, ScenarioResult
from tandem.chaos.runner import Run
from tandem.chaos.stack import Shape

WORKERS = ("prefill-0", "decode-0", "decode-1", "decode-2")


@dataclass
class FakeStack:
    """What judges ask of a live stack: who is registered, the router's index, whether all is idle."""

    worker_ids: tuple[str, ...] = WORKERS
    indexed: dict | None = None
    held: dict | None = None  # blocks each worker holds by its own count (10 each when None)
    is_idle: bool = True
    shape: Shape = Shape()

    async def workers(self):
        return [SimpleNamespace(worker=SimpleNamespace(worker_id=w), quarantine_left_s=0.0) for w in self.worker_ids]

    async def router_metric(self, name: str) -> dict[str, float]:
        return self.indexed if self.indexed is not None else {f"decode-{i}": 10.0 for i in range(3)}

    async def worker_blocks(self, worker_id: str) -> float:
        return (self.held or {}).get(worker_id, 10.0)

    async def wait_ready(self, timeout_s: float = 60.0) -> bool:
        return self.is_idle


def result(
    counts: dict[str, int] | None = None,
    statuses: dict[str, int] | None = None,
    migrated: int = 3,
    recovery_s: float = 0.0,
    first_token_after_s: float = 0.3,
) -> ScenarioResult:
    full = {COMPLETED: 100, FAILED_CLEANLY: 0, LEFT: 0, LOST: 0, "corrupted": 0, "unclean": 0, **(counts or {})}
    return ScenarioResult(
        "s", "goal", 10.0, full, statuses or {"200": 100}, migrated, recovery_s, first_token_after_s, 64
    )


def run_with(stack: FakeStack | None = None, **facts) -> Run:
    return Run(stack or FakeStack(), load=None, facts=dict(facts))


async def verdict(judge, run: Run, res: ScenarioResult) -> bool:
    return all(c.ok for c in await judge(run, res)) and res.passed


async def test_kill_decode_fails_when_a_request_sent_after_the_kill_waits_too_long():
    good = result(first_token_after_s=0.4)
    assert await verdict(sc.judge_kill_decode, run_with(killed="decode-1"), good)
    # every request completed, so the old "failing for 0 s" measure would have passed this one
    assert not await verdict(sc.judge_kill_decode, run_with(killed="decode-1"), replace(good, first_token_after_s=1.7))
    never = replace(good, first_token_after_s=math.nan)  # no request sent after the kill was served
    assert not await verdict(sc.judge_kill_decode, run_with(killed="decode-1"), never)
    assert not await verdict(sc.judge_kill_decode, run_with(killed="decode-1"), replace(good, migrated=0))


async def test_kill_router_fails_when_routing_is_slow_to_come_back_or_the_index_is_empty():
    assert await verdict(sc.judge_kill_router, run_with(), result(first_token_after_s=2.0))
    assert not await verdict(sc.judge_kill_router, run_with(), result(first_token_after_s=6.0))
    empty = FakeStack(indexed={"decode-0": 5.0})
    assert not await verdict(sc.judge_kill_router, run_with(empty), result())
    # a worker that holds nothing has nothing to rebuild; one that holds blocks and is not indexed fails the run
    idle_worker = {"decode-0": 0.0, "decode-1": 7.0, "decode-2": 3.0}
    indexed = {"decode-1": 7.0, "decode-2": 3.0}
    assert await verdict(sc.judge_kill_router, run_with(FakeStack(indexed=indexed, held=idle_worker)), result())
    assert not await verdict(sc.judge_kill_router, run_with(FakeStack(indexed=indexed)), result())
    nobody = {"decode-0": 0.0, "decode-1": 0.0, "decode-2": 0.0}
    assert not await verdict(sc.judge_kill_router, run_with(FakeStack(indexed={}, held=nobody)), result())


async def test_kill_router_replica_fails_when_a_request_is_lost_or_failover_is_slow():
    assert await verdict(sc.judge_kill_replica, run_with(), result(first_token_after_s=0.2))
    assert not await verdict(sc.judge_kill_replica, run_with(), result({COMPLETED: 99, LOST: 1}))
    assert not await verdict(sc.judge_kill_replica, run_with(), result(first_token_after_s=2.5))


@pytest.mark.parametrize("judge", [sc.judge_kill_prefill, sc.judge_stop, sc.judge_slow, sc.judge_all_completed])
async def test_a_lost_request_fails_the_plain_judges(judge):
    assert await verdict(judge, run_with(), result())
    assert not await verdict(judge, run_with(), result({COMPLETED: 99, LOST: 1}))
    assert not await verdict(judge, run_with(), result({COMPLETED: 99, FAILED_CLEANLY: 1}))


async def test_a_stack_left_busy_fails_the_slow_client_judge():
    assert not await verdict(sc.judge_slow, run_with(FakeStack(is_idle=False)), result())


async def test_drain_fails_on_a_late_or_unclean_exit():
    assert await verdict(sc.judge_drain, run_with(exit_code=0, drain_s=4.0), result())
    assert not await verdict(sc.judge_drain, run_with(exit_code=0, drain_s=30.0), result())
    assert not await verdict(sc.judge_drain, run_with(exit_code=-9, drain_s=1.0), result())


async def test_storm_fails_when_its_clients_did_not_leave_or_others_failed():
    assert await verdict(sc.judge_storm, run_with(storm=10), result({COMPLETED: 90, LEFT: 10}))
    assert not await verdict(sc.judge_storm, run_with(storm=10), result({COMPLETED: 95, LEFT: 5}))
    assert not await verdict(sc.judge_storm, run_with(storm=10), result({COMPLETED: 89, LEFT: 10, FAILED_CLEANLY: 1}))


async def test_drop_fails_when_the_router_never_quarantined_the_worker():
    assert await verdict(sc.judge_drop, run_with(quarantined_after_s=0.1), result())
    assert not await verdict(sc.judge_drop, run_with(), result())


async def test_overload_fails_on_a_500_on_growing_memory_or_a_limit_never_hit():
    ok = {"200": 50, "429": 30, "503": 20}
    counts = {COMPLETED: 50, FAILED_CLEANLY: 50}
    assert await verdict(sc.judge_overload, run_with(rss_mb_start=100.0, rss_mb_end=105.0), result(counts, ok))
    assert not await verdict(sc.judge_overload, run_with(rss_mb_start=100.0, rss_mb_end=120.0), result(counts, ok))
    assert not await verdict(
        sc.judge_overload,
        run_with(rss_mb_start=100.0, rss_mb_end=100.0),
        result(counts, {"200": 50, "429": 30, "500": 20}),
    )
    assert not await verdict(
        sc.judge_overload, run_with(rss_mb_start=100.0, rss_mb_end=100.0), result(counts, {"200": 50, "429": 50})
    )


async def test_fuzz_fails_on_a_failure_or_too_few_cases():
    facts = dict(fuzz_budget=100, fuzz_cases=100, fuzz_statuses="{}", fuzz_failures=0, fuzz_examples="")
    assert await verdict(sc.judge_fuzz, run_with(**facts), result())
    assert not await verdict(sc.judge_fuzz, run_with(**{**facts, "fuzz_failures": 1, "fuzz_examples": "500"}), result())
    assert not await verdict(sc.judge_fuzz, run_with(**{**facts, "fuzz_cases": 40}), result())
