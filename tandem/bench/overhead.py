"""`tandem bench overhead`: what the control plane adds. The same closed-loop load runs (a) against a
ZeroCostEngine in this process and (b) through a zero-engine stack (gateway -> router -> worker, HTTP and
gRPC) that this command starts and stops; the difference is the services' cost, tokens being free."""
import argparse
import asyncio
import logging
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from engines.base.errors import EngineError
from engines.base.types import EngineRequest, SamplingParams
from tandem.bench.http_client import Endpoint, StreamingClient
from tandem.bench.loadgen import (PromptMaker, RequestSpec, allowed_token_ids, run_schedule, synthetic_specs,
                                  warm_up_specs)
from tandem.bench.serve_report import format_rows, ms, rate, write_json
from tandem.bench.serve_stats import RequestRecord, ServeSummary, summarize_serve

log = logging.getLogger(__name__)
# NOTE: with a prefill worker, every prompt takes the disaggregated path, however short or queued
_ALWAYS_DISAGGREGATE = {"TANDEM_ROUTER_DISAGG_MIN_TOKENS": "0", "TANDEM_ROUTER_PREFILL_MAX_WAITING": "1000000"}


@dataclass(frozen=True, slots=True)
class OverheadConfig:
    num_requests: int = 256
    concurrency: int = 16
    isl: int = 128
    osl: int = 128
    num_prefill: int = 0  # 1: disaggregated, the prompt's KV moves prefill -> decode
    num_warmup: int = 16
    model: Path | None = None  # None: a tiny config-only checkpoint in a temporary directory
    max_added_ttft_s: float = 0.003  # target: p50 TTFT through the stack minus in-process
    min_relay_tokens_per_s: float = 20_000.0  # target: streamed tokens/s summed over every stream
    seed: int = 0


class InProcessSender:
    """A loadgen.Send on a ZeroCostEngine: stamps each token-bearing delta as the HTTP client stamps chunks."""

    def __init__(self, engine, prompts: PromptMaker, clock: Callable[[], float] = time.perf_counter):
        self.engine, self.prompts, self.clock = engine, prompts, clock

    async def send(self, spec: RequestSpec) -> RequestRecord:
        request = EngineRequest(f"inproc-{spec.index}", tuple(self.prompts.prompt(spec)),
                                SamplingParams(max_tokens=spec.osl))
        record = RequestRecord(submit_s=self.clock(), num_prompt_tokens=spec.isl)
        try:
            async for out in self.engine.add_request(request):
                now = self.clock()
                if out.new_token_ids:
                    record.chunk_times_s.append(now)
                    record.num_output_tokens += len(out.new_token_ids)
                record.error = out.error or record.error
        except EngineError as exc:
            record.error = f"{type(exc).__name__}: {exc}"
        record.end_s = self.clock()
        return record


def run_overhead(cfg: OverheadConfig, log_dir: Path | None = None) -> dict:
    with tempfile.TemporaryDirectory(prefix="tandem-overhead-") as tmp:
        model = cfg.model or _tiny_model(Path(tmp) / "tiny")
        prompts = PromptMaker(allowed_token_ids(model), cfg.seed)
        specs = synthetic_specs(cfg.num_requests, cfg.isl, cfg.osl, seed=cfg.seed)
        in_process = asyncio.run(_run_in_process(model, cfg, prompts, specs))
        through_stack = _run_through_stack(model, cfg, prompts, specs, log_dir or Path(tmp) / "logs")
    return build_report(cfg, in_process, through_stack)


def _tiny_model(out: Path) -> Path:
    from tandem.models.init import init_model

    return init_model(out, "llama", tiny=True, config_only=True)  # the zero engine needs no weights


async def _run_in_process(model: Path, cfg: OverheadConfig, prompts: PromptMaker,
                          specs: list[RequestSpec]) -> ServeSummary:
    from engines.zero import ZeroCostEngine

    engine = ZeroCostEngine(str(model))
    await engine.start()
    try:
        sender = InProcessSender(engine, prompts)
        await run_schedule(_warm_up(cfg), sender.send, cfg.concurrency)
        log.info("overhead: %d requests in-process", len(specs))
        return summarize_serve(await run_schedule(specs, sender.send, cfg.concurrency))
    finally:
        await engine.shutdown()


def _run_through_stack(model: Path, cfg: OverheadConfig, prompts: PromptMaker, specs: list[RequestSpec],
                       log_dir: Path) -> ServeSummary:
    from tandem.launcher import Stack, StackConfig, free_port

    stack = Stack(StackConfig(model=str(model), engine="zero", num_prefill=cfg.num_prefill, num_decode=1,
                              port=free_port(), num_threads=1, log_dir=log_dir, ready_timeout_s=120,
                              env=_ALWAYS_DISAGGREGATE if cfg.num_prefill else {}))
    try:
        stack.start()
        stack.wait_ready()
        return asyncio.run(_run_http(stack.url, cfg, prompts, specs))
    finally:
        stack.stop()


