"""`tandem bench router`: the in-process cost of one KV-aware routing decision (RouterCore.route with the kv
policy) for a long prompt, many workers and a full prefix index; p50/p99 against a target, table and JSON.

Builds its own index and registry (no services, no I/O besides the report)."""
import argparse
import json
import platform
import random
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from engines.base.block_hash import NONE_HASH, chain_block_hashes
from engines.base.events import KvEvent, KvEventKind
from engines.base.types import KvLayout
from services.router.core import RouterCore
from services.router.kv_policy import KvAwarePolicy, KvPolicyConfig
from services.router.policy import DisaggregationPolicy
from services.router.prefix_index import PrefixIndex
from services.router.registry import Registry
from services.router.types import RouteInput, WorkerInfo, WorkerLoad, WorkerRole

TARGET_P50_US = 100.0
_CHAIN = 256  # blocks per synthetic STORED event filling the index


@dataclass(frozen=True, slots=True)
class RouterBenchConfig:
    num_workers: int = 64
    num_indexed_blocks: int = 1_000_000
    num_prompt_tokens: int = 8192
    block_size: int = 64
    num_iterations: int = 2000
    num_inflight: int = 4  # requests in flight per worker while timing
    seed: int = 0

    def __post_init__(self) -> None:
        if min(self.num_workers, self.num_prompt_tokens, self.block_size, self.num_iterations) < 1:
            raise ValueError(f"workers, prompt tokens, block size and iterations must be >= 1: {self}")
        if self.num_indexed_blocks < 0 or self.num_inflight < 0:
            raise ValueError(f"indexed blocks and in-flight requests must be >= 0: {self}")


def build(cfg: RouterBenchConfig, clock=time.monotonic) -> tuple[RouterCore, PrefixIndex, list[int]]:
    """A router core over `num_workers` decode workers whose index holds `num_indexed_blocks` hashes: other
    prompts' chains spread over the workers, plus, per worker, a prefix of random length of the timed prompt."""
    rng = random.Random(cfg.seed)
    prompt = [rng.randrange(32000) for _ in range(cfg.num_prompt_tokens)]
    prompt_hashes = chain_block_hashes(prompt, cfg.block_size)
    index = PrefixIndex(max(cfg.num_indexed_blocks, 1))
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
    policy = KvAwarePolicy(index, clock, config=KvPolicyConfig(block_size=cfg.block_size))
    core = RouterCore(registry, policy, DisaggregationPolicy())
    for worker_id in worker_ids:
        for k in range(cfg.num_inflight):
            registry.add_inflight(f"bg-{worker_id}-{k}", [worker_id], rng.randrange(16384), rng.randrange(4096))
    return core, index, prompt


def run_router_bench(cfg: RouterBenchConfig) -> dict:
    """Times `num_iterations` decisions, each for a fresh prompt object that differs from the last in its
    final token (so nothing is memoised across decisions); each request completes, untimed, after its route."""
    start = time.perf_counter()
    core, index, prompt = build(cfg)
    build_s = time.perf_counter() - start
    samples_us, hash_us = [], []
    for i in range(cfg.num_iterations):
        tokens = tuple(prompt[:-1]) + (i,)
        t0 = time.perf_counter()
        decision = core.route(RouteInput(f"r{i}", "m", tokens))
        t1 = time.perf_counter()
        chain_block_hashes(tokens, cfg.block_size)
        t2 = time.perf_counter()
        core.registry.complete(f"r{i}")
        samples_us.append((t1 - t0) * 1e6)
        hash_us.append((t2 - t1) * 1e6)
    p50 = statistics.median(samples_us)
    return {
        "benchmark": "router", "config": asdict(cfg), "machine": f"{platform.node()} python {platform.python_version()}",
        "num_indexed_blocks": len(index), "build_s": build_s, "decision_us": _dist(samples_us),
        "hash_prompt_us": _dist(hash_us), "num_cached_tokens_last": decision.num_cached_tokens,
        "target_p50_us": TARGET_P50_US, "meets_target": p50 <= TARGET_P50_US,
    }


def _dist(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {"p50": statistics.median(ordered), "p99": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
            "mean": statistics.fmean(ordered), "min": ordered[0]}


def format_router_report(report: dict) -> str:
    cfg, d, h = report["config"], report["decision_us"], report["hash_prompt_us"]
    verdict = "met" if report["meets_target"] else f"missed by {d['p50'] - report['target_p50_us']:.0f} µs"
    return "\n".join([
        f"router decision: {cfg['num_prompt_tokens']}-token prompt (blocks of {cfg['block_size']}), "
        f"{cfg['num_workers']} workers, {report['num_indexed_blocks']:,} indexed blocks, "
        f"{cfg['num_iterations']} decisions (index built in {report['build_s']:.1f} s)",
        f"{'':24}{'p50 µs':>10}{'p99 µs':>10}{'mean µs':>10}",
        f"{'one Route decision':24}{d['p50']:>10.1f}{d['p99']:>10.1f}{d['mean']:>10.1f}",
        f"{'  of which: hash prompt':24}{h['p50']:>10.1f}{h['p99']:>10.1f}{h['mean']:>10.1f}",
        f"target p50 <= {report['target_p50_us']:.0f} µs: {verdict}",
    ])


# -- CLI ---------------------------------------------------------------------------------------
def add_router_command(bench_commands) -> None:
    p = bench_commands.add_parser("router", help="in-process cost of one KV-aware routing decision")
    defaults = RouterBenchConfig()
    p.add_argument("--workers", type=int, default=defaults.num_workers)
    p.add_argument("--indexed-blocks", type=int, default=defaults.num_indexed_blocks)
    p.add_argument("--prompt-tokens", type=int, default=defaults.num_prompt_tokens)
    p.add_argument("--block-size", type=int, default=defaults.block_size,
                   help="tokens per KV block (64: the default sim profile's and Dynamo mocker's)")
    p.add_argument("--iterations", type=int, default=defaults.num_iterations)
    p.add_argument("--inflight", type=int, default=defaults.num_inflight, help="in-flight requests per worker")
    p.add_argument("--seed", type=int, default=defaults.seed)
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    p.set_defaults(func=cmd_bench_router)


def cmd_bench_router(args: argparse.Namespace) -> int:
    try:
        cfg = RouterBenchConfig(args.workers, args.indexed_blocks, args.prompt_tokens, args.block_size,
                                args.iterations, args.inflight, args.seed)
    except ValueError as exc:
        raise SystemExit(f"tandem bench router: error: {exc}") from None
    report = run_router_bench(cfg)
    print(format_router_report(report))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0
