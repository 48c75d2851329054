"""The chaos scenarios: for each, its stack, its load, the faults it injects while the load runs, and what must hold
afterwards beyond "nothing lost". Full sizes meet the issue's targets (>= 200 requests in flight); `short` ones run
the same faults in seconds (what `make test` runs).

Scripts and checks only: processes are stack.py's, verdicts outcomes.py's.
"""

import asyncio
import json
import signal
import time
from dataclasses import replace

from tandem.chaos.attacks import ATTACKER_KEYS, TENANTS, alternate, judge_attacks
from tandem.chaos.client import NORMAL, Behaviour
from tandem.chaos.load import Load
from tandem.chaos.outcomes import COMPLETED, FAILED_CLEANLY, LEFT, Check, ScenarioResult
from tandem.chaos.runner import Run, Scenario
from tandem.chaos.stack import Shape

COMMON = Shape()  # 1 prefill, 3 decode (decode-2 behind the proxy): every scenario but overload shares it
OVERLOAD = Shape(num_prefill=0, num_decode=2, proxied=(), max_num_seqs=32, max_inflight=192)
# tokens at once and a short context: many cases in little time
FUZZ = Shape(engine="zero", num_prefill=0, num_decode=1, proxied=(), max_model_len=1024)
REPLICAS = Shape(num_routers=2)  # COMMON's workers behind two router replicas
# API keys with per-key limits, mutual TLS (the default): the legitimate load's keys and the attacker's
ATTACKS = Shape(num_decode=2, proxied=(), api_keys=(*TENANTS, *ATTACKER_KEYS.values()), max_prompt_chars=20000)
PROBES = 8  # requests sent the moment a fault (or the restart it waits for) happens, beside the closed loop
MAX_RECOVERY_S = {"kill-decode": 1.0, "kill-router": 5.0, "kill-router-replica": 1.0}  # the targets


def all_completed(result: ScenarioResult) -> Check:
    done = result.counts[COMPLETED]
    return Check("every request completed", done == result.sent, f"{done} of {result.sent}")


def first_token_within(result: ScenarioResult, limit_s: float) -> Check:
    """A request sent after the fault had its first token within `limit_s` of the fault. NOTE: measured on requests
    started after it, not on failures (a run where every request completes late must still fail); none served: NaN,
    which fails too."""
    waited_s = result.first_token_after_s
    return Check(
        f"a request sent after the fault has its first token within {limit_s:.0f} s",
        waited_s <= limit_s,
        f"first token {waited_s:.2f} s after; new requests failing for {result.recovery_s:.2f} s",
    )


def served_again(result: ScenarioResult, limit_s: float) -> Check:
    return Check(
        f"routing back within {limit_s:.0f} s",
        result.first_token_after_s <= limit_s,
        f"first token {result.first_token_after_s:.2f} s after; failing for {result.recovery_s:.2f} s",
    )


def migrated(result: ScenarioResult) -> Check:
    return Check("requests migrated", result.migrated >= 1, f"{result.migrated}")


async def rejoined(run: Run, worker_id: str, timeout_s: float = 30.0) -> Check:
    """`worker_id` is back in the router's pool (registered again) within `timeout_s` after the load."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        try:
            if worker_id in {w.worker.worker_id for w in await run.stack.workers()}:
                waited_s = time.monotonic() - started
                return Check(f"{worker_id} back in the pool", True, f"{waited_s:.1f} s after the load")
        except Exception:  # noqa: BLE001 - the router may be restarting
            pass
        await asyncio.sleep(0.25)
    return Check(f"{worker_id} back in the pool", False, f"not within {timeout_s:.0f} s")


# -- faults and checks, scenario by scenario -------------------------------------------------------------------------
def kill(name: str, at_s: float):
    async def fault(run: Run) -> None:
        await run.at(at_s)
        run.since_s = run.note(f"SIGKILL {name}")
        run.stack.signal(name, signal.SIGKILL)

    return fault


async def in_flight(run: Run, prefix: str) -> dict[str, int]:
    """Requests the router has on each worker whose id starts with `prefix`."""
    return {
        w.worker.worker_id: w.num_inflight for w in await run.stack.workers() if w.worker.worker_id.startswith(prefix)
    }


async def mid_stream(run: Run, prefix: str, timeout_s: float = 15.0) -> None:
    """Until some worker named `prefix...` has been running requests for a second: a closed-loop load moves in waves,
    and a fault at a wave's start would find no stream with a token yet (routed around, not migrated)."""
    deadline, since = time.monotonic() + timeout_s, None
    while time.monotonic() < deadline:
        running = any(w.load.num_running for w in await run.stack.workers() if w.worker.worker_id.startswith(prefix))
        since = (since or time.monotonic()) if running else None
        if since is not None and time.monotonic() - since >= 1.0:
            return
        await asyncio.sleep(0.1)


