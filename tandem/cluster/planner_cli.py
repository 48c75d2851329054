"""`tandem sim --planner sla`: the trace against a cluster the real planner scales (once per planner model: the
engine's truth or a perturbed one) and against the cheapest static pair found by search. Argument parsing and
orchestration only."""

import argparse

from engines.timing.profile import ProfileError, TimingProfile
from services.planner.calibration import CalibrationConfig
from services.planner.feedback import FeedbackConfig, FeedbackError
from services.planner.perf_model import Sizing, Slo
from services.planner.predictors import PREDICTORS
from services.planner.prefill_queue import PrefillQueueConfig
from services.planner.state_machine import PlannerConfig, RoleBounds
from services.planner.types import PlannerConfigError
from tandem.cluster.planner_model import parse_scales, planner_profiles
from tandem.cluster.planner_report import format_table, write_json, write_plot
from tandem.cluster.planner_search import SearchError
from tandem.cluster.planner_sim import PlannerSimConfig, run_all


def add_planner_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("planner", "with --planner sla: replay against a cluster the planner scales")
    g.add_argument("--planner", choices=["sla"], default=None, help="scale the simulated cluster with the planner")
    g.add_argument(
        "--planner-profile",
        default=None,
        help="the planner's timing model (a shipped name or JSON path); default: the engine's --profile",
    )
    g.add_argument(
        "--planner-profile-scale",
        default="1",
        help="multiply the planner model's step times, one run each: e.g. 0.7,1,1.3 (0.7 = optimistic)",
    )
    g.add_argument("--slo-ttft-ms", type=float, default=500.0)
    g.add_argument("--slo-itl-ms", type=float, default=50.0, help="per request: mean time between its tokens")
    g.add_argument(
        "--start-delay-s", type=float, default=30.0, help="a new replica serves this long after it is asked for"
    )
    g.add_argument("--adjustment-interval-s", type=float, default=60.0)
    g.add_argument("--tick-s", type=float, default=5.0, help="the fast correction loop's period")
    g.add_argument(
        "--heartbeat-s",
        type=float,
        default=PlannerSimConfig().heartbeat_interval_s,
        help="workers report their load to the router this often (0: after every change)",
    )
    g.add_argument("--predictor", choices=PREDICTORS, default=PlannerConfig().predictor)
    g.add_argument("--min-prefill", type=int, default=1)
    g.add_argument("--max-prefill", type=int, default=32, help="0: no prefill pool (aggregated serving)")
    g.add_argument("--min-decode", type=int, default=1)
    g.add_argument("--max-decode", type=int, default=32)
    g.add_argument("--initial-prefill", type=int, default=None, help="start here (default: --min-prefill)")
    g.add_argument("--initial-decode", type=int, default=None, help="start here (default: --min-decode)")
    g.add_argument(
        "--itl-headroom",
        type=float,
        default=Sizing().itl_headroom,
        help="size decode steps at this fraction of the ITL SLO",
    )
    g.add_argument("--prefill-max-utilization", type=float, default=Sizing().prefill_max_utilization)
    g.add_argument(
        "--down-stabilization",
        type=int,
        default=PlannerConfig().down_stabilization,
        help="the model's count is the highest of its last N adjustments",
    )
    g.add_argument(
        "--feedback-up-gain",
        type=float,
        default=FeedbackConfig().up_gain,
        help="headroom from the SLO error: factor x (1 + gain x share of an interval's ticks violated); default 0: off",
    )
    g.add_argument(
        "--feedback-down-factor",
        type=float,
        default=FeedbackConfig().down_factor,
        help="... and x this after an interval calm with one worker fewer (1 with gain 0: no feedback)",
    )
    g.add_argument("--feedback-max-factor", type=float, default=FeedbackConfig().max_factor)
    g.add_argument(
        "--no-calibration",
        action="store_true",
        help="trust the model's speed (default: corrected from the workers' measured busy time)",
    )
    g.add_argument(
        "--calibration-weight",
        type=float,
        default=CalibrationConfig().weight,
        help="how far one interval's measured speed moves the model's (0: off, 1: the newest alone)",
    )
    g.add_argument("--miss-budget", type=float, default=FeedbackConfig().budget, help="the share let miss the SLO")
    g.add_argument(
        "--miss-window-ticks",
        type=int,
        default=PlannerConfig().miss_window_ticks,
        help="the fast loop judges the missed share over this many ticks",
    )
    g.add_argument(
        "--miss-deviations",
        type=float,
        default=PlannerConfig().miss_deviations,
        help="... and adds only when the misses exceed the budget by this many binomial deviations (0: the share)",
    )
    g.add_argument("--climb-ticks", type=int, default=PlannerConfig().climb_ticks, help="a climb: over this many ticks")
    g.add_argument(
        "--climb-ratio",
        type=float,
        default=PlannerConfig().climb_ratio,
        help="... arrivals at >= this x the predicted rate (0: off)",
    )
    g.add_argument(
        "--climb-deviations",
        type=float,
        default=PlannerConfig().climb_deviations,
        help="... and this many standard deviations over it, dispersion counted (0: the ratio alone)",
    )
    g.add_argument(
        "--burst-headroom",
        type=float,
        default=PlannerConfig().burst_headroom,
        help="size for this many times the predicted rate (1: none)",
    )
    g.add_argument(
        "--burst-memory",
        type=int,
        default=PlannerConfig().burst_memory,
        help="headroom from the largest burst of this many intervals, --burst-headroom its cap (0: fixed)",
    )
    g.add_argument(
        "--decode-burst-headroom",
        type=float,
        default=PlannerConfig().decode_burst_headroom,
        help="the decode pool's headroom, at most --burst-headroom (0: --burst-headroom)",
    )
    g.add_argument(
        "--rise-lead",
        type=float,
        default=PlannerConfig().rise_lead,
        help="the base rate's last rise carried this many intervals ahead, never a fall (0: off)",
    )
    g.add_argument(
        "--prefill-miss-share",
        type=float,
        default=PrefillQueueConfig().miss_share,
        help="prefill sized by the TTFT tail: the share of prompts let queue past the SLO (0: the utilization cap)",
    )
    g.add_argument(
        "--proportional-up",
        action="store_true",
        help="the fast loop adds in proportion to a violation (default: one replica per violation)",
    )
    g.add_argument("--disagg-min-tokens", type=int, default=0, help="the simulated router's threshold")
    g.add_argument("--jobs", type=int, default=1, help="run the planner runs and the search in this many processes")
    g.add_argument(
        "--keep-requests",
        action="store_true",
        help="list every request (timing, workers) in each run's JSON, for bench/planner/miss_buckets.py",
    )
    g.add_argument(
        "--no-baseline",
        action="store_true",
        help="skip the search for the cheapest static pair (e.g. for the oscillation check)",
    )


