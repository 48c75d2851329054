"""What a clairvoyant schedule reaches on a scored planner trace: attainment and GPU-hours of fleets set in advance
from the trace itself, against the static pair the search found, replayed in the same run. An existence check for
a bound, not a planner: it reads the trace it is scored on, and nothing here is tuned for a planner.

    python bench/planner/oracle.py --baseline bench/results/planner/fifth/mooncake_1000_baseline.json --study hold \
        --json bench/results/planner/oracle/mooncake_1000_hold.json [--jobs 2] [--small 300]

Studies: `hold` holds the cheapest fleet for the share of the window that a schedule must hold it to cost at most
0.85x the static pair (contiguous, alternating, in the lightest bins), a generous fleet the rest; `minute` picks for
each minute the cheapest pair whose static replay of that minute's arrivals alone meets the target, then variants;
`day` sizes each bin from the diurnal generator's base curve and burst factor at given per-worker capacities, never
from the arrivals (what a planner that knows the day's shape, but not when bursts come, could do).
"""

import argparse
import dataclasses
import json
import multiprocessing
import os
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path

from engines.timing.profile import load_profile
from services.planner.perf_model import Slo
from services.planner.state_machine import PlannerConfig, RoleBounds
from tandem.bench.jsonsafe import json_safe
from tandem.bench.traces import TraceRow, load_trace
from tandem.cluster import planner_oracle as po
from tandem.cluster.planner_sim import PlannerSimConfig, as_role_counts, run_static

TARGET_SHARE = 0.85
MARGIN = 0.98  # the per-bin search goes on until a pair meets this (the margin variants use it)
EXTRA_LEVELS = 3  # ... or the fleet has this many workers more than the static pair
BLOCKS_S = (30, 60, 90, 120)
KEEP: tuple[str, ...] = ("sla_attainment", "gpu_hours_own_end", "gpu_hours_per_s_after", "end_s", "peak_replicas")
KEEP += (
    "ttft_p99_s",
    "replicas",
    "itl_mean_s",
    "num_requests",
    "num_finished",
    "decisions",
    "schedule",
    "attainment_is_upper_bound",
)


def config_from(doc: dict) -> PlannerSimConfig:
    """The scored runs' setup, as the baseline JSON recorded it (bounds, SLOs, tick, start delay, heartbeats)."""
    c = doc["planner_config"]
    planner = PlannerConfig(prefill=RoleBounds(*c["bounds"]["prefill"]), decode=RoleBounds(*c["bounds"]["decode"]))
    return PlannerSimConfig(
        planner,
        Slo(c["slo_ttft_s"], c["slo_itl_s"]),
        tick_s=c["tick_s"],
        start_delay_s=c["start_delay_s"],
        policy=c["policy"],
        seed=doc["seed"],
        heartbeat_interval_s=c["heartbeat_interval_s"],
        disagg_min_tokens=c["disagg_min_tokens"],
        target_attainment=c["target_attainment"],
    )


class Runner:
    """Replays schedules in a process pool; results keyed by name, in the order submitted."""

    def __init__(self, truth, rows: list[TraceRow], cfg: PlannerSimConfig, pool: ProcessPoolExecutor):
        self.truth, self.rows, self.cfg, self.pool = truth, rows, cfg, pool
        self.futures: dict[str, tuple[Future, dict]] = {}

    def submit(self, name: str, schedule: list[tuple[float, int, int]], **label) -> None:
        future = self.pool.submit(po.run_scheduled, self.truth, self.rows, self.cfg, schedule)
        self.futures[name] = (future, label)

    def results(self) -> dict[str, dict]:
        out = {}
        for name, (future, label) in self.futures.items():
            run = future.result()
            out[name] = {**label, **{k: run[k] for k in KEEP if k in run}}
        self.futures = {}
        return out


def share_of(run: dict, anchor: dict) -> float:
    """GPU-hours over the anchor's, both counted to the later of their ends (the fleet left running after its own)."""
    window = max(run["end_s"], anchor["end_s"])

    def hours(r: dict) -> float:
        return r["gpu_hours_own_end"] + r["gpu_hours_per_s_after"] * (window - r["end_s"])

    return hours(run) / hours(anchor)


