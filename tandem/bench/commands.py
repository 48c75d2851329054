"""`tandem bench` and its subcommands: argument parsing only. Each benchmark module is imported when its
command runs, so `tandem` starts without loading torch."""
import argparse
import os
from pathlib import Path

from tandem.bench.kv_bench import add_kv_command
from tandem.bench.profile_bench import add_profile_command
from tandem.bench.router_bench import add_router_command
from tandem.bench.serve_bench import add_serving_commands
from tandem.bench.traces_cli import add_traces_command

ENGINE_NAMES = ("native", "transformers")


def add_bench_commands(subparsers) -> argparse.ArgumentParser:
    """Register `bench` (`engine`, `serve`, `overhead`, `router`) on a CLI's subparsers; `args.func(args)` runs it."""
    bench = subparsers.add_parser("bench", help="benchmarks")
    sub = bench.add_subparsers(dest="bench_command", required=True)
    engine = sub.add_parser("engine", help="native engine vs transformers: throughput, TTFT, ITL, roofline")
    add_engine_arguments(engine)
    engine.set_defaults(func=run_bench_engine)
    add_serving_commands(sub)  # serve, overhead
    add_router_command(sub)  # router
    add_profile_command(sub)  # profile: the step times the planner and the sim engine use
    add_kv_command(sub)  # kv: KV transfer between two worker processes, NIXL vs the gRPC fallback
    add_traces_command(sub)  # traces: synthetic traces (diurnal, constant, llm-d's precise-prefix shape)
    return bench


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", type=Path, default=None, help="checkpoint directory (default: SmolLM2)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--threads", type=int, default=all_cores(),
                        help="torch threads for both engines (default: all cores)")
    parser.add_argument("--num-requests", type=int, default=32, help="concurrent requests")
    parser.add_argument("--isl", type=int, default=128, help="prompt tokens per request")
    parser.add_argument("--osl", type=int, default=128, help="output tokens per request")
    parser.add_argument("--engines", default=",".join(ENGINE_NAMES),
                        help="comma-separated subset of " + ",".join(ENGINE_NAMES))
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument("--speculative", default=None, metavar="ngram|draft:DIR",
                        help="instead: speculative decoding against the same engine without it (copy-heavy and "
                             "chat workloads, batch 1 and 32 concurrent; transformers' prompt lookup at batch 1)")
    parser.add_argument("--repeats", type=int, default=2, help="--speculative: alternated pairs of runs (medians)")
    parser.add_argument("--spec-workloads", default="copy,chat,chat32,sampled,sampled32",
                        help="--speculative: which workloads (copy, chat, chat32, sampled, sampled32)")


def all_cores() -> int:
    affinity = getattr(os, "sched_getaffinity", None)  # Linux: the cores this process may use
    return len(affinity(0)) if affinity else os.cpu_count() or 1


def run_bench_engine(args: argparse.Namespace) -> int:
    if args.speculative:
        from tandem.bench.spec_bench import cmd_bench_spec

        return cmd_bench_spec(args)
    from tandem.bench.engine_bench import cmd_bench_engine  # NOTE: torch and transformers load here

    return cmd_bench_engine(args)