def planner_config(args: argparse.Namespace) -> PlannerSimConfig:
    prefill = RoleBounds(args.min_prefill if args.max_prefill else 0, args.max_prefill)
    decode = RoleBounds(args.min_decode, args.max_decode)
    _check_bounds(args, prefill, decode)
    try:
        planner = PlannerConfig(
            adjustment_interval_s=args.adjustment_interval_s,
            prefill=prefill,
            decode=decode,
            predictor=args.predictor,
            down_stabilization=args.down_stabilization,
            feedback=FeedbackConfig(
                budget=args.miss_budget,
                up_gain=args.feedback_up_gain,
                down_factor=args.feedback_down_factor,
                max_factor=args.feedback_max_factor,
            ),
            is_proportional_up=args.proportional_up,
            calibration=CalibrationConfig(  # NOTE: weight 0 is off, as TANDEM_PLANNER_CALIBRATION_WEIGHT 0
                is_enabled=not args.no_calibration and args.calibration_weight != 0,
                weight=args.calibration_weight or CalibrationConfig().weight,
            ),
            miss_window_ticks=args.miss_window_ticks,
            miss_deviations=args.miss_deviations,
            climb_ticks=args.climb_ticks,
            climb_ratio=args.climb_ratio,
            climb_deviations=args.climb_deviations,
            burst_headroom=args.burst_headroom,
            burst_memory=args.burst_memory,
            decode_burst_headroom=args.decode_burst_headroom,
            rise_lead=args.rise_lead,
            prefill_queue=PrefillQueueConfig(args.prefill_miss_share),
        )
    except FeedbackError as exc:
        raise SystemExit(f"tandem sim: --feedback-* or --miss-budget: {exc}") from None
    except PlannerConfigError as exc:
        raise SystemExit(f"tandem sim: {exc}") from None
    initial = None
    if args.initial_prefill is not None or args.initial_decode is not None:
        initial = (
            prefill.min_replicas if args.initial_prefill is None else args.initial_prefill,
            decode.min_replicas if args.initial_decode is None else args.initial_decode,
        )
    names = [n.strip() for n in args.policies.split(",") if n.strip()]
    policy = names[0] if len(names) == 1 else "least_loaded"  # NOTE: the router's default unless one is named
    return PlannerSimConfig(
        planner,
        Slo(args.slo_ttft_ms / 1e3, args.slo_itl_ms / 1e3),
        Sizing(args.itl_headroom, args.prefill_max_utilization),
        args.tick_s,
        args.start_delay_s,
        policy=policy,
        seed=args.seed,
        heartbeat_interval_s=args.heartbeat_s,
        disagg_min_tokens=args.disagg_min_tokens,
        initial=initial,
        search_baseline=not args.no_baseline,
        keep_requests=args.keep_requests,
    )