def hold_study(runner: Runner, static: po.Fleet, anchor: dict, blocks: list[int], double: bool) -> tuple[dict, dict]:
    """The cheapest fleet held (billed) for the needed share, a generous fleet (the static pair, or twice it) the
    rest: one block at several offsets, alternations, the lightest bins."""
    cfg, window = runner.cfg, anchor["end_s"]
    cheap = po.cheaper_fleets(static, cfg)[0]
    need = po.needed_hold_share(sum(cheap), sum(static), TARGET_SHARE)
    big = (min(2 * static[0], cfg.planner.prefill.max_replicas), min(2 * static[1], cfg.planner.decode.max_replicas))
    runner.submit(f"static_{cheap[0]}+{cheap[1]}_whole", [(0.0, *cheap)], kind="static, no early stop")
    for generous in dict.fromkeys([static, *([big] if double else [])]):
        g = f"{generous[0]}+{generous[1]}"
        for k in range(4):
            sched = po.held_block(cheap, generous, k / 3, need, window, cfg)
            start = next(t for t, *fleet in sched if tuple(fleet) == cheap)
            runner.submit(f"block@{start:g}_{g}", sched, kind="one block")
        for block in blocks:
            for rest in alternation_rests(block, need, cfg):
                for first in (True, False):
                    sched = po.alternating(cheap, generous, block, rest, window, first)
                    runner.submit(f"alt{block}/{rest:g}{'c' if first else 'g'}_{g}", sched, kind="alternating")
        for bin_s in (30.0, 60.0):
            for measure, loads in bin_measures(runner, cheap, bin_s, window).items():
                sched = po.lightest(loads, cheap, generous, bin_s, need, window, cfg)
                runner.submit(f"lightest_{measure}_{bin_s:g}s_{g}", sched, kind="lightest bins")
    runs = runner.results()
    for run in runs.values():
        run["cheap_share"] = po.fleet_seconds(run["schedule"], window).get(cheap, 0.0) / window
        run["cheap_share_held"] = po.held_seconds(run["replicas"], run["decisions"], window).get(cheap, 0.0) / window
    return {"cheap_fleet": cheap, "needed_hold_share": need, "large_fleet": big}, runs


def bin_measures(runner: Runner, cheap: po.Fleet, bin_s: float, window: float) -> dict[str, list[float]]:
    """Each bin's load: its arrivals' tokens, their count, and the requests `cheap` misses when it serves that bin's
    arrivals alone (a static replay from an empty fleet, replayed whole): the clairvoyant's own measure."""
    slices = po.bin_slices(runner.rows, bin_s, window)
    todo = [
        runner.pool.submit(po.run_scheduled, runner.truth, rows, runner.cfg, [(0.0, *cheap)]) for rows in slices if rows
    ]
    runs = iter(f.result() for f in todo)
    misses = [(1.0 - next(runs)["sla_attainment"]) * len(rows) if rows else 0.0 for rows in slices]
    return {m: po.bin_loads(runner.rows, bin_s, window, m) for m in ("tokens", "requests")} | {"misses": misses}


def alternation_rests(block: float, need: float, cfg: PlannerSimConfig) -> list[float]:
    """The generous blocks to alternate with a cheap one of `block` s: scheduled to serve cheap `need` of the time,
    and (a block longer than the start delay) billed so: a replica comes back a start delay before it serves."""
    rests = [po.on_grid(block * (1 - need) / need, cfg.tick_s)]
    if block > cfg.start_delay_s:
        rests.append(po.on_grid((block - cfg.start_delay_s) * (1 - need) / need, cfg.tick_s))
    return [r for r in dict.fromkeys(rests) if r > 0]


def minute_search(cfg: PlannerSimConfig, truth, rows, pool, bin_s: float, end_s: float, top: int) -> list[dict]:
    """Per bin, the static replay of its arrivals alone (shifted to start at 0, an empty fleet's cache) for pairs in
    ascending worker count, until a level has a pair meeting MARGIN, two levels raised nothing, or EXTRA_LEVELS past
    the static pair's count.
    Stopped replays are below the target, flagged as upper bounds."""
    slices = po.bin_slices(rows, bin_s, end_s)
    p, d = cfg.planner.prefill, cfg.planner.decode
    tried: list[dict] = [{} for _ in slices]
    best: dict[int, dict[int, float]] = {}  # per level, each bin's best attainment so far
    todo = [i for i, s in enumerate(slices) if s]
    for level in range(p.min_replicas + max(d.min_replicas, 1), top + 1):
        pairs = [(a, level - a) for a in range(p.min_replicas, p.max_replicas + 1)]
        pairs = [x for x in pairs if max(d.min_replicas, 1) <= x[1] <= d.max_replicas]
        futures = {
            (i, x): pool.submit(run_static, truth, slices[i], cfg, as_role_counts(x)) for i in todo for x in pairs
        }
        for (i, x), f in futures.items():
            run = f.result()
            tried[i][x] = (run["sla_attainment"], run["attainment_is_upper_bound"])
        best[level] = {i: max(a for a, _ in tried[i].values()) for i in todo}
        todo = [i for i in todo if best[level][i] < MARGIN and not _plateau(best, i, level)]
        if not todo:
            break
    return [{"num_requests": len(s), "tried": t} for s, t in zip(slices, tried)]


