"""`tandem bench overhead`'s report: the targets checked against one run's phases, the table, the host it ran on.
Arithmetic and formatting only; overhead.py runs the phases."""

import os
import re
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tandem.bench.serve_report import format_rows, ms, rate
from tandem.bench.serve_stats import ServeSummary

# added TTFT p50 targets by concurrency, relay and scale-out targets (the numbers)
TTFT_TARGETS_S = {1: 0.003, 16: 0.015}
MIN_RELAY_TOKENS_PER_S = 20_000.0
MIN_SCALE_OUT = 1.6
# what mutual TLS and per-method authorization may cost against the same stack in plaintext (issue 24)
MAX_MTLS_TTFT_S = 0.002
MIN_MTLS_RELAY_RATIO = 0.95


@dataclass(slots=True)
class Phase:
    """One load at one concurrency: in-process (gateway_workers 0) or through a stack with that many gateways."""

    concurrency: int
    gateway_workers: int
    summary: ServeSummary
    load_avg: tuple[float, float] = (0.0, 0.0)  # 1-minute load average at its start and its end
    cpu_s: dict[str, float] = field(default_factory=dict)  # process (or "client") -> CPU seconds during it
    is_plaintext: bool = False  # a stack run with TANDEM_GRPC_INSECURE=1 (the default stack runs mutual TLS)
    security_round: int = -1  # --security-rounds: which round (its plaintext side also signs no KV handle)
    # service -> TCP connections opened to its gRPC port during the phase (on a secure stack each is a handshake)
    grpc_connections_opened: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {**asdict(self), "summary": self.summary.as_dict()}

    def cpu_us_per_token(self) -> dict[str, float]:
        tokens = max(1, self.summary.num_output_tokens)
        return {name: 1e6 * s / tokens for name, s in self.cpu_s.items()}


def host_info() -> dict:
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = re.search(r"^model name\s*:\s*(.+)$", cpuinfo, re.M)
    flags = sorted(set(re.findall(r"\b(avx2|avx512[a-z]*)\b", cpuinfo)))
    return {"cpu": model.group(1) if model else "?", "cores": os.cpu_count(), "flags": flags}


def _find(phases: list[Phase], concurrency: int, workers: int, is_plaintext: bool = False) -> Phase | None:
    return next(
        (
            p
            for p in phases
            if p.concurrency == concurrency
            and p.gateway_workers == workers
            and p.is_plaintext == is_plaintext
            and p.security_round < 0
        ),
        None,
    )


def check_targets(phases: list[Phase]) -> list[dict]:
    """Each target the phases can judge: name, measured value, target, whether it is met."""
    results = []
    for c, target in TTFT_TARGETS_S.items():
        a, b = _find(phases, c, 0), _find(phases, c, 1)
        if a and b:
            added = b.summary.ttft_s.p50 - a.summary.ttft_s.p50
            results.append(_result(f"added TTFT p50, concurrency {c}", added, target, added <= target, "s"))
    top = max((p.concurrency for p in phases), default=0)
    one = _find(phases, top, 1)
    if one is not None:
        relay = one.summary.output_tokens_per_s
        results.append(
            _result(
                f"relay, concurrency {top}, 1 gateway",
                relay,
                MIN_RELAY_TOKENS_PER_S,
                relay >= MIN_RELAY_TOKENS_PER_S,
                "tokens/s",
            )
        )
    for p in phases:
        if one is not None and p.concurrency == top and p.gateway_workers > 1:
            ratio = p.summary.output_tokens_per_s / max(one.summary.output_tokens_per_s, 1e-9)
            results.append(
                _result(
                    f"relay {p.gateway_workers} gateways / 1, concurrency {top}",
                    ratio,
                    MIN_SCALE_OUT,
                    ratio >= MIN_SCALE_OUT,
                    "x",
                )
            )
    return results + _mtls_targets(phases, top)


