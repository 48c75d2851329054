"""`tandem bench router`: the in-process cost of one KV-aware routing decision (RouterCore.route with the kv
policy) for a long prompt, many workers and a full prefix index, step by step from today's per-view path to the
array-scored one, in the same run and checked to decide alike; p50/p99 against the targets, table and JSON.

Builds its own index and registry (no services, no I/O besides the report)."""

import argparse
import json
import os
import platform
import random
import statistics
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from engines.base.block_hash import NONE_HASH, chain_block_hashes
from engines.base.events import KvEvent, KvEventKind
from engines.base.types import KvLayout
from services.common.protos import router_pb2
from services.router.array_policy import ArrayKvPolicy
from services.router.convert import route_input_from_pb
from services.router.core import RouterCore
from services.router.kv_policy import KvAwarePolicy, KvPolicyConfig
from services.router.policy import DisaggregationPolicy
from services.router.prefix_index import PrefixIndex
from services.router.registry import Registry
from services.router.settings import RouterSettings
from services.router.slot_index import SlotIndex
from services.router.types import RouteInput, WorkerInfo, WorkerLoad, WorkerRole
from tandem.bench.router_phases import PHASES, cold_start, decide_in_phases

TARGET_P50_US, TARGET_P99_US = 50.0, 100.0
_CHAIN = 256  # blocks per synthetic STORED event filling the index
# the steps compared, each in the same run over the same index: (name, what it adds, array-scored?, gateway hashes?,
# the converter of before (the token ids copied into a tuple)?, replayed phase by phase (router_phases.py)?)
STEPS = (
    ("today", "per-view kv policy, the router hashes the prompt", False, False, True, False),
    ("gateway_hashes", "+ block hashes sent by the gateway in RouteRequest", False, True, True, False),
    (
        "arrays",
        "+ worker state in arrays; index match, busy check and scoring in one compiled call (numba); "
        "token ids left in the message; bookkeeping after the reply",
        True,
        True,
        False,
        False,
    ),
    ("arrays_router_hashes", "arrays, but the router hashes the prompt (an old gateway)", True, False, False, False),
    ("arrays_phases", "arrays, replayed call by call with a timer between calls (a profile)", True, True, False, True),
)
FINAL_STEP = "arrays"


@dataclass(frozen=True, slots=True)
class RouterBenchConfig:
    num_workers: int = 64
    num_indexed_blocks: int = 1_000_000
    num_prompt_tokens: int = 8192
    block_size: int = 64
    num_iterations: int = 2000
    num_inflight: int = 4  # requests in flight per worker while timing
    # prompts the router sent to each worker lately (its recent routes): one a prefix of the timed prompt (a shared
    # system prompt, so every worker's recent routes are searched), the rest other tenants' prompts
    num_recent: int = 4
    seed: int = 0

    def __post_init__(self) -> None:
        if min(self.num_workers, self.num_prompt_tokens, self.block_size, self.num_iterations) < 1:
            raise ValueError(f"workers, prompt tokens, block size and iterations must be >= 1: {self}")
        if self.num_indexed_blocks < 0 or self.num_inflight < 0 or self.num_recent < 0:
            raise ValueError(f"indexed blocks and in-flight requests must be >= 0: {self}")