def _plateau(best: dict[int, dict[int, float]], i: int, level: int) -> bool:
    """Two levels in a row raised nothing: the misses left are ones more workers do not serve (prompts over the
    TTFT SLO alone, say)."""
    return level - 2 in best and best[level][i] <= best[level - 2].get(i, 0.0)


def cheapest_meeting(tried: dict, target: float, floor: po.Fleet) -> po.Fleet:
    """The fewest workers meeting `target` (ties: higher attainment); an empty bin gets the minimum fleet."""
    ok = [(sum(x), -a, x) for x, (a, bound) in tried.items() if a >= target and not bound]
    return min(ok)[2] if ok else floor if not tried else max(tried, key=lambda x: (tried[x][0], -sum(x)))


def minute_study(runner: Runner, static: po.Fleet, anchor: dict, bin_s: float) -> tuple[dict, dict]:
    cfg, window = runner.cfg, anchor["end_s"]
    floor = (cfg.planner.prefill.min_replicas, max(cfg.planner.decode.min_replicas, 1))
    top = sum(static) + EXTRA_LEVELS
    bins = minute_search(cfg, runner.truth, runner.rows, runner.pool, bin_s, window, top)
    at_target = [cheapest_meeting(b["tried"], cfg.target_attainment, floor) for b in bins]
    at_margin = [cheapest_meeting(b["tried"], MARGIN, floor) for b in bins]
    variants = {
        "per_bin_95": at_target,
        "per_bin_95_lookahead": po.look_ahead(at_target),
        "per_bin_98": at_margin,
        "per_bin_98_lookahead": po.look_ahead(at_margin),
    }
    for name, fleets in variants.items():
        runner.submit(name, po.from_bins(fleets, bin_s), kind="per-bin static replays", fleets=fleets)
    rows = [{**b, "tried": [[*x, a, u] for x, (a, u) in b["tried"].items()]} for b in bins]
    return {"bin_s": bin_s, "max_workers_searched": top, "bins": rows}, runner.results()


def day_study(runner: Runner, anchor: dict, day: po.DayShape, capacities: list, bin_s: float) -> tuple[dict, dict]:
    """Fleets from the day's base curve alone (bursts unknown), one schedule per (prefill, decode) capacity."""
    for c_p, c_d in capacities:
        fleets = po.day_fleets(day, (c_p, c_d), bin_s, anchor["end_s"], runner.cfg)
        runner.submit(f"day_p{c_p:g}_d{c_d:g}", po.from_bins(fleets, bin_s), kind="day shape", fleets=fleets)
    facts = {"day": dataclasses.asdict(day), "bin_s": bin_s, "capacities": capacities}
    return facts, runner.results()


def verdicts(runs: dict[str, dict], anchor: dict, target: float) -> None:
    """Each run's GPU share of the anchor, and whether it reaches the targets (both is what a planner must)."""
    for run in runs.values():
        run["gpu_share"] = share_of(run, anchor)
        run["meets_attainment"] = run["sla_attainment"] >= target
        run["meets_cost"] = run["gpu_share"] <= TARGET_SHARE
        run["meets_both"] = run["meets_attainment"] and run["meets_cost"]