def _rounds_targets(rounds: list[Phase]) -> list[dict]:
    """Secure against baseline over alternated rounds: the median of each side's TTFT p50 at the lowest concurrency
    and of its relay at the highest (a median resists a load spike that hit one round)."""
    low, top = min(p.concurrency for p in rounds), max(p.concurrency for p in rounds)

    def median(concurrency: int, is_plaintext: bool, value) -> float:
        return statistics.median(
            value(p) for p in rounds if p.concurrency == concurrency and p.is_plaintext == is_plaintext
        )

    added = median(low, False, lambda p: p.summary.ttft_s.p50) - median(low, True, lambda p: p.summary.ttft_s.p50)
    ratio = median(top, False, lambda p: p.summary.output_tokens_per_s) / max(
        median(top, True, lambda p: p.summary.output_tokens_per_s), 1e-9
    )
    num = len({p.security_round for p in rounds})
    return [
        _result(
            f"mTLS + signed handles added TTFT p50, concurrency {low}, median of {num} rounds",
            added,
            MAX_MTLS_TTFT_S,
            added <= MAX_MTLS_TTFT_S,
            "s",
        ),
        _result(
            f"mTLS + signed handles relay / baseline, concurrency {top}, median of {num} rounds",
            ratio,
            MIN_MTLS_RELAY_RATIO,
            ratio >= MIN_MTLS_RELAY_RATIO,
            "x",
        ),
    ]


def _mtls_targets(phases: list[Phase], top: int) -> list[dict]:
    """mTLS against plaintext, one gateway: added TTFT p50 at the lowest concurrency, relay at the highest."""
    rounds = [p for p in phases if p.security_round >= 0]
    if rounds:
        return _rounds_targets(rounds)
    plain = [p for p in phases if p.is_plaintext]
    if not plain:
        return []
    results = []
    low = min(p.concurrency for p in plain)
    a, b = _find(phases, low, 1, True), _find(phases, low, 1)
    if a and b:
        added = b.summary.ttft_s.p50 - a.summary.ttft_s.p50
        results.append(
            _result(f"mTLS added TTFT p50, concurrency {low}", added, MAX_MTLS_TTFT_S, added <= MAX_MTLS_TTFT_S, "s")
        )
    a, b = _find(phases, top, 1, True), _find(phases, top, 1)
    if a and b:
        ratio = b.summary.output_tokens_per_s / max(a.summary.output_tokens_per_s, 1e-9)
        results.append(
            _result(
                f"mTLS relay / plaintext, concurrency {top}",
                ratio,
                MIN_MTLS_RELAY_RATIO,
                ratio >= MIN_MTLS_RELAY_RATIO,
                "x",
            )
        )
    return results


def paired_rounds(phases: list[Phase]) -> list[dict]:
    """Each round's secure side against the baseline run next to it: added TTFT p50 at the lowest concurrency, relay
    ratio and stack CPU per token at the highest. The spread of these pairs says how far the medians can be trusted."""
    rounds = [p for p in phases if p.security_round >= 0]
    if not rounds:
        return []
    low, top = min(p.concurrency for p in rounds), max(p.concurrency for p in rounds)
    side = {(p.security_round, p.concurrency, p.is_plaintext): p for p in rounds}
    pairs = []
    for r in sorted({p.security_round for p in rounds}):
        secure, plain = side.get((r, top, False)), side.get((r, top, True))
        slow, fast = side.get((r, low, False)), side.get((r, low, True))
        if not (secure and plain and slow and fast):
            continue
        pairs.append(
            {
                "round": r,
                "added_ttft_p50_s": slow.summary.ttft_s.p50 - fast.summary.ttft_s.p50,
                "relay_ratio": secure.summary.output_tokens_per_s / max(plain.summary.output_tokens_per_s, 1e-9),
                "stack_cpu_us_per_token": [_stack_cpu_us(secure), _stack_cpu_us(plain)],
                "duration_s": [secure.summary.duration_s, plain.summary.duration_s],
                "grpc_connections_opened": [
                    sum(secure.grpc_connections_opened.values()),
                    sum(plain.grpc_connections_opened.values()),
                ],
            }
        )
    return pairs


def _stack_cpu_us(p: Phase) -> float:
    services = sum(s for name, s in p.cpu_s.items() if name != "client")
    return 1e6 * services / max(1, p.summary.num_output_tokens)


def _result(name: str, value: float, target: float, is_met: bool, unit: str) -> dict:
    return {"name": name, "value": value, "target": target, "is_met": is_met, "unit": unit}


def build_report(config: dict, phases: list[Phase], host: dict | None = None) -> dict:
    report = {
        "benchmark": "overhead",
        "config": config,
        "host": host or host_info(),
        "phases": [p.as_dict() for p in phases],
        "targets": check_targets(phases),
    }
    pairs = paired_rounds(phases)
    return {**report, "rounds": pairs} if pairs else report


