"""The `attacks` chaos scenario: quiet windows and attack windows alternate under one legitimate load (API keys,
per-key limits, mutual TLS); in each attack window an attacker process (attacker.py) runs every attack of issue 24
item 8 round after round. The verdict: every attack refused as a safe stack refuses it, the load lost nothing, and
its p50 TTFT in attack windows within 20% of the quiet windows'. Driving and judging only; attacks are attacker.py's.
"""

import asyncio
import json
import math
import statistics
import sys
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass

from services.common.identity import Identity
from tandem.certs import pki
from tandem.chaos.attacker import FLOOD_PREFIX
from tandem.chaos.client import Record
from tandem.chaos.outcomes import COMPLETED, Check, ScenarioResult
from tandem.chaos.runner import Run

MAX_TTFT_RATIO = 1.20  # the target: attacked p50 TTFT within 20% of the same run's quiet p50
TENANTS = ("sk-chaos-a", "sk-chaos-b", "sk-chaos-c", "sk-chaos-d")  # the legitimate load's keys
ATTACKER_KEYS = {"owner": "sk-chaos-owner", "prober": "sk-chaos-prober", "flood": "sk-chaos-flood"}
# every attack a round runs (the attacker's names): a round that skipped one fails the verdict
CATALOGUE = frozenset(
    {
        "no certificate (plaintext)",
        "no certificate (TLS)",
        "certificate from another CA",
        "gateway certificate calls Register",
        "worker registers another's id",
        "forged KV handle (tampered)",
        "KV handle from another key",
        "expired KV handle",
        "KV handle naming an unregistered address",
        "genuine KV handle (control)",
        "replayed KV handle",
        "cross-tenant cache probe",
        "oversize: max_tokens 2^32",
        "oversize: max_tokens 2^64",
        "oversize: stop string of 257 characters",
        "oversize: 17 stop strings",
        "oversize: messages past the cap",
        "oversize: n = 17",
    }
)


@dataclass(frozen=True, slots=True)
class Attempt:
    round: int
    name: str
    expected: str
    got: str

    @property
    def is_refused(self) -> bool:
        return self.got == self.expected


def phase_ttfts(
    records: Iterable[Record], windows: list[tuple[float, float]], since_s: float = -math.inf
) -> tuple[list[float], list[float]]:
    """TTFTs (s) of completed legitimate requests started at `since_s` or later (the load's ramp, every client at
    once, would weigh on the first quiet window alone), split by whether they started inside an attack window."""
    quiet, attacked = [], []
    for r in records:
        is_served = r.status == 200 and r.error is None and r.is_done and not math.isnan(r.first_token_s)
        if not is_served or r.start_s < since_s:
            continue
        inside = any(start <= r.start_s <= end for start, end in windows)
        (attacked if inside else quiet).append(r.first_token_s - r.start_s)
    return quiet, attacked


def judge(
    attempts: list[Attempt], result: ScenarioResult, quiet: list[float], attacked: list[float], enforce_latency: bool
) -> list[Check]:
    """Pure: the attacks' outcomes and the load's, in; the checks out. The latency check joins the verdict only at
    full size (a timed assertion has no place in `make test`); the short run reports the ratio in its facts."""
    let_through = [f"{a.name}: {a.got} (expected {a.expected})" for a in attempts if not a.is_refused]
    rounds = sorted({a.round for a in attempts})
    missing = sorted(CATALOGUE - {a.name for a in attempts})
    num_floods = sum(a.name.startswith(FLOOD_PREFIX) for a in attempts)
    done = result.counts[COMPLETED]
    checks = [
        Check(
            "every attack refused with the right status",
            bool(attempts) and not let_through,
            "; ".join(let_through[:6]) or f"{len(attempts)} attempts in {len(rounds)} rounds",
        ),
        Check(
            "every attack of the catalogue ran",
            bool(rounds) and not missing and num_floods >= len(rounds),
            f"missing: {', '.join(missing)}" if missing else f"{len(CATALOGUE) + 1} kinds, {len(rounds)} rounds",
        ),
        Check(
            "the legitimate load lost nothing (every request completed)",
            done == result.sent and done > 0,
            f"{done} of {result.sent}",
        ),
        Check(
            "requests ran in both phases",
            bool(quiet) and bool(attacked),
            f"{len(quiet)} quiet, {len(attacked)} under attack",
        ),
    ]
    if enforce_latency:
        ratio = ttft_ratio(quiet, attacked)
        checks.append(
            Check(
                f"p50 TTFT under attack within {MAX_TTFT_RATIO - 1:.0%} of quiet",
                ratio <= MAX_TTFT_RATIO,
                f"ratio {ratio:.3f}",
            )
        )
    return checks


def ttft_ratio(quiet: list[float], attacked: list[float]) -> float:
    """Attacked p50 over quiet p50; NaN (which fails any bound) when a phase has no request."""
    if not quiet or not attacked:
        return math.nan
    return statistics.median(attacked) / statistics.median(quiet)