def kill_busiest(prefix: str, at_s: float):
    """SIGKILL, mid-stream, the worker holding the most requests (KV-aware routing may leave one idle)."""

    async def fault(run: Run) -> None:
        await run.at(at_s)
        await mid_stream(run, prefix)
        load = await in_flight(run, prefix)
        name = max(sorted(load), key=load.get)
        run.facts.update(killed=name, killed_in_flight=load[name])
        run.since_s = run.note(f"SIGKILL {name} ({load[name]} requests on it)")
        run.stack.signal(name, signal.SIGKILL)
        run.load.burst(PROBES, NORMAL)  # new requests at once: how soon are they served?

    return fault


async def judge_kill_decode(run: Run, result: ScenarioResult) -> list[Check]:
    return [
        all_completed(result),
        migrated(result),
        first_token_within(result, MAX_RECOVERY_S["kill-decode"]),
        await rejoined(run, run.facts["killed"]),
    ]


async def judge_kill_prefill(run: Run, result: ScenarioResult) -> list[Check]:
    return [all_completed(result), await rejoined(run, "prefill-0")]


def kill_router(at_s: float):
    async def fault(run: Run) -> None:
        await run.at(at_s)
        killed = run.note("SIGKILL router")
        run.stack.signal("router", signal.SIGKILL)
        while not [t for t, name in run.stack.restarts if name == "router" and t > killed]:
            await asyncio.sleep(0.05)
        run.since_s = run.note("router started again")
        run.load.burst(PROBES, NORMAL)
        run.facts["router_down_s"] = round(run.since_s - killed, 2)

    return fault


async def judge_kill_router(run: Run, result: ScenarioResult) -> list[Check]:
    checks = [served_again(result, MAX_RECOVERY_S["kill-router"])]
    for worker_id in ("prefill-0", "decode-0", "decode-1", "decode-2"):
        checks.append(await rejoined(run, worker_id))
    # NOTE: a worker restarted by an earlier scenario may hold no blocks at all (the kv policy sends the load to the
    # workers holding its prefixes), and then it has nothing to rebuild: every worker that holds blocks must be indexed
    indexed = await run.stack.router_metric("tandem_router_kv_index_blocks")
    held = {w: await run.stack.worker_blocks(w) for w in ("decode-0", "decode-1", "decode-2")}
    holders = [w for w, blocks in held.items() if blocks > 0]
    rebuilt = bool(holders) and all(indexed.get(w, 0) > 0 for w in holders)
    checks.append(Check("KV index rebuilt from the workers' snapshots", rebuilt, f"indexed {indexed}; held {held}"))
    return checks


def kill_replica(name: str, at_s: float):
    async def fault(run: Run) -> None:
        await run.at(at_s)
        run.since_s = run.note(f"SIGKILL {name} (one of the router replicas)")
        run.stack.signal(name, signal.SIGKILL)
        run.load.burst(PROBES, NORMAL)  # new requests at once: the gateway must fail over, not wait

    return fault


async def judge_kill_replica(run: Run, result: ScenarioResult) -> list[Check]:
    return [all_completed(result), first_token_within(result, MAX_RECOVERY_S["kill-router-replica"])]


def stop_and_continue(name: str, at_s: float, stop_s: float):
    async def fault(run: Run) -> None:
        await run.at(at_s)
        run.since_s = run.note(f"SIGSTOP {name}")
        run.stack.signal(name, signal.SIGSTOP)
        await run.at(at_s + stop_s)
        run.note(f"SIGCONT {name}")
        run.stack.signal(name, signal.SIGCONT)

    return fault


async def judge_stop(run: Run, result: ScenarioResult) -> list[Check]:
    return [all_completed(result), await rejoined(run, "decode-1")]


def drain(name: str, at_s: float):
    async def fault(run: Run) -> None:
        await run.at(at_s)
        run.since_s = run.note(f"SIGTERM {name}")
        code, seconds = await run.stack.terminate(name)
        run.note(f"{name} exited with code {code}")
        run.facts.update(exit_code=code, drain_s=round(seconds, 2))

    return fault


async def judge_drain(run: Run, result: ScenarioResult) -> list[Check]:
    limit_s = run.stack.shape.drain_s + 4.0  # the drain, the settle before it, the hand-back's grace
    return [
        all_completed(result),
        migrated(result),
        Check(
            "the worker exited 0 within its drain deadline",
            run.facts.get("exit_code") == 0 and run.facts.get("drain_s", 1e9) <= limit_s,
            f"code {run.facts.get('exit_code')} after {run.facts.get('drain_s')} s (limit {limit_s:.0f} s)",
        ),
        await rejoined(run, "decode-0"),
    ]


async def no_fault(run: Run) -> None:
    return None


