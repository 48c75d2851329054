"""`tandem sim`: replay a trace through the cluster simulator once per routing policy; print a table and
write the JSON report and PNG plots. Argument parsing and orchestration only."""

import argparse
import datetime
import json
import platform
import time
from pathlib import Path

from engines.timing.profile import (
    DEFAULT_PROFILE,
    ProfileError,
    TimingProfile,
    load_profile,
    profile_from_bench,
    profile_from_measurements,
)
from tandem.bench.traces import TraceError, load_trace
from tandem.cluster.des import ClusterSim, SimConfig
from tandem.cluster.metrics import DEFAULT_SLO_ITL_S, DEFAULT_SLO_TTFT_S, Slo, summarize
from tandem.cluster.planner_cli import add_planner_arguments, run_planner_sim
from tandem.cluster.policies import POLICY_NAMES
from tandem.cluster.replicas import format_verdicts, replica_verdicts, run_key
from tandem.cluster.report import format_table, write_json, write_plots


def add_sim_command(commands) -> None:
    p = commands.add_parser(
        "sim",
        help="discrete-event cluster simulator: compare routing policies on a trace, "
        "or drive the planner (--planner sla)",
    )
    p.add_argument("--trace", type=Path, default=None, help="Mooncake JSONL or Azure CSV trace (required to simulate)")
    p.add_argument("--workers", type=int, default=8, help="decode (or aggregated) workers")
    p.add_argument("--prefill-workers", type=int, default=0)
    p.add_argument(
        "--policies",
        default=",".join(POLICY_NAMES),
        help="comma-separated: " + ",".join(POLICY_NAMES) + " (with --planner: the one named, else least_loaded)",
    )
    p.add_argument("--time-scale", type=float, default=1.0, help="multiplies every arrival time (0.5 = 2x rate)")
    p.add_argument("--profile", default=DEFAULT_PROFILE, help="shipped profile name or a profile JSON path")
    p.add_argument(
        "--profile-from-bench",
        type=Path,
        default=None,
        metavar="BENCH_JSON",
        help="fit the timing model to a `tandem bench engine --json` report (other fields from --profile)",
    )
    p.add_argument(
        "--profile-from-measured",
        type=Path,
        default=None,
        metavar="MEASURED_JSON",
        help="step times measured by `tandem bench profile` (limits from --profile and --set)",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="override one profile field, e.g. --set num_blocks=24576 (repeatable)",
    )
    p.add_argument(
        "--save-profile",
        type=Path,
        default=None,
        metavar="PATH",
        help="write the profile used (e.g. the fitted one) as JSON; without --trace, only that",
    )
    p.add_argument("--max-requests", type=int, default=None, help="only the first N rows of the trace")
    p.add_argument("--slo-ttft-s", type=float, default=DEFAULT_SLO_TTFT_S)
    p.add_argument("--slo-itl-s", type=float, default=DEFAULT_SLO_ITL_S)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--kv-overlap-weight", type=float, default=1.0, help="the kv policy's overlap_weight")
    p.add_argument(
        "--kv-inflight-weight",
        type=float,
        default=0.1,
        help="the kv policy's inflight_weight: what a block held by an in-flight request costs",
    )
    p.add_argument(
        "--kv-host-gb",
        type=float,
        default=0.0,
        help="per worker: a host KV tier of this size (loads at the profile's kv_host_gb_per_s)",
    )
    p.add_argument(
        "--kv-disk-gb",
        type=float,
        default=0.0,
        help="per worker: a disk KV tier under the host tier (loads at the profile's kv_disk_gb_per_s)",
    )
    p.add_argument(
        "--routers",
        default="1",
        metavar="N[,N...]",
        help="router replicas deciding on their own views; several counts: each policy once per count, "
        "with replicas judged against the first count (hit rate, herding)",
    )
    p.add_argument("--json", type=Path, default=None, help="write the report here")
    p.add_argument("--plots", type=Path, default=None, help="PNG path prefix (default: the --json path without .json)")
    add_planner_arguments(p)
    p.set_defaults(func=run_sim)


