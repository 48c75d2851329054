"""`tandem bench overhead`: what the control plane adds. The same closed-loop load runs (a) against a
zero engine in this process (its loop on a thread) and (b) through zero-engine stacks (gateway -> router -> worker, HTTP and gRPC)
that this command starts and stops, with 1 and then N gateway processes; tokens being free, the difference is
the services' cost. Every phase records the load average and each process's CPU time."""

import argparse
import asyncio
import logging
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from engines.base.errors import EngineError
from engines.base.types import EngineRequest, SamplingParams
from tandem.bench.http_client import Endpoint, StreamingClient
from tandem.bench.loadgen import (
    PromptMaker,
    RequestSpec,
    allowed_token_ids,
    run_schedule,
    synthetic_specs,
    warm_up_specs,
)
from tandem.bench.overhead_report import Phase, build_report, format_overhead
from tandem.bench.raw_client import RawStreamingClient
from tandem.bench.serve_report import write_json
from tandem.bench.serve_stats import RequestRecord, summarize_serve
from tandem.bench.tcp_conns import opened_to, snapshot

log = logging.getLogger(__name__)
# NOTE: with a prefill worker, every prompt takes the disaggregated path, however short or queued
_ALWAYS_DISAGGREGATE = {"TANDEM_ROUTER_DISAGG_MIN_TOKENS": "0", "TANDEM_ROUTER_PREFILL_MAX_WAITING": "1000000"}


@dataclass(frozen=True, slots=True)
class OverheadConfig:
    num_requests: int = 256  # at the highest concurrency; a quarter of it at concurrency 1
    concurrencies: tuple[int, ...] = (1, 16)
    gateway_workers: tuple[int, ...] = (1, 2)  # stacks to run; more than 1 only at the highest concurrency
    isl: int = 128
    osl: int = 128
    num_prefill: int = 0  # 1: disaggregated, the prompt's KV moves prefill -> decode
    num_warmup: int = 16
    model: Path | None = None  # None: a tiny config-only checkpoint in a temporary directory
    seed: int = 0
    client: str = "raw"  # the load generator: raw (raw_client.py) or httpx (what `bench serve` uses)
    compare_plaintext: bool = False  # also a 1-gateway stack without mTLS (TANDEM_GRPC_INSECURE=1): what mTLS costs
    # rounds of (secure, baseline) 1-gateway stacks, their order alternating, judged on medians; secure: mutual TLS
    # and signed KV handles (the default), baseline: plaintext and unsigned handles
    security_rounds: int = 0

    def num_requests_at(self, concurrency: int) -> int:
        return self.num_requests if concurrency > 1 else max(1, self.num_requests // 4)

    def concurrencies_for(self, workers: int) -> tuple[int, ...]:
        return tuple(sorted(self.concurrencies)) if workers == 1 else (max(self.concurrencies),)


class InProcessSender:
    """A loadgen.Send on an in-process zero engine: stamps each token-bearing delta as the HTTP client stamps chunks."""

    def __init__(self, engine, prompts: PromptMaker, clock: Callable[[], float] = time.perf_counter):
        self.engine, self.prompts, self.clock = engine, prompts, clock

    async def send(self, spec: RequestSpec) -> RequestRecord:
        request = EngineRequest(
            f"inproc-{spec.index}", tuple(self.prompts.prompt(spec)), SamplingParams(max_tokens=spec.osl)
        )
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
        phases = [asyncio.run(_run_in_process(model, cfg, prompts, c)) for c in sorted(cfg.concurrencies)]
        for workers in cfg.gateway_workers:
            phases += _run_through_stack(model, cfg, prompts, workers, (log_dir or Path(tmp) / "logs") / f"gw{workers}")
        if cfg.compare_plaintext:
            phases += _run_through_stack(
                model, cfg, prompts, 1, (log_dir or Path(tmp) / "logs") / "gw1-plaintext", is_plaintext=True
            )
        for r, is_plaintext in security_order(cfg.security_rounds):
            name = f"gw1-round{r}-{'plaintext' if is_plaintext else 'secure'}"
            for phase in _run_through_stack(
                model,
                cfg,
                prompts,
                1,
                (log_dir or Path(tmp) / "logs") / name,
                is_plaintext=is_plaintext,
                is_signed=not is_plaintext,
            ):
                phase.security_round = r
                phases.append(phase)
    config = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(cfg).items()}
    return build_report(config, phases)