async def judge_slow(run: Run, result: ScenarioResult) -> list[Check]:
    return [all_completed(result), await idle(run)]


def storm(at_s: float, n: int):
    async def fault(run: Run) -> None:
        await run.at(at_s)
        run.since_s = run.note(f"{n} clients hang up after 2 events")
        run.load.burst(n, Behaviour(kind="leave", leave_after=2))
        run.facts["storm"] = n

    return fault


async def judge_storm(run: Run, result: ScenarioResult) -> list[Check]:
    left = result.counts[LEFT]
    return [
        Check("the storm's clients left", left == run.facts["storm"], f"{left}"),
        Check(
            "everyone else completed",
            result.counts[COMPLETED] == result.sent - left,
            f"{result.counts[COMPLETED]} of {result.sent - left}",
        ),
        await idle(run),
    ]


async def idle(run: Run) -> Check:
    """Nothing left running anywhere: the work of clients that left (or stalled and came back) was stopped."""
    started = time.monotonic()
    is_idle = await run.stack.wait_ready(timeout_s=15)
    return Check("the stack is idle again", is_idle, f"{time.monotonic() - started:.1f} s after the load")


def proxy_delay(name: str, delay_s: float):
    async def fault(run: Run) -> None:
        run.note(f"{delay_s * 1000:.0f} ms added to every read between the stack and {name}")
        run.stack.proxies[name].delay_s = delay_s
        await run.at(run.load.load.duration_s)
        run.stack.proxies[name].delay_s = 0.0

    return fault


async def judge_all_completed(run: Run, result: ScenarioResult) -> list[Check]:
    return [all_completed(result)]


def proxy_drop(name: str, at_s: float):
    async def fault(run: Run) -> None:
        await run.at(at_s)
        await mid_stream(run, name)
        run.since_s = run.note(f"the proxy resets every connection to {name} and refuses new ones for 2 s")
        run.facts["connections_dropped"] = run.stack.proxies[name].drop(refuse_s=2.0)
        for _ in range(40):
            left = {w.worker.worker_id: w.quarantine_left_s for w in await run.stack.workers()}.get(name, 0.0)
            if left > 0:
                run.facts["quarantined_after_s"] = round(time.monotonic() - run.since_s, 2)
                return
            await asyncio.sleep(0.05)

    return fault


async def judge_drop(run: Run, result: ScenarioResult) -> list[Check]:
    return [
        all_completed(result),
        migrated(result),
        Check(
            "the router quarantined it at once",
            "quarantined_after_s" in run.facts,
            f"{run.facts.get('quarantined_after_s', 'never')} s",
        ),
    ]


def overload(duration_s: float):
    async def fault(run: Run) -> None:
        await run.at(duration_s / 4)
        run.facts["rss_mb_start"] = round(run.stack.rss_bytes() / 2**20, 1)
        await run.at(duration_s - 0.5)
        run.facts["rss_mb_end"] = round(run.stack.rss_bytes() / 2**20, 1)

    return fault


async def judge_overload(run: Run, result: ScenarioResult) -> list[Check]:
    others = {s: n for s, n in result.statuses.items() if s not in ("200", "429", "503")}
    growth = run.facts["rss_mb_end"] / run.facts["rss_mb_start"] - 1
    run.facts["rss_growth"] = round(growth, 4)
    return [
        Check("only 200, 429 and 503 answers", not others, f"{result.statuses}"),
        Check(
            "both limits were hit (429 and 503)",
            "429" in result.statuses and "503" in result.statuses,
            f"{result.statuses}",
        ),
        Check(
            "admitted requests completed",
            result.counts[FAILED_CLEANLY] == sum(n for s, n in result.statuses.items() if s != "200"),
            "no stream failed once it had started",
        ),
        Check(
            "memory flat (RSS growth <= 10%)",
            growth <= 0.10,
            f"{run.facts['rss_mb_start']} -> {run.facts['rss_mb_end']} MiB ({growth:+.1%})",
        ),
    ]


def fuzz(cases: int):
    async def fault(run: Run) -> None:
        from tandem.chaos.fuzz import fuzz as run_fuzz

        run.note(f"schemathesis: {cases} cases from /openapi.json")
        found = await asyncio.to_thread(run_fuzz, run.stack.url, cases)
        statuses = json.dumps(dict(sorted(found.statuses.items())))
        run.facts.update(
            fuzz_budget=cases,
            fuzz_cases=found.cases,
            fuzz_statuses=statuses,
            fuzz_failures=found.num_failures,
            fuzz_examples=" | ".join(found.failures[:5]),
        )

    return fault


