"""`tandem bench engine`: the native engine against transformers on one model, one machine, one run.
Orchestrates the workloads and the roofline measurement; the runners do the timing, report.py the output."""

import argparse
import asyncio
import concurrent.futures
import json
import logging
import multiprocessing
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from engines.native.config import ModelConfig
from tandem.bench import hf_baseline, native_runner
from tandem.bench.engine_args import add_engine_arguments, resolve_model
from tandem.bench.jsonsafe import json_safe
from tandem.bench.report import NATIVE, TRANSFORMERS, WorkloadResult, build_report, format_report
from tandem.bench.roofline import GemmRate, GemmShape, fastest, linear_shapes, measure_gemm_rate
from tandem.bench.stats import RunSummary, summarize
from tandem.bench.workload import Workload, prompts_for

log = logging.getLogger(__name__)
ENGINES = (NATIVE, TRANSFORMERS)
_WARM_UP_OSL = 4


@dataclass(frozen=True, slots=True)
class BenchConfig:
    model_dir: Path
    dtype: str = "float32"
    threads: int = 1
    num_requests: int = 32
    isl: int = 128
    osl: int = 128
    engines: tuple[str, ...] = ENGINES

    def workloads(self) -> list[Workload]:
        return [
            Workload("concurrent", self.num_requests, self.isl, self.osl, seed=0),
            Workload("batch1", 1, self.isl, self.osl, seed=1),
        ]

    def warm_up(self) -> Workload:
        # NOTE: its own seed, so the timed prompts never hit the native prefix cache
        return Workload("warm_up", self.num_requests, self.isl, _WARM_UP_OSL, seed=2)


def run_bench(cfg: BenchConfig) -> dict:
    torch.set_num_threads(cfg.threads)
    workloads = cfg.workloads()
    prompts = {w.name: prompts_for(cfg.model_dir, w) for w in [*workloads, cfg.warm_up()]}
    shapes = linear_shapes(ModelConfig.from_dir(cfg.model_dir))
    gemms_before = _measure_gemms(shapes, workloads, cfg.dtype)
    summaries, mode = _run_engines(cfg, workloads, prompts)
    # NOTE: measured before and after the engines, fastest kept: on a shared machine a neighbour's
    # burst during one measurement would otherwise lower the roofline and inflate every fraction.
    gemms_after = _measure_gemms(shapes, workloads, cfg.dtype)
    results = [
        WorkloadResult(w, fastest([gemms_before[w.name], gemms_after[w.name]]), summaries[w.name]) for w in workloads
    ]
    return build_report(_header(cfg, mode), results, hf_baseline.count_parameters(cfg.model_dir))


def _run_engines(cfg: BenchConfig, workloads: list[Workload], prompts: dict) -> tuple[dict, str]:
    """One engine at a time, never both loaded: {workload name: {engine name: summary}}, transformers' mode."""
    summaries: dict[str, dict[str, RunSummary]] = {w.name: {} for w in workloads}
    mode = "not run"
    if NATIVE in cfg.engines:
        for name, summary in _in_fresh_process(_native_main, cfg, workloads, prompts).items():
            summaries[name][NATIVE] = summary
    if TRANSFORMERS in cfg.engines:
        results, mode = _in_fresh_process(_run_transformers, cfg, workloads, prompts)
        for name, summary in results.items():
            summaries[name][TRANSFORMERS] = summary
    return summaries, mode


def _in_fresh_process(fn, *args):
    """Each engine in its own process: none inherits the other's memory, and neither shares an
    OpenMP pool with the roofline timing (a pool first used by one thread slows every other)."""
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        return pool.submit(fn, *args).result()


def _native_main(cfg: BenchConfig, workloads: list[Workload], prompts: dict) -> dict[str, RunSummary]:
    return asyncio.run(_run_native(cfg, workloads, prompts))


def _measure_gemms(shapes: list[GemmShape], workloads: list[Workload], dtype: str) -> dict[str, GemmRate]:
    log.info("roofline: timing %d GEMM shapes at M=%s", len(shapes), [w.num_requests for w in workloads])
    return {w.name: measure_gemm_rate(shapes, w.num_requests, dtype) for w in workloads}


async def _run_native(cfg: BenchConfig, workloads: list[Workload], prompts: dict) -> dict[str, RunSummary]:
    engine = native_runner.make_engine(
        cfg.model_dir, cfg.dtype, cfg.threads, max_num_seqs=cfg.num_requests, max_len=cfg.isl + cfg.osl
    )
    await engine.start()
    try:
        log.info("native: warm-up")
        await native_runner.run_requests(engine, prompts["warm_up"], _WARM_UP_OSL, prefix="warm")
        out = {}
        for w in workloads:
            log.info("native: %s", w.name)
            out[w.name] = summarize(await native_runner.run_requests(engine, prompts[w.name], w.osl, prefix=w.name))
        return out
    finally:
        await engine.shutdown()


def _run_transformers(cfg: BenchConfig, workloads: list[Workload], prompts: dict) -> tuple[dict, str]:
    torch.set_num_threads(cfg.threads)
    runner = hf_baseline.HfRunner(cfg.model_dir, cfg.dtype)
    log.info("transformers: warm-up")
    runner.warm_up(prompts["warm_up"])
    out = {}
    for w in workloads:
        log.info("transformers: %s", w.name)
        out[w.name] = summarize(runner.run(prompts[w.name], w.osl))
    return out, runner.mode


def _header(cfg: BenchConfig, mode: str) -> dict:
    import transformers

    return {
        "model": str(cfg.model_dir),
        "dtype": cfg.dtype,
        "threads": cfg.threads,
        "greedy": True,
        "transformers_mode": mode,
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
    }


# -- CLI (the argument parser is in tandem/bench/engine_args.py, which the `tandem` command loads) ---------
def cmd_bench_engine(args: argparse.Namespace) -> int:
    engines = tuple(e.strip() for e in args.engines.split(",") if e.strip())
    if not engines or set(engines) - set(ENGINES):
        raise SystemExit(f"--engines must be a subset of {','.join(ENGINES)}, got {args.engines!r}")
    cfg = BenchConfig(
        resolve_model(args.model), args.dtype, args.threads, args.num_requests, args.isl, args.osl, engines
    )
    report = run_bench(cfg)
    print(format_report(report))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(json_safe(report), indent=2) + "\n")
        print(f"\nwrote {args.json}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tandem.bench.engine_bench")
    add_engine_arguments(parser)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    return cmd_bench_engine(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