def security_order(num_rounds: int) -> list[tuple[int, bool]]:
    """(round, is_plaintext) in run order: secure first in even rounds, plaintext first in odd ones, so a load that
    drifts during the run favours neither side."""
    return [
        (r, is_plaintext)
        for r in range(num_rounds)
        for is_plaintext in ((False, True) if r % 2 == 0 else (True, False))
    ]


def _tiny_model(out: Path) -> Path:
    from tandem.models.init import init_model

    return init_model(out, "llama", tiny=True, config_only=True)  # the zero engine needs no weights


def _specs(cfg: OverheadConfig, concurrency: int) -> list[RequestSpec]:
    return synthetic_specs(cfg.num_requests_at(concurrency), cfg.isl, cfg.osl, seed=cfg.seed)


async def _run_in_process(model: Path, cfg: OverheadConfig, prompts: PromptMaker, concurrency: int) -> Phase:
    from engines.core.client import EngineClient
    from engines.zero import zero_spec

    engine = EngineClient(zero_spec(str(model)))
    await engine.start()
    try:
        sender = InProcessSender(engine, prompts)
        await run_schedule(warm_up_specs(cfg.num_warmup, cfg.isl, cfg.osl), sender.send, concurrency)
        log.info("overhead: in-process at concurrency %d", concurrency)
        return await _measure(sender.send, _specs(cfg, concurrency), concurrency, 0, {})
    finally:
        await engine.shutdown()


def _run_through_stack(
    model: Path,
    cfg: OverheadConfig,
    prompts: PromptMaker,
    workers: int,
    log_dir: Path,
    is_plaintext: bool = False,
    is_signed: bool = True,
) -> list[Phase]:
    from tandem.launcher import Stack, StackConfig, free_port
    from tandem.stack_certs import KV_KEY_ENV

    env = {
        **(_ALWAYS_DISAGGREGATE if cfg.num_prefill else {}),
        **({"TANDEM_GRPC_INSECURE": "1"} if is_plaintext else {}),
        **({} if is_signed else {KV_KEY_ENV: ""}),
    }
    stack = Stack(
        StackConfig(
            model=str(model),
            engine="zero",
            num_prefill=cfg.num_prefill,
            num_decode=1,
            port=free_port(),
            num_threads=1,
            log_dir=log_dir,
            ready_timeout_s=120,
            env=env,
            num_gateway_workers=workers,
        )
    )
    try:
        stack.start()
        stack.wait_ready()
        pids = service_pids(stack)
        ports = {**stack.router_ports, **stack.worker_ports}  # gRPC: where a new connection is a TLS handshake
        phases = [
            asyncio.run(_run_http(stack.url, cfg, prompts, c, workers, pids, ports))
            for c in cfg.concurrencies_for(workers)
        ]
        for phase in phases:
            phase.is_plaintext = is_plaintext
        return phases
    finally:
        stack.stop()


async def _run_http(
    url: str,
    cfg: OverheadConfig,
    prompts: PromptMaker,
    concurrency: int,
    workers: int,
    pids: dict[str, list[int]],
    ports: dict[str, int],
) -> Phase:
    client_cls = RawStreamingClient if cfg.client == "raw" else StreamingClient
    async with client_cls(Endpoint(url), prompts, max_connections=concurrency) as client:
        await client.model_card()
        await run_schedule(warm_up_specs(cfg.num_warmup, cfg.isl, cfg.osl), client.send, concurrency)
        log.info("overhead: through %s at concurrency %d, %d gateway processes", url, concurrency, workers)
        return await _measure(client.send, _specs(cfg, concurrency), concurrency, workers, pids, ports)