def run_sim(args: argparse.Namespace) -> int:
    names = [n.strip() for n in args.policies.split(",") if n.strip()]
    unknown = [n for n in names if n not in POLICY_NAMES]
    if unknown or not names:
        raise SystemExit(f"tandem sim: unknown policies {unknown}; choose from {', '.join(POLICY_NAMES)}")
    try:
        profile = build_profile(args)
    except ProfileError as exc:
        raise SystemExit(f"tandem sim: {exc}") from None
    if args.save_profile is not None:
        args.save_profile.parent.mkdir(parents=True, exist_ok=True)
        args.save_profile.write_text(json.dumps(profile.to_dict(), indent=2) + "\n")
        print(f"wrote {args.save_profile} (use it with --profile {args.save_profile})")
        if args.trace is None:
            return 0
    if args.trace is None:
        raise SystemExit("tandem sim: --trace is required to simulate")
    try:
        rows = load_trace(args.trace, args.max_requests, args.time_scale)
    except (TraceError, OSError) as exc:
        raise SystemExit(f"tandem sim: {exc}") from None
    if not rows:
        raise SystemExit(f"tandem sim: {args.trace} has no requests")
    if args.planner:
        return run_planner_sim(args, profile, rows, _header(args, profile, len(rows)))
    if args.kv_overlap_weight < 0 or args.kv_inflight_weight < 0:
        raise SystemExit("tandem sim: --kv-overlap-weight and --kv-inflight-weight must be >= 0")
    if args.kv_host_gb < 0 or args.kv_disk_gb < 0 or (args.kv_disk_gb > 0 and args.kv_host_gb <= 0):
        raise SystemExit("tandem sim: --kv-host-gb and --kv-disk-gb must be >= 0, and a disk tier needs a host tier")
    counts = _router_counts(args.routers)
    slo, policies = Slo(args.slo_ttft_s, args.slo_itl_s), {}
    for n in counts:
        config = SimConfig(
            args.workers,
            args.prefill_workers,
            args.seed,
            kv_overlap_weight=args.kv_overlap_weight,
            kv_inflight_weight=args.kv_inflight_weight,
            kv_host_gb=args.kv_host_gb,
            kv_disk_gb=args.kv_disk_gb,
            num_routers=n,
        )
        policies.update({run_key(name, n, counts): simulate(profile, config, name, rows, slo) for name in names})
    print(format_table(policies))
    header = _header(args, profile, len(rows))
    if len(counts) > 1:
        header["replicas"] = replica_verdicts(policies, names, counts)
        print(format_verdicts(header["replicas"]))
    if args.json:
        write_json(args.json, header, policies)
        print(f"wrote {args.json}")
    prefix = args.plots or (args.json.with_suffix("") if args.json else None)
    if prefix:
        for path in write_plots(prefix, policies):
            print(f"wrote {path}")
    return 0


def _router_counts(raw: str) -> list[int]:
    try:
        counts = [int(x) for x in raw.split(",") if x.strip()]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise SystemExit(f"tandem sim: --routers wants counts >= 1 such as 1,2,4, got {raw!r}")
    return counts


def build_profile(args: argparse.Namespace) -> TimingProfile:
    """--profile, refitted from --profile-from-bench or --profile-from-measured, with --set overrides."""
    profile = load_profile(args.profile)
    if args.set:
        profile = TimingProfile.from_dict({**profile.to_dict(), **_overrides(args.set, profile)})
    if args.profile_from_bench is not None:
        profile = profile_from_bench(args.profile_from_bench, base=profile)
    if args.profile_from_measured is not None:
        profile = profile_from_measurements(args.profile_from_measured, profile, args.profile_from_measured.stem)
    return profile


def _overrides(items: list[str], profile: TimingProfile) -> dict:
    out = {}
    for item in items:
        key, sep, raw = item.partition("=")
        current = getattr(profile, key, None)
        if not sep or key not in TimingProfile.__dataclass_fields__ or isinstance(current, tuple):
            raise ProfileError(f"--set {item!r}: expected FIELD=VALUE for a scalar profile field")
        out[key] = type(current)(raw)
    return out


def simulate(profile, config: SimConfig, name: str, rows, slo: Slo) -> dict:
    start = time.perf_counter()
    sim = ClusterSim(profile, config, name)
    records = sim.run(rows)
    return summarize(sim, records, slo, time.perf_counter() - start)


def _header(args: argparse.Namespace, profile, num_rows: int) -> dict:
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.node()} {platform.machine()} python {platform.python_version()}",
        "trace": str(args.trace),
        "num_requests": num_rows,
        "time_scale": args.time_scale,
        "num_workers": args.workers,
        "num_prefill_workers": args.prefill_workers,
        "profile": profile.to_dict(),
        "slo": {"ttft_s": args.slo_ttft_s, "itl_s": args.slo_itl_s},
        "admission_rejection": False,
        "seed": args.seed,
        "kv_overlap_weight": args.kv_overlap_weight,
        "kv_inflight_weight": args.kv_inflight_weight,
        "kv_host_gb": args.kv_host_gb,
        "kv_disk_gb": args.kv_disk_gb,
        "routers": args.routers,
    }