def _check_bounds(args: argparse.Namespace, prefill: RoleBounds, decode: RoleBounds) -> None:
    if (
        min(prefill.min_replicas, prefill.max_replicas, decode.min_replicas) < 0
        or decode.max_replicas < 1
        or prefill.min_replicas > prefill.max_replicas
        or decode.min_replicas > decode.max_replicas
    ):
        raise SystemExit("tandem sim: need 0 <= --min-* <= --max-* and --max-decode >= 1")
    for name, value, bounds in (("prefill", args.initial_prefill, prefill), ("decode", args.initial_decode, decode)):
        if value is not None and not bounds.min_replicas <= value <= bounds.max_replicas:
            raise SystemExit(
                f"tandem sim: --initial-{name} {value} is outside [{bounds.min_replicas}, {bounds.max_replicas}]"
            )
    if args.heartbeat_s < 0:
        raise SystemExit("tandem sim: --heartbeat-s must be >= 0")


def run_planner_sim(args: argparse.Namespace, profile: TimingProfile, rows, header: dict) -> int:
    cfg = planner_config(args)
    try:
        models = planner_profiles(profile, args.planner_profile, parse_scales(args.planner_profile_scale))
        runs = run_all(profile, rows, cfg, models, args.jobs)
    except (ProfileError, SearchError) as exc:
        raise SystemExit(f"tandem sim: {exc}") from None
    five_minutes_s = 300.0 * args.time_scale  # NOTE: 5 minutes of the trace, in simulated seconds
    print(format_table(runs, five_minutes_s))
    header = {**header, "planner_config": _config_doc(args, cfg)}
    if args.json:
        write_json(args.json, header, runs, five_minutes_s)
        print(f"wrote {args.json}")
    prefix = args.plots or (args.json.with_suffix("") if args.json else None)
    if prefix:
        print(f"wrote {write_plot(prefix, runs, cfg.slo.ttft_s)}")
    return 0


def _config_doc(args: argparse.Namespace, cfg: PlannerSimConfig) -> dict:
    return {
        "slo_ttft_s": cfg.slo.ttft_s,
        "slo_itl_s": cfg.slo.itl_s,
        "start_delay_s": cfg.start_delay_s,
        "adjustment_interval_s": cfg.planner.adjustment_interval_s,
        "tick_s": cfg.tick_s,
        "predictor": cfg.planner.predictor,
        "itl_headroom": cfg.sizing.itl_headroom,
        "prefill_max_utilization": cfg.sizing.prefill_max_utilization,
        "down_stabilization": cfg.planner.down_stabilization,
        "feedback": {
            "up_gain": cfg.planner.feedback.up_gain,
            "down_factor": cfg.planner.feedback.down_factor,
            "max_factor": cfg.planner.feedback.max_factor,
        },
        "is_proportional_up": cfg.planner.is_proportional_up,
        "is_calibrated": cfg.planner.calibration.is_enabled,
        "calibration_weight": cfg.planner.calibration.weight,
        "miss_budget": cfg.planner.feedback.budget,
        "miss_window_ticks": cfg.planner.miss_window_ticks,
        "miss_deviations": cfg.planner.miss_deviations,
        "climb": {
            "ticks": cfg.planner.climb_ticks,
            "ratio": cfg.planner.climb_ratio,
            "deviations": cfg.planner.climb_deviations,
        },
        "burst_headroom": cfg.planner.burst_headroom,
        "burst_memory": cfg.planner.burst_memory,
        "decode_burst_headroom": cfg.planner.decode_burst_headroom,
        "rise_lead": cfg.planner.rise_lead,
        "prefill_miss_share": cfg.planner.prefill_queue.miss_share,
        "disagg_min_tokens": cfg.disagg_min_tokens,
        "bounds": {
            "prefill": [cfg.planner.prefill.min_replicas, cfg.planner.prefill.max_replicas],
            "decode": [cfg.planner.decode.min_replicas, cfg.planner.decode.max_replicas],
        },
        "initial": cfg.start_counts(),
        "planner_profile": args.planner_profile or "the engine's --profile",
        "planner_profile_scales": args.planner_profile_scale,
        "target_attainment": cfg.target_attainment,
        "policy": cfg.policy,
        "heartbeat_interval_s": cfg.heartbeat_interval_s,
    }