class AttackerProcess:
    """attacker.py in its own process, one round per request."""

    def __init__(self, target: dict):
        self.target = target
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tandem.chaos.attacker",
            json.dumps(self.target),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )

    async def round(self, tag: int) -> list[Attempt]:
        self.proc.stdin.write(f"round {tag}\n".encode())
        await self.proc.stdin.drain()
        out = []
        while line := await self.proc.stdout.readline():
            doc = json.loads(line)
            if "done" in doc:
                return out
            out.append(Attempt(tag, doc["name"], doc["expected"], doc["got"]))
        return out + [Attempt(tag, "the attacker ran its round", "yes", f"it exited ({self.proc.returncode})")]

    async def stop(self, timeout_s: float = 60.0) -> None:
        """EOF ends it after its round; one stuck past `timeout_s` is killed (it is ours alone)."""
        if self.proc is not None and self.proc.returncode is None:
            self.proc.stdin.close()
            try:
                await asyncio.wait_for(self.proc.wait(), timeout_s)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()


async def target_of(run: Run) -> dict:
    """What the attacker is handed: addresses, certificate files (a stolen gateway's and decode-0's, one from a
    rogue CA, the CA alone), the deployment's KV key file and its API keys."""
    stack, shape = run.stack, run.stack.shape
    addresses = {w.worker.worker_id: w.worker.address for w in await stack.workers()}
    stack_pki = stack.stack.pki
    rogue_dir = stack.log_dir / "rogue-pki"
    rogue = pki.write_identity(rogue_dir, pki.new_authority("rogue"), Identity("gateway", "gateway-rogue"))
    tls = {
        "gateway": stack_pki.tls_of(Identity("gateway", "gateway-attacker")),
        "decode-0": stack_pki.tls_of(Identity("decode", "decode-0")),
    }
    files = {name: {"cert": t.cert, "key": t.key, "ca": t.ca, "client_auth": True} for name, t in tls.items()}
    files["rogue"] = {"cert": str(rogue.cert), "key": str(rogue.key), "ca": str(stack_pki.directory / pki.CA_CERT)}
    files["ca-only"] = {"ca": str(stack_pki.directory / pki.CA_CERT)}
    return {
        "url": stack.url,
        "model": served(stack),
        "router": f"127.0.0.1:{stack.stack.router_port}",
        "prefill": addresses["prefill-0"],
        "decode": addresses["decode-0"],
        "tls": files,
        "kv_key": str(stack_pki.kv_key),
        "keys": ATTACKER_KEYS,
        "max_inflight_per_key": shape.max_inflight_per_key,
        "max_prompt_chars": shape.max_prompt_chars,
    }


def served(stack) -> str:
    from tandem.launcher import served_name

    return served_name(stack.model)


def alternate(window_s: float, num_windows: int):
    """Quiet, attack, quiet, attack, ..., quiet: each attack window runs rounds until it has lasted `window_s`."""

    async def fault(run: Run) -> None:
        run.facts["ramp_s"] = window_s / 2  # requests started earlier are in neither phase
        attacker = AttackerProcess(await target_of(run))
        await attacker.start()
        attempts, windows = [], []
        try:
            for w in range(num_windows):
                await run.at((2 * w + 1) * window_s)
                start = run.note(f"attack window {w}")
                while True:
                    attempts += await attacker.round(len({a.round for a in attempts}))
                    if time.monotonic() - start >= window_s:
                        break
                windows.append((start, run.note(f"attack window {w} over")))
        finally:
            await attacker.stop()
        run.facts["attack_windows_s"] = json.dumps([(round(a - run.t0, 3), round(b - run.t0, 3)) for a, b in windows])
        run.facts["attempts"] = json.dumps([asdict(a) for a in attempts])

    return fault


def judge_attacks(enforce_latency: bool):
    async def judge_run(run: Run, result: ScenarioResult) -> list[Check]:
        windows = [(run.t0 + a, run.t0 + b) for a, b in json.loads(run.facts.get("attack_windows_s", "[]"))]
        attempts = [Attempt(**a) for a in json.loads(run.facts.get("attempts", "[]"))]
        quiet, attacked = phase_ttfts((r for r, _ in run.load.records), windows, run.t0 + run.facts.get("ramp_s", 0))
        ratio = ttft_ratio(quiet, attacked)
        run.facts.update(
            ttft_p50_quiet_ms=_p50_ms(quiet),
            ttft_p50_attacked_ms=_p50_ms(attacked),
            ttft_ratio=round(ratio, 4),
            num_quiet=len(quiet),
            num_attacked=len(attacked),
            num_attempts=len(attempts),
        )
        result.facts.update(run.facts)
        return judge(attempts, result, quiet, attacked, enforce_latency)

    return judge_run


def _p50_ms(values: list[float]) -> float:
    return round(statistics.median(values) * 1000, 2) if values else math.nan