def format_overhead(report: dict) -> str:
    cfg, host = report["config"], report["host"]
    head = (
        f"isl {cfg['isl']}, osl {cfg['osl']}, closed loop; {cfg['num_prefill']} prefill + 1 decode zero-engine "
        f"worker; host {host['cores']} cores ({', '.join(host['flags']) or 'no AVX2'}), {host['cpu']}"
    )
    return "\n\n".join(
        t
        for t in [
            head,
            _phase_table(report["phases"]),
            _target_table(report["targets"]),
            _rounds_table(report.get("rounds", [])),
            _cpu_table(report["phases"]),
        ]
        if t
    )


def _phase_table(phases: list[dict]) -> str:
    rows = []
    for p in phases:
        s = p["summary"]
        where = "in-process" if p["gateway_workers"] == 0 else f"stack, {p['gateway_workers']} gateway" + _side(p)
        rows.append(
            (
                where,
                str(p["concurrency"]),
                str(s["num_requests"]),
                ms(s["ttft_s"]["p50"]),
                ms(s["ttft_s"]["p99"]),
                ms(s["itl_s"]["p50"]),
                rate(s["output_tokens_per_s"]),
                rate(s["requests_per_s"]),
                str(s["num_errors"]),
                "{:.1f}-{:.1f}".format(*p["load_avg"]),
            )
        )
    return format_rows(
        (
            "phase",
            "conc",
            "reqs",
            "TTFT p50 ms",
            "TTFT p99 ms",
            "ITL p50 ms",
            "tokens/s",
            "req/s",
            "errors",
            "load avg",
        ),
        rows,
    )


def _side(p: dict) -> str:
    side = ", plaintext" if p.get("is_plaintext") else ""
    r = p.get("security_round", -1)
    return side if r < 0 else f"{side or ', secure'}, round {r}"


def _target_table(targets: list[dict]) -> str:
    def show(value: float, unit: str) -> str:
        return ms(value) + " ms" if unit == "s" else (f"{value:.2f}x" if unit == "x" else rate(value))

    def bound(t: dict) -> str:
        return ("<= " if t["unit"] == "s" else ">= ") + show(t["target"], t["unit"])

    rows = [(t["name"], show(t["value"], t["unit"]), bound(t), "yes" if t["is_met"] else "NO") for t in targets]
    return format_rows(("target", "measured", "target", "met"), rows)


def _cpu_table(phases: list[dict]) -> str:
    through = [p for p in phases if p["gateway_workers"] > 0 and p["cpu_s"]]
    names = sorted({n for p in through for n in p["cpu_s"]})
    rows = []
    for p in through:
        tokens = max(1, p["summary"]["num_output_tokens"])
        rows.append(
            (
                f"c{p['concurrency']}, {p['gateway_workers']} gateway" + _side(p),
                *(f"{1e6 * p['cpu_s'].get(n, 0.0) / tokens:.1f}" for n in names),
            )
        )
    return "CPU µs per streamed token, by process\n" + format_rows(("phase", *names), rows) if rows else ""


def _rounds_table(pairs: list[dict]) -> str:
    if not pairs:
        return ""
    rows = [
        (
            str(q["round"]),
            ms(q["added_ttft_p50_s"]),
            f"{q['relay_ratio']:.3f}x",
            "{:.0f} / {:.0f}".format(*q["stack_cpu_us_per_token"]),
            "{:.1f} / {:.1f}".format(*q["duration_s"]),
            "{} / {}".format(*q.get("grpc_connections_opened", ("?", "?"))),
        )
        for q in pairs
    ]
    ratios = [q["relay_ratio"] for q in pairs]
    rows.append(
        (
            "median",
            ms(statistics.median(q["added_ttft_p50_s"] for q in pairs)),
            f"{statistics.median(ratios):.3f}x (spread {min(ratios):.3f}-{max(ratios):.3f})",
            "",
            "",
            "",
        )
    )
    return "secure against the baseline next to it, round by round\n" + format_rows(
        ("round", "added TTFT p50 ms", "relay ratio", "stack CPU µs/token", "phase s", "gRPC conns opened"), rows
    )