async def _run_http(url: str, cfg: OverheadConfig, prompts: PromptMaker, specs: list[RequestSpec]) -> ServeSummary:
    async with StreamingClient(Endpoint(url), prompts, max_connections=cfg.concurrency) as client:
        await client.model_card()
        await run_schedule(_warm_up(cfg), client.send, cfg.concurrency)
        log.info("overhead: %d requests through %s", len(specs), url)
        return summarize_serve(await run_schedule(specs, client.send, cfg.concurrency))


def _warm_up(cfg: OverheadConfig) -> list[RequestSpec]:
    return warm_up_specs(cfg.num_warmup, cfg.isl, cfg.osl)


def build_report(cfg: OverheadConfig, a: ServeSummary, b: ServeSummary) -> dict:
    added_ttft = b.ttft_s.p50 - a.ttft_s.p50
    relay = b.output_tokens_per_s
    return {
        "benchmark": "overhead", "config": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(cfg).items()},
        "added_ttft_p50_s": added_ttft, "relay_tokens_per_s": relay,
        "added_itl_p50_s": b.itl_s.p50 - a.itl_s.p50, "added_e2e_p50_s": b.e2e_s.p50 - a.e2e_s.p50,
        "is_added_ttft_met": added_ttft <= cfg.max_added_ttft_s,
        "is_relay_met": relay >= cfg.min_relay_tokens_per_s,
        "in_process": a.as_dict(), "through_stack": b.as_dict(),
    }


def format_overhead(report: dict) -> str:
    a, b, cfg = report["in_process"], report["through_stack"], report["config"]
    yes = {True: "yes", False: "NO"}
    rows = [
        ("TTFT p50 (ms)", ms(a["ttft_s"]["p50"]), ms(b["ttft_s"]["p50"]), ms(report["added_ttft_p50_s"]),
         f"<= {ms(cfg['max_added_ttft_s'])}", yes[report["is_added_ttft_met"]]),
        ("TTFT p99 (ms)", ms(a["ttft_s"]["p99"]), ms(b["ttft_s"]["p99"]),
         ms(b["ttft_s"]["p99"] - a["ttft_s"]["p99"]), "", ""),
        ("ITL p50 (ms)", ms(a["itl_s"]["p50"]), ms(b["itl_s"]["p50"]), ms(report["added_itl_p50_s"]), "", ""),
        ("end-to-end p50 (ms)", ms(a["e2e_s"]["p50"]), ms(b["e2e_s"]["p50"]), ms(report["added_e2e_p50_s"]), "", ""),
        ("streamed tokens/s (all streams)", rate(a["output_tokens_per_s"]), rate(b["output_tokens_per_s"]), "",
         f">= {rate(cfg['min_relay_tokens_per_s'])}", yes[report["is_relay_met"]]),
        ("requests/s", rate(a["requests_per_s"]), rate(b["requests_per_s"]), "", "", ""),
        ("errors", str(a["num_errors"]), str(b["num_errors"]), "", "", ""),
    ]
    head = (f"{cfg['num_requests']} requests, closed loop x{cfg['concurrency']}, isl {cfg['isl']}, osl {cfg['osl']}, "
            f"{cfg['num_prefill']} prefill + 1 decode zero-engine worker"
            + (" (every prompt disaggregated)" if cfg["num_prefill"] else ""))
    table = format_rows(("metric", "in-process", "through stack", "added", "target", "met"), rows)
    return head + "\n" + table


# -- CLI ---------------------------------------------------------------------------------------
def add_overhead_command(bench_commands) -> None:
    p = bench_commands.add_parser("overhead", help="control-plane overhead: zero engine in-process vs through "
                                                   "gateway/router/worker")
    p.add_argument("--num-requests", type=int, default=256)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--isl", type=int, default=128)
    p.add_argument("--osl", type=int, default=128)
    p.add_argument("--prefill", action="store_true", help="add one prefill worker (disaggregated path)")
    p.add_argument("--warmup", type=int, default=16, help="untimed requests before each side")
    p.add_argument("--model", type=Path, default=None, help="model dir for tokenizer/config (default: tiny)")
    p.add_argument("--log-dir", type=Path, default=None, help="keep the stack's logs here")
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    p.set_defaults(func=cmd_bench_overhead)


def cmd_bench_overhead(args: argparse.Namespace) -> int:
    cfg = OverheadConfig(args.num_requests, args.concurrency, args.isl, args.osl, int(args.prefill), args.warmup,
                         args.model)
    report = run_overhead(cfg, args.log_dir)
    print(format_overhead(report))
    if args.json is not None:
        write_json(args.json, report)
        print(f"\nwrote {args.json}")
    errors = report["in_process"]["num_errors"] + report["through_stack"]["num_errors"]
    return 0 if errors == 0 else 1
