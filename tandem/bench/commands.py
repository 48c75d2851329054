"""`tandem bench` and its subcommands: argument parsing only. Each benchmark module is imported when its
command runs, so `tandem` starts without loading torch."""

import argparse

from tandem.bench.engine_args import add_engine_arguments
from tandem.bench.kv_bench import add_kv_command
from tandem.bench.profile_bench import add_profile_command
from tandem.bench.router_bench import add_router_command
from tandem.bench.serve_bench import add_serving_commands
from tandem.bench.traces_cli import add_traces_command


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


def run_bench_engine(args: argparse.Namespace) -> int:
    if args.speculative:
        from tandem.bench.spec_bench import cmd_bench_spec

        return cmd_bench_spec(args)
    from tandem.bench.engine_bench import cmd_bench_engine  # NOTE: torch and transformers load here

    return cmd_bench_engine(args)