def format_table(runs: dict[str, dict], anchor_name: str) -> str:
    lines = [f"{'schedule':<32}{'kind':>24}{'cheap: asked':>13}{'held':>7}{'attainment':>11}{'GPU share':>10}  both"]
    for name, run in runs.items():
        cheap = (
            f"{run['cheap_share']:.1%}{run['cheap_share_held']:>7.1%}" if "cheap_share" in run else f"{'-':>6}{'-':>7}"
        )
        share = "anchor" if name == anchor_name else f"{run['gpu_share']:.1%}"
        mark = "-" if name == anchor_name else "YES" if run["meets_both"] else "no"
        kind = run.get("kind", "")
        lines.append(f"{name:<32}{kind:>24}{cheap:>13}{run['sla_attainment']:>11.3f}{share:>10}  {mark}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    doc = json.loads(Path(args.baseline).read_text())
    cfg, truth = config_from(doc), load_profile(doc["profile"]["name"])
    rows = load_trace(args.trace or Path(doc["trace"]), args.small or doc["num_requests"], doc["time_scale"])
    static = tuple(doc["static_best"]["replicas"][r] for r in ("prefill", "decode"))
    with ProcessPoolExecutor(max(args.jobs, 1), multiprocessing.get_context("forkserver")) as pool:
        runner = Runner(truth, rows, cfg, pool)
        anchor_name = f"static_{static[0]}+{static[1]}"
        runner.submit(anchor_name, [(0.0, *static)], kind="anchor (static pair)")
        anchor = runner.results()[anchor_name]
        if args.study == "hold":
            blocks = [int(b) for b in args.blocks.split(",") if b.strip()]
            facts, runs = hold_study(runner, static, anchor, blocks, not args.no_double)
        elif args.study == "minute":
            facts, runs = minute_study(runner, static, anchor, args.bin_s)
        else:
            day = po.DayShape(*(float(x) for x in args.day.split(",")))
            capacities = [tuple(float(x) for x in c.split(":")) for c in args.capacities.split(",")]
            facts, runs = day_study(runner, anchor, day, capacities, args.bin_s)
    runs = {anchor_name: anchor, **runs}
    verdicts(runs, anchor, cfg.target_attainment)
    print(format_table(runs, anchor_name))
    window = anchor["end_s"]
    print(f"window {window:.1f} s; static pair {static[0]}+{static[1]} (the search's answer in {args.baseline})")
    cheaper = {
        f"{a}+{b}": po.needed_hold_share(a + b, sum(static), TARGET_SHARE) for a, b in po.cheaper_fleets(static, cfg)
    }
    print(
        "cheaper fleets, the share each must be held for <= 85%: "
        + ", ".join(f"{k} {v:.1%}" for k, v in cheaper.items())
    )
    reached = [n for n, r in runs.items() if n != anchor_name and r["meets_both"]]
    print(
        f"schedules meeting >= {cfg.target_attainment:.0%} at <= {TARGET_SHARE:.0%} of the anchor: {reached or 'NONE'}"
    )
    out = {
        "baseline": str(args.baseline),
        "trace": str(args.trace or doc["trace"]),
        "num_requests": len(rows),
        "study": args.study,
        "static_pair": static,
        "static_pair_in_baseline_json": doc["static_best"]["sla_attainment"],
        "window_s": window,
        "target_share": TARGET_SHARE,
        "cheaper_fleets": cheaper,
        "facts": facts,
        "runs": runs,
        "reached": reached,
    }
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(json_safe(out), indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--baseline", required=True, help="a `tandem sim --planner sla` JSON with static_best")
    p.add_argument("--study", choices=("hold", "minute", "day"), required=True)
    p.add_argument("--bin-s", type=float, default=60.0, help="minute, day: the bin each fleet is chosen for")
    p.add_argument("--trace", type=Path, default=None, help="the trace, if not at the path the baseline recorded")
    p.add_argument(
        "--day",
        default="3,0.6,900,2.5",
        help="day study: mean rate, amplitude, period (s), burst factor (default: the diurnal traces' command)",
    )
    p.add_argument(
        "--capacities",
        default="8:4.5,8:4,8:3.5,6:4.5",
        help="day study: requests/s per prefill:decode worker, one schedule each",
    )
    p.add_argument("--blocks", default=",".join(map(str, BLOCKS_S)), help="hold study: cheap blocks to alternate (s)")
    p.add_argument("--no-double", action="store_true", help="hold study: the static pair as the only generous fleet")
    p.add_argument("--small", type=int, default=0, help="only the first N requests (a rehearsal; the test)")
    p.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    p.add_argument("--json", type=Path, default=None)
    return p.parse_args(argv)


if __name__ == "__main__":
    raise SystemExit(main())
