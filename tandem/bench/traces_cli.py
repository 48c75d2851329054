"""`tandem bench traces`: write a synthetic trace (diurnal with bursts, constant, llm-d's precise-prefix shape)
as Mooncake-schema JSONL from a seed. Argument parsing only; the generators are tandem/bench/trace_gen.py."""

import argparse
from pathlib import Path

from tandem.bench.trace_gen import Lengths, PrefixShape, constant_load, diurnal_bursty, precise_prefix, write_jsonl

KINDS = ("diurnal", "constant", "precise-prefix")


def add_traces_command(sub) -> None:
    p = sub.add_parser("traces", help="write a synthetic trace (Mooncake JSONL schema) from a seed")
    p.add_argument("kind", choices=KINDS)
    p.add_argument("--out", type=Path, required=True, help="the JSONL file to write")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--seconds", type=float, default=3600.0, help="diurnal, constant: the trace's length")
    p.add_argument("--rate", type=float, default=6.0, help="diurnal: mean req/s; constant: req/s")
    p.add_argument("--amplitude", type=float, default=0.6, help="diurnal: trough and peak at (1 -/+ this) x mean")
    p.add_argument("--period-s", type=float, default=1800.0, help="diurnal: one day, compressed")
    p.add_argument("--bursts-per-hour", type=float, default=6.0)
    p.add_argument("--burst-factor", type=float, default=2.5)
    p.add_argument("--burst-s", type=float, default=60.0)
    p.add_argument("--isl-median", type=float, default=Lengths().isl_median)
    p.add_argument("--osl-median", type=float, default=Lengths().osl_median)
    p.add_argument(
        "--qps",
        default=None,
        help="precise-prefix: QPS stages (default: llm-d's published warm-up and "
        "ladder, 15 then 3 to 60 QPS with their own lengths)",
    )
    p.add_argument("--stage-s", type=float, default=60.0, help="precise-prefix with --qps: each stage's length")
    p.add_argument("--output-tokens", type=int, default=PrefixShape().output_tokens, help="precise-prefix")
    p.set_defaults(func=run_traces)


def run_traces(args: argparse.Namespace) -> int:
    rows = build(args)
    write_jsonl(rows, args.out)
    span = rows[-1].arrival_s if rows else 0.0
    print(f"wrote {args.out}: {len(rows)} requests over {span:.0f} s (seed {args.seed})")
    return 0


def build(args: argparse.Namespace):
    if (
        min(args.seconds, args.rate, args.period_s, args.stage_s, args.burst_s) <= 0
        or args.output_tokens < 1
        or not 0 <= args.amplitude < 1
        or args.burst_factor < 1
        or args.bursts_per_hour < 0
    ):
        raise SystemExit(
            "tandem bench traces: lengths, rates and periods must be > 0, 0 <= --amplitude < 1, --burst-factor >= 1"
        )
    lengths = Lengths(isl_median=args.isl_median, osl_median=args.osl_median)
    if args.kind == "diurnal":
        return diurnal_bursty(
            args.seed,
            args.seconds,
            args.rate,
            args.amplitude,
            args.period_s,
            args.bursts_per_hour,
            args.burst_factor,
            args.burst_s,
            lengths,
        )
    if args.kind == "constant":
        return constant_load(args.seed, args.seconds, args.rate, lengths)
    if args.qps is None:
        return precise_prefix(args.seed, PrefixShape(output_tokens=args.output_tokens))
    try:
        qps = tuple(float(q) for q in args.qps.split(","))
    except ValueError:
        raise SystemExit(f"tandem bench traces: --qps {args.qps!r}: expected numbers separated by commas") from None
    if not qps or min(qps) <= 0:
        raise SystemExit("tandem bench traces: every --qps must be > 0")
    return precise_prefix(args.seed, PrefixShape.uniform(qps, args.stage_s, output_tokens=args.output_tokens))