async def judge_fuzz(run: Run, result: ScenarioResult) -> list[Check]:
    f = run.facts
    return [
        Check(
            f"at least {f['fuzz_budget']} cases",
            f["fuzz_cases"] >= f["fuzz_budget"],
            f"{f['fuzz_cases']}: {f['fuzz_statuses']}",
        ),
        Check(
            "no 5xx, every answer as documented",
            f["fuzz_failures"] == 0,
            f"{f['fuzz_failures']} failed{': ' + f['fuzz_examples'] if f['fuzz_examples'] else ''}",
        ),
        await idle(run),
    ]


def build(short: bool, fuzz_cases: int | None = None) -> list[Scenario]:
    """Every scenario, in the order they run."""
    d, at, conc = (8.0, 3.0, 64) if short else (20.0, 6.0, 256)
    base = Load(concurrency=conc, duration_s=d)
    stop_s = 6.0 if short else 15.0
    storm_n = 64 if short else 200
    overload_s = 12.0 if short else 60.0
    fuzz_cases = fuzz_cases if fuzz_cases is not None else 100 if short else 1000
    # attacks: quiet and attack windows alternate; the legitimate load stays under each key's limit
    window_s, windows, attack_conc, per_key = (4.0, 2, 16, 8) if short else (10.0, 3, 128, 40)
    return [
        Scenario(
            "proxy-delay",
            "100% complete through a proxy adding 50 ms to every read",
            COMMON,
            base,
            proxy_delay("decode-2", 0.05),
            judge_all_completed,
        ),
        Scenario(
            "proxy-drop",
            "100% complete (migrated) when a proxy resets every connection to a worker",
            COMMON,
            base,
            proxy_drop("decode-2", at),
            judge_drop,
        ),
        Scenario(
            "kill-decode",
            "SIGKILL one decode worker mid-load: 100% complete (migrated), a request sent "
            "after the kill has its first token within 1 s",
            COMMON,
            base,
            kill_busiest("decode-", at),
            judge_kill_decode,
        ),
        Scenario(
            "kill-prefill",
            "SIGKILL the prefill worker: 100% complete, 0 lost",
            COMMON,
            replace(base, isl=768),
            kill("prefill-0", at),
            judge_kill_prefill,
        ),
        Scenario(
            "drain-decode",
            "SIGTERM a decode worker: 100% complete, it exits 0 within its drain deadline",
            COMMON,
            replace(base, osl=256, duration_s=d + 4),
            drain("decode-0", at),
            judge_drain,
        ),
        Scenario(
            "stop-worker",
            f"SIGSTOP a worker {stop_s:.0f} s (past its lease): 0 lost, its requests migrate or finish after SIGCONT",
            COMMON,
            replace(base, duration_s=at + stop_s + 4),
            stop_and_continue("decode-1", at, stop_s),
            judge_stop,
        ),
        Scenario(
            "slow-client",
            "slow and stalled readers beside the load: 0 lost, the rest unaffected",
            COMMON,
            replace(base, extra=((16, Behaviour("slow", read_delay_s=0.05)), (8, Behaviour("stall", stall_s=at + 1)))),
            no_fault,
            judge_slow,
        ),
        Scenario(
            "disconnect-storm",
            f"{storm_n} clients hang up mid-stream at once: their work stops, the rest completes",
            COMMON,
            base,
            storm(at, storm_n),
            judge_storm,
        ),
        Scenario(
            "kill-router",
            "SIGKILL the router, then it restarts: 0 lost, routing back within 5 s of its restart",
            COMMON,
            base,
            kill_router(at),
            judge_kill_router,
        ),
        Scenario(
            "kill-router-replica",
            "SIGKILL one of two router replicas mid-load: 0 lost, a request sent after "
            "the kill has its first token within 1 s",
            REPLICAS,
            base,
            kill_replica("router-1", at),
            judge_kill_replica,
        ),
        Scenario(
            "overload",
            f"2x overload for {overload_s:.0f} s: only 429/503 with Retry-After, admitted "
            "requests complete, RSS growth <= 10%",
            OVERLOAD,
            Load(concurrency=2 * OVERLOAD.max_inflight, duration_s=overload_s),
            overload(overload_s),
            judge_overload,
        ),
        Scenario(
            "attacks",
            f"every attack of issue 24 refused in {windows} attack windows between quiet ones, "
            "the legitimate load loses nothing, p50 TTFT under attack within 20% of quiet",
            replace(ATTACKS, max_inflight_per_key=per_key),
            Load(concurrency=attack_conc, duration_s=(2 * windows + 1) * window_s, api_keys=TENANTS),
            alternate(window_s, windows),
            judge_attacks(enforce_latency=not short),
        ),
        Scenario(
            "fuzz",
            f"schemathesis, {fuzz_cases} cases: no 5xx, every answer a documented status and body",
            FUZZ,
            Load(concurrency=0, duration_s=0.0),
            fuzz(fuzz_cases),
            judge_fuzz,
        ),
    ]