async def _measure(
    send,
    specs: list[RequestSpec],
    concurrency: int,
    workers: int,
    pids: dict[str, list[int]],
    ports: dict[str, int] | None = None,
) -> Phase:
    load, cpu, connections = os.getloadavg()[0], cpu_seconds(pids), snapshot()
    summary = summarize_serve(await run_schedule(specs, send, concurrency))
    spent = {name: s - cpu[name] for name, s in cpu_seconds(pids).items()} if pids else {}
    opened = opened_to(connections, snapshot(), ports) if ports else {}
    return Phase(concurrency, workers, summary, (load, os.getloadavg()[0]), spent, grpc_connections_opened=opened)


def service_pids(stack) -> dict[str, list[int]]:
    """Each child of the stack with its own children (the gateway's processes under its supervisor)."""
    return {child.name: [child.proc.pid, *_descendants(child.proc.pid)] for child in stack.children}


def _descendants(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        for kid in map(int, task.read_text().split()):
            found += [kid, *_descendants(kid)]
    return found


def cpu_seconds(pids: dict[str, list[int]]) -> dict[str, float]:
    """User + system CPU seconds so far of each named group of processes, and of this one ("client")."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {name: sum(_ticks(pid) for pid in group) / tick for name, group in pids.items()}
    times = os.times()
    out["client"] = times.user + times.system
    return out


def _ticks(pid: int) -> int:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:  # gone
        return 0
    return int(fields[11]) + int(fields[12])  # utime, stime


# -- CLI ---------------------------------------------------------------------------------------
def add_overhead_command(bench_commands) -> None:
    p = bench_commands.add_parser(
        "overhead",
        help="control-plane overhead: zero engine in-process vs through "
        "gateway/router/worker, 1 and N gateway processes",
    )
    p.add_argument("--num-requests", type=int, default=256, help="at the highest concurrency (a quarter at 1)")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    p.add_argument(
        "--gateway-workers",
        type=int,
        nargs="+",
        default=[1, 2],
        help="gateway processes of each stack; more than 1 runs the highest concurrency only",
    )
    p.add_argument("--isl", type=int, default=128)
    p.add_argument("--osl", type=int, default=128)
    p.add_argument("--prefill", action="store_true", help="add one prefill worker (disaggregated path)")
    p.add_argument("--warmup", type=int, default=16, help="untimed requests before each phase")
    p.add_argument("--model", type=Path, default=None, help="model dir for tokenizer/config (default: tiny)")
    p.add_argument("--log-dir", type=Path, default=None, help="keep the stacks' logs here")
    p.add_argument(
        "--client",
        choices=("raw", "httpx"),
        default="raw",
        help="load generator: raw asyncio sockets (lean), or httpx as `bench serve` uses",
    )
    p.add_argument(
        "--plaintext-too",
        action="store_true",
        help="also run a 1-gateway stack without mTLS (TANDEM_GRPC_INSECURE=1): what mTLS costs",
    )
    p.add_argument(
        "--security-rounds",
        type=int,
        default=0,
        help="rounds of a secure (mTLS, signed KV handles) and a baseline (plaintext, unsigned) 1-gateway "
        "stack, order alternating; the mTLS targets are judged on the rounds' medians",
    )
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    p.set_defaults(func=cmd_bench_overhead)


def cmd_bench_overhead(args: argparse.Namespace) -> int:
    if 1 not in args.gateway_workers:
        raise SystemExit("tandem bench overhead: --gateway-workers must include 1 (the reference)")
    cfg = OverheadConfig(
        args.num_requests,
        tuple(args.concurrency),
        tuple(args.gateway_workers),
        args.isl,
        args.osl,
        int(args.prefill),
        args.warmup,
        args.model,
        client=args.client,
        compare_plaintext=args.plaintext_too,
        security_rounds=args.security_rounds,
    )
    report = run_overhead(cfg, args.log_dir)
    print(format_overhead(report))
    if args.json is not None:
        write_json(args.json, report)
        print(f"\nwrote {args.json}")
    errors = sum(p["summary"]["num_errors"] for p in report["phases"])
    return 0 if errors == 0 else 1
