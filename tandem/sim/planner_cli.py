"""`tandem sim --planner sla`: the trace against a cluster the real planner scales, and against static
provisioning at the trace's peak and mean. Argument parsing and orchestration only."""
import argparse

from services.planner.perf_model import Sizing, Slo
from services.planner.predictors import PREDICTORS
from services.planner.state_machine import PlannerConfig, RoleBounds
from tandem.sim.planner_report import format_table, write_json, write_plot
from tandem.sim.planner_sim import PlannerSimConfig, run_all


def add_planner_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("planner", "with --planner sla: replay against a cluster the planner scales")
    g.add_argument("--planner", choices=["sla"], default=None, help="scale the simulated cluster with the planner")
    g.add_argument("--slo-ttft-ms", type=float, default=500.0)
    g.add_argument("--slo-itl-ms", type=float, default=50.0, help="per request: mean time between its tokens")
    g.add_argument("--start-delay-s", type=float, default=30.0, help="a new replica serves this long after it is asked for")
    g.add_argument("--adjustment-interval-s", type=float, default=60.0)
    g.add_argument("--tick-s", type=float, default=5.0, help="the fast correction loop's period")
    g.add_argument("--predictor", choices=PREDICTORS, default=PlannerConfig().predictor)
    g.add_argument("--min-prefill", type=int, default=1)
    g.add_argument("--max-prefill", type=int, default=32, help="0: no prefill pool (aggregated serving)")
    g.add_argument("--min-decode", type=int, default=1)
    g.add_argument("--max-decode", type=int, default=32)
    g.add_argument("--itl-headroom", type=float, default=Sizing().itl_headroom,
                   help="size decode steps at this fraction of the ITL SLO")
    g.add_argument("--prefill-max-utilization", type=float, default=Sizing().prefill_max_utilization)
    g.add_argument("--down-stabilization", type=int, default=PlannerConfig().down_stabilization,
                   help="the model's count is the highest of its last N adjustments")
    g.add_argument("--disagg-min-tokens", type=int, default=0, help="the simulated router's threshold")
    g.add_argument("--peak-window-s", type=float, default=None,
                   help="static peak sizes for the busiest window this long (default: one trace minute)")


def planner_config(args: argparse.Namespace) -> PlannerSimConfig:
    planner = PlannerConfig(adjustment_interval_s=args.adjustment_interval_s,
                            prefill=RoleBounds(args.min_prefill if args.max_prefill else 0, args.max_prefill),
                            decode=RoleBounds(args.min_decode, args.max_decode), predictor=args.predictor,
                            down_stabilization=args.down_stabilization)
    peak_window = args.peak_window_s or 60.0 * args.time_scale
    names = [n.strip() for n in args.policies.split(",") if n.strip()]
    policy = names[0] if len(names) == 1 else "least_loaded"  # NOTE: the router's default unless one is named
    return PlannerSimConfig(planner, Slo(args.slo_ttft_ms / 1e3, args.slo_itl_ms / 1e3),
                            Sizing(args.itl_headroom, args.prefill_max_utilization), args.tick_s,
                            peak_window, args.start_delay_s, policy=policy, seed=args.seed,
                            disagg_min_tokens=args.disagg_min_tokens)


def run_planner_sim(args: argparse.Namespace, profile, rows, header: dict) -> int:
    cfg = planner_config(args)
    runs = run_all(profile, rows, cfg)
    print(format_table(runs))
    header = {**header, "planner_config": _config_doc(args, cfg)}
    if args.json:
        write_json(args.json, header, runs)
        print(f"wrote {args.json}")
    prefix = args.plots or (args.json.with_suffix("") if args.json else None)
    if prefix:
        print(f"wrote {write_plot(prefix, runs, cfg.slo.ttft_s)}")
    return 0


def _config_doc(args: argparse.Namespace, cfg: PlannerSimConfig) -> dict:
    return {"slo_ttft_s": cfg.slo.ttft_s, "slo_itl_s": cfg.slo.itl_s, "start_delay_s": cfg.start_delay_s,
            "adjustment_interval_s": cfg.planner.adjustment_interval_s, "tick_s": cfg.tick_s,
            "predictor": cfg.planner.predictor, "itl_headroom": cfg.sizing.itl_headroom,
            "prefill_max_utilization": cfg.sizing.prefill_max_utilization, "peak_window_s": cfg.peak_window_s,
            "down_stabilization": cfg.planner.down_stabilization, "disagg_min_tokens": cfg.disagg_min_tokens,
            "bounds": {"prefill": [cfg.planner.prefill.min_replicas, cfg.planner.prefill.max_replicas],
                       "decode": [cfg.planner.decode.min_replicas, cfg.planner.decode.max_replicas]},
            "policy": cfg.policy, "heartbeat_interval_s": cfg.heartbeat_interval_s}