def build(
    cfg: RouterBenchConfig, clock=time.monotonic, arrays: bool = False
) -> tuple[RouterCore, PrefixIndex, list[int]]:
    """A router core over `num_workers` decode workers whose index holds `num_indexed_blocks` hashes: other
    prompts' chains spread over the workers, plus, per worker, a prefix of random length of the timed prompt.
    `arrays`: the array-scored kv policy (what the router runs), else today's per-view one; the same state."""
    rng = random.Random(cfg.seed)
    prompt = [rng.randrange(32000) for _ in range(cfg.num_prompt_tokens)]
    prompt_hashes = chain_block_hashes(prompt, cfg.block_size)
    index = SlotIndex(max(cfg.num_indexed_blocks, 1)) if arrays else PrefixIndex(max(cfg.num_indexed_blocks, 1))
    registry = Registry(clock, lease_ttl_s=1e9, inflight_ttl_s=1e9)
    layout = KvLayout(32, 8, 128, "bfloat16", cfg.block_size)
    worker_ids = [f"decode-{i:03d}" for i in range(cfg.num_workers)]
    for worker_id in worker_ids:
        registry.register(WorkerInfo(worker_id, WorkerRole.DECODE, f"{worker_id}:1", "m", layout, 256), WorkerLoad())
    seqs = dict.fromkeys(worker_ids, 0)
    num_other = max(cfg.num_indexed_blocks - len(prompt_hashes), 0)
    for start in range(0, num_other, _CHAIN):  # random 64-bit ids stand in for other prompts' block hashes
        worker_id = worker_ids[(start // _CHAIN) % len(worker_ids)]
        chain = tuple(rng.getrandbits(64) for _ in range(min(_CHAIN, num_other - start)))
        seqs[worker_id] += 1
        index.apply(worker_id, [KvEvent(seqs[worker_id], KvEventKind.STORED, NONE_HASH, chain)])
    for worker_id in worker_ids:
        depth = rng.randrange(len(prompt_hashes) + 1)
        seqs[worker_id] += 1
        index.apply(worker_id, [KvEvent(seqs[worker_id], KvEventKind.STORED, NONE_HASH, tuple(prompt_hashes[:depth]))])
    config = KvPolicyConfig(block_size=cfg.block_size)
    policy = ArrayKvPolicy(index, clock, config=config) if arrays else KvAwarePolicy(index, clock, config=config)
    core = RouterCore(registry, policy, DisaggregationPolicy(), RouterSettings().busy)  # the router's defaults
    for worker_id in worker_ids:
        for k in range(cfg.num_inflight):
            registry.add_inflight(f"bg-{worker_id}-{k}", [worker_id], rng.randrange(16384), rng.randrange(4096))
        for k in range(cfg.num_recent):
            chain = (
                prompt_hashes[: rng.randrange(1, len(prompt_hashes))]
                if k == 0
                else [rng.getrandbits(64) for _ in range(len(prompt_hashes))]
            )
            policy.predicted.record(chain, worker_id)
    return core, index, prompt


def time_step(cfg: RouterBenchConfig, arrays: bool, gateway_hashes: bool, copy_ids: bool, phased: bool) -> dict:
    """Times `num_iterations` decisions, each for a fresh prompt that differs from the last in its final token (so
    nothing is memoised across decisions); each request completes, untimed, after its route. Each RouteRequest is
    serialized untimed (the gateway's work, its hashing timed apart), then parsed and converted as the servicer
    does ("wire", timed apart from the decision). After each decision, untimed, the array policy makes the LRU touch
    and the recent-route record it deferred (what the servicer does after its reply), timed apart too. `phased`:
    each decision is replayed phase by phase (`decide_in_phases`), each phase's time reported."""
    start = time.perf_counter()
    core, index, prompt = build(cfg, arrays=arrays)
    build_s = time.perf_counter() - start
    samples_us, cpu_us, hash_us, wire_us, touch_us, picks, phase_ns = [], [], [], [], [], [], []
    for i in range(cfg.num_iterations):
        tokens = tuple(prompt[:-1]) + (i,)
        t0 = time.perf_counter()
        hashes = chain_block_hashes(tokens, cfg.block_size) if gateway_hashes else []
        t1 = time.perf_counter()
        wire = router_pb2.RouteRequest(
            req_id=f"r{i}",
            model="m",
            token_ids=tokens,
            block_hashes=hashes,
            hash_block_size=cfg.block_size if gateway_hashes else 0,
        ).SerializeToString()
        t2 = time.perf_counter()
        request = _from_wire(wire, copy_ids)
        c3, t3 = time.thread_time_ns(), time.perf_counter()
        decision = decide_in_phases(core, request, phase_ns) if phased else core.route(request)
        t4, c4 = time.perf_counter(), time.thread_time_ns()
        core.registry.complete(f"r{i}")
        t5 = time.perf_counter()
        core.flush_deferred()
        t6 = time.perf_counter()
        samples_us.append((t4 - t3) * 1e6)
        cpu_us.append((c4 - c3) / 1e3)
        hash_us.append((t1 - t0) * 1e6)
        wire_us.append((t3 - t2) * 1e6)
        touch_us.append((t6 - t5) * 1e6)
        picks.append((decision.decode.worker_id, decision.num_cached_tokens))
    return {
        "decision_us": _dist(samples_us),
        "decision_cpu_us": _dist(cpu_us),
        "gateway_hash_us": _dist(hash_us) if gateway_hashes else None,
        "wire_us": _dist(wire_us),
        "deferred_us": _dist(touch_us) if arrays else None,
        "phases_us": _phases(phase_ns) if phased else None,
        "build_s": build_s,
        "num_indexed_blocks": len(index),
        "picks": picks,
    }


def _from_wire(wire: bytes, copy_ids: bool) -> RouteInput:
    """The RouteInput the servicer builds from a serialized RouteRequest (`copy_ids`: as the converter did before,
    the token ids copied into a tuple)."""
    msg = router_pb2.RouteRequest.FromString(wire)
    request = route_input_from_pb(msg)
    return replace(request, token_ids=tuple(msg.token_ids)) if copy_ids else request


def run_router_bench(
    cfg: RouterBenchConfig, steps: tuple[str, ...] = tuple(s[0] for s in STEPS), with_cold_start: bool = False
) -> dict:
    """Every step of `steps` over the same state; the decisions of each step must be the same (checked).
    `with_cold_start`: also the kernels' compile and cached-load times in fresh processes (`cold_start`)."""
    found, reference = {}, None
    for name, what, *flags in STEPS:
        if name not in steps:
            continue
        step = time_step(cfg, *flags)
        picks = step.pop("picks")
        reference = reference or picks
        found[name] = {"what": what, **step, "same_decisions": picks == reference}
    final = found.get(FINAL_STEP) or next(iter(found.values()))
    d = final["decision_us"]
    return {
        "benchmark": "router",
        "config": asdict(cfg),
        "machine": f"{platform.node()} python {platform.python_version()}",
        "measures": "RouterCore.route in-process (policy + index + registry); parsing the RouteRequest timed apart",
        "load_average": os.getloadavg(),
        "cpu_flags": _cpu_flags(),
        "num_indexed_blocks": final["num_indexed_blocks"],
        "steps": found,
        "final_step": FINAL_STEP,
        "decision_us": d,
        "target_p50_us": TARGET_P50_US,
        "target_p99_us": TARGET_P99_US,
        "meets_target": d["p50"] <= TARGET_P50_US and d["p99"] <= TARGET_P99_US,
        "cold_start": cold_start() if with_cold_start else None,
    }


def _phases(ns: list[int]) -> dict[str, dict[str, float]]:
    columns = zip(*(ns[i : i + len(PHASES)] for i in range(0, len(ns), len(PHASES))))
    return {name: _dist([v / 1e3 for v in column]) for (name, _), column in zip(PHASES, columns)}


def _cpu_flags() -> str:
    """The host CPU's model name and SIMD flags, for the results table (Linux only; empty elsewhere)."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""
    model = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name")), "")
    flags = next((ln.split(":", 1)[1].split() for ln in info.splitlines() if ln.startswith("flags")), [])
    return f"{model}; {' '.join(f for f in flags if f.startswith(('avx', 'sse4')))}"


def _dist(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "p50": statistics.median(ordered),
        "p99": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
        "mean": statistics.fmean(ordered),
        "min": ordered[0],
    }


def format_router_report(report: dict) -> str:
    cfg = report["config"]
    verdict = "met" if report["meets_target"] else "missed"
    lines = [
        f"router decision: {cfg['num_prompt_tokens']}-token prompt (blocks of {cfg['block_size']}), "
        f"{cfg['num_workers']} workers, {report['num_indexed_blocks']:,} indexed blocks, "
        f"{cfg['num_iterations']} decisions per step ({report['measures']})",
        f"load average {report['load_average'][0]:.1f}; wall-clock µs, and the CPU time of the deciding thread "
        "(what it costs without being descheduled)",
        f"{'step':22}{'p50 µs':>10}{'p99 µs':>10}{'mean µs':>10}{'cpu p50':>10}{'cpu p99':>10}{'same picks':>12}  what",
    ]
    for name, step in report["steps"].items():
        s, c = step["decision_us"], step["decision_cpu_us"]
        lines.append(
            f"{name:22}{s['p50']:>10.1f}{s['p99']:>10.1f}{s['mean']:>10.1f}{c['p50']:>10.1f}{c['p99']:>10.1f}"
            f"{'yes' if step['same_decisions'] else 'NO':>12}  {step['what']}"
        )
        lines.append(
            f"{'  (parse + convert)':22}{step['wire_us']['p50']:>10.1f}{step['wire_us']['p99']:>10.1f}"
            f"{'':>42}  the servicer's RouteRequest -> RouteInput, before the decision"
        )
        if step["deferred_us"]:
            lines.append(
                f"{'  (after the reply)':22}{step['deferred_us']['p50']:>10.1f}"
                f"{step['deferred_us']['p99']:>10.1f}{'':>42}  deferred LRU touch and recent-route record"
            )
        for phase, what in PHASES if step["phases_us"] else ():
            p = step["phases_us"][phase]
            lines.append(f"{'    ' + phase:22}{p['p50']:>10.1f}{p['p99']:>10.1f}{p['mean']:>10.1f}{'':>32}  {what}")
        if step["gateway_hash_us"]:
            lines.append(
                f"{'  (gateway hashing)':22}{step['gateway_hash_us']['p50']:>10.1f}"
                f"{step['gateway_hash_us']['p99']:>10.1f}{'':>42}  moved off the router"
            )
    lines.append(
        f"target p50 <= {report['target_p50_us']:.0f} µs and p99 <= {report['target_p99_us']:.0f} µs "
        f"({report['final_step']}): {verdict}"
    )
    if cold := report["cold_start"]:
        lines.append(
            f"cold start: kernels compiled in {cold['kernels_s_compile']:.2f} s (empty numba cache), loaded "
            f"from the cache in {cold['kernels_s_cached']:.2f} s (import {cold['import_s_cached']:.2f} s)"
        )
    return "\n".join(lines)


# -- CLI ---------------------------------------------------------------------------------------
def add_router_command(bench_commands) -> None:
    p = bench_commands.add_parser("router", help="in-process cost of one KV-aware routing decision")
    defaults = RouterBenchConfig()
    p.add_argument("--workers", type=int, default=defaults.num_workers)
    p.add_argument("--indexed-blocks", type=int, default=defaults.num_indexed_blocks)
    p.add_argument("--prompt-tokens", type=int, default=defaults.num_prompt_tokens)
    p.add_argument(
        "--block-size",
        type=int,
        default=defaults.block_size,
        help="tokens per KV block (64: the default sim profile's and Dynamo mocker's)",
    )
    p.add_argument("--iterations", type=int, default=defaults.num_iterations)
    p.add_argument("--inflight", type=int, default=defaults.num_inflight, help="in-flight requests per worker")
    p.add_argument(
        "--recent",
        type=int,
        default=defaults.num_recent,
        help="prompts routed to each worker lately (the first shares the timed prompt's prefix)",
    )
    p.add_argument("--seed", type=int, default=defaults.seed)
    p.add_argument(
        "--step",
        action="append",
        choices=[s[0] for s in STEPS],
        default=None,
        help="time only these steps (repeatable; default: all, today's path first)",
    )
    p.add_argument(
        "--cold-start",
        action="store_true",
        help="also time compiling the kernels, and loading them from numba's cache, in fresh processes",
    )
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    p.set_defaults(func=cmd_bench_router)


def cmd_bench_router(args: argparse.Namespace) -> int:
    try:
        cfg = RouterBenchConfig(
            args.workers,
            args.indexed_blocks,
            args.prompt_tokens,
            args.block_size,
            args.iterations,
            args.inflight,
            num_recent=args.recent,
            seed=args.seed,
        )
    except ValueError as exc:
        raise SystemExit(f"tandem bench router: error: {exc}") from None
    report = run_router_bench(cfg, tuple(args.step) if args.step else tuple(s[0] for s in STEPS), args.cold_start)
    print(format_router_report(report))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0
