"""`tandem bench serve`: replay synthetic or trace load against an OpenAI-compatible server and report
TTFT, ITL, end-to-end latency, throughput and goodput. Wires config, load, client and report together."""

import argparse
import asyncio
import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tandem.bench.http_client import Endpoint, ModelCard, ServerError, StreamingClient
from tandem.bench.loadgen import (
    FALLBACK_TOKEN_IDS,
    PromptMaker,
    RequestSpec,
    allowed_token_ids,
    run_schedule,
    synthetic_specs,
    trace_specs,
    warm_up_specs,
)
from tandem.bench.multiturn import (
    Conversations,
    Multiturn,
    answers_digest,
    rounds_summary,
    run_conversations,
    tokenizer_encode,
)
from tandem.bench.overhead import add_overhead_command
from tandem.bench.serve_report import format_rounds, format_summary, write_json
from tandem.bench.serve_stats import ServeSummary, Slo, summarize_serve
from tandem.bench.traces import TraceError, clip_all, load_trace

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ServeConfig:
    endpoint: Endpoint
    tokenizer: Path | None = None
    concurrency: int | None = None  # closed loop; with a rate or a trace, a cap on requests in flight
    request_rate: float | None = None  # open loop, Poisson arrivals
    num_requests: int = 100
    isl: int = 128
    osl: int = 128
    trace: Path | None = None
    time_scale: float = 1.0
    max_requests: int | None = None
    slo: Slo = field(default_factory=Slo)
    num_warmup: int = 0
    seed: int = 0
    multiturn: Multiturn | None = None  # --workload multiturn: conversations instead of independent requests

    def __post_init__(self) -> None:
        if self.multiturn is not None:
            if self.trace is not None or self.request_rate is not None:
                raise ValueError("--workload multiturn paces itself (--qps); drop --trace / --request-rate")
            return
        if self.trace is None and self.concurrency is None and self.request_rate is None:
            raise ValueError("give --concurrency N, --request-rate R or --trace FILE")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError(f"--concurrency must be >= 1, got {self.concurrency}")
        if self.request_rate is not None and self.request_rate <= 0:
            raise ValueError(f"--request-rate must be > 0, got {self.request_rate}")
        if self.trace is not None and self.request_rate is not None:
            raise ValueError("--request-rate and --trace exclude each other (scale a trace with --time-scale)")

    def describe_load(self) -> str:
        if self.multiturn is not None:
            return self.multiturn.describe()
        if self.trace is not None:
            load = f"trace {self.trace.name} x{self.time_scale:g} time scale"
        elif self.request_rate is not None:
            load = f"Poisson {self.request_rate:g} req/s, isl {self.isl}, osl {self.osl}"
        else:
            load = f"closed loop, isl {self.isl}, osl {self.osl}"
        return load + (f", at most {self.concurrency} in flight" if self.concurrency else "")


def build_specs(cfg: ServeConfig, card: ModelCard) -> tuple[list[RequestSpec], list[str]]:
    """The timed requests and notes on what was changed to fit the server."""
    notes = (
        []
        if cfg.tokenizer
        else [f"no --tokenizer: prompts use token ids {FALLBACK_TOKEN_IDS[0]}..{FALLBACK_TOKEN_IDS[1] - 1}"]
    )
    if cfg.trace is None:
        if card.max_model_len and cfg.isl + cfg.osl > card.max_model_len:
            notes.append(
                f"isl + osl = {cfg.isl + cfg.osl} exceeds the context ({card.max_model_len}): "
                "the server caps max_tokens"
            )
        return synthetic_specs(cfg.num_requests, cfg.isl, cfg.osl, cfg.request_rate, cfg.seed), notes
    rows = load_trace(cfg.trace, cfg.max_requests, cfg.time_scale)
    if card.max_model_len:
        rows, num_clipped = clip_all(rows, card.max_model_len)
        if num_clipped:
            notes.append(
                f"{num_clipped} of {len(rows)} trace rows scaled down in proportion to fit the "
                f"context of {card.max_model_len} tokens"
            )
    return trace_specs(rows), notes


async def run_serve(cfg: ServeConfig) -> tuple[ServeSummary, dict]:
    """The summary, and the report (config, notes, summary) as plain data for JSON."""
    if cfg.multiturn is not None:
        return await run_multiturn(cfg, cfg.multiturn)
    prompts = PromptMaker(allowed_token_ids(cfg.tokenizer), cfg.seed)
    async with StreamingClient(cfg.endpoint, prompts, max_connections=cfg.concurrency) as client:
        card = await client.model_card()
        specs, notes = build_specs(cfg, card)
        if cfg.num_warmup:
            warm_up = warm_up_specs(cfg.num_warmup, cfg.isl, min(cfg.osl, 16))
            await run_schedule(warm_up, client.send, cfg.concurrency or cfg.num_warmup)
        log.info("bench serve: %d requests, %s", len(specs), cfg.describe_load())
        records = await run_schedule(specs, client.send, cfg.concurrency)
    summary = summarize_serve(records, cfg.slo)
    report = {
        "benchmark": "serve",
        "url": cfg.endpoint.base_url,
        "model": client.model,
        "max_model_len": card.max_model_len,
        "load": cfg.describe_load(),
        "config": _config_dict(cfg),
        "notes": notes,
        "summary": summary.as_dict(),
    }
    return summary, report


async def run_multiturn(cfg: ServeConfig, mt: Multiturn) -> tuple[ServeSummary, dict]:
    """As run_serve, with `rounds` (TTFT by round) and the answers in the report."""
    tokenize = tokenizer_encode(cfg.tokenizer) if cfg.tokenizer else None
    conv = Conversations(mt, allowed_token_ids(cfg.tokenizer), cfg.seed, tokenize)
    notes = [] if tokenize else ["no --tokenizer: each answer goes back as stand-in ids of the same length"]
    async with StreamingClient(cfg.endpoint, conv, max_connections=mt.users) as client:
        card = await client.model_card()
        log.info("bench serve: %s", mt.describe())
        pairs = await run_conversations(conv, client.send)
    summary = summarize_serve([r for _, r in pairs], cfg.slo)
    report = {
        "benchmark": "serve",
        "url": cfg.endpoint.base_url,
        "model": client.model,
        "max_model_len": card.max_model_len,
        "load": cfg.describe_load(),
        "config": _config_dict(cfg),
        "notes": notes,
        "summary": summary.as_dict(),
        "rounds": rounds_summary(pairs, mt.rounds),
        "answers_sha256": answers_digest(conv),
        "answers": conv.answers,
    }
    return summary, report


def _config_dict(cfg: ServeConfig) -> dict:
    out = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(cfg).items() if k != "endpoint"}
    out["endpoint"] = {k: v for k, v in asdict(cfg.endpoint).items() if k != "api_key"}
    return out


# -- CLI ---------------------------------------------------------------------------------------
def add_serving_commands(bench_commands) -> None:
    """Register `serve` and `overhead` on the `tandem bench` subparsers."""
    serve = bench_commands.add_parser("serve", help="load an OpenAI-compatible server: TTFT, ITL, goodput")
    add_serve_arguments(serve)
    serve.set_defaults(func=cmd_bench_serve)
    add_overhead_command(bench_commands)


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--model", default="", help="model name to send (default: the first in /v1/models)")
    p.add_argument(
        "--tokenizer", type=Path, default=None, help="model directory whose vocabulary the prompt token ids come from"
    )
    p.add_argument("--concurrency", type=int, default=None, help="closed loop: requests in flight")
    p.add_argument("--request-rate", type=float, default=None, help="open loop: Poisson arrivals, req/s (inf ok)")
    p.add_argument("--num-requests", type=int, default=100)
    p.add_argument("--isl", type=int, default=128, help="prompt tokens per request (token-id prompts)")
    p.add_argument("--osl", type=int, default=128, help="max_tokens per request")
    p.add_argument("--trace", type=Path, default=None, help="Mooncake .jsonl or Azure .csv trace to replay")
    p.add_argument("--time-scale", type=float, default=1.0, help="multiply every trace arrival time by this")
    p.add_argument("--max-requests", type=int, default=None, help="replay only the first N trace rows")
    p.add_argument("--slo-ttft", type=float, default=None, metavar="MS", help="goodput: TTFT bound (ms)")
    p.add_argument("--slo-itl", type=float, default=None, metavar="MS", help="goodput: mean-ITL bound (ms)")
    p.add_argument("--warmup", type=int, default=0, help="untimed requests sent first")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument(
        "--extra-body",
        type=json.loads,
        default={},
        help="JSON merged into every request, e.g. '{\"ignore_eos\": true}' for vLLM",
    )
    p.add_argument("--api-key", default=None)
    p.add_argument("--timeout", type=float, default=600.0, help="per-request timeout (s)")
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    add_multiturn_arguments(p)
    add_structured_arguments(p)


def add_structured_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--structured",
        action="store_true",
        help="grammar cost: the same closed-loop load without and with a json_schema, at each "
        "--structured-concurrency, in one run (ITL p50 ratio; mask time per token with --metrics-url)",
    )
    p.add_argument(
        "--structured-concurrency",
        type=_ints,
        default=(1, 16),
        metavar="N,N",
        help="--structured: the concurrencies to run at (default 1,16)",
    )
    p.add_argument(
        "--structured-rounds",
        type=_positive,
        default=1,
        metavar="N",
        help="--structured: rounds of (plain, json_schema) per concurrency, alternating which runs first "
        "(default 1); the ratio is of the rounds' median ITL p50s",
    )
    p.add_argument(
        "--metrics-url",
        action="append",
        default=[],
        help="--structured: a worker's /metrics URL to read the grammar mask counters from (repeatable)",
    )


def _positive(text: str) -> int:
    (value,) = _ints(text) if "," not in text else (0,)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected one positive integer, got {text!r}")
    return value


def _ints(text: str) -> tuple[int, ...]:
    values = tuple(int(v) for v in text.split(","))
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers separated by commas, got {text!r}")
    return values


def add_multiturn_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--workload",
        choices=("requests", "multiturn"),
        default="requests",
        help="multiturn: conversations that resend their history each round (TTFT by round)",
    )
    p.add_argument("--users", type=int, default=8, help="multiturn: conversations at once")
    p.add_argument("--rounds", type=int, default=4, help="multiturn: requests per conversation")
    p.add_argument("--system-tokens", type=int, default=1000, help="multiturn: the system part every user shares")
    p.add_argument("--user-tokens", type=int, default=1000, help="multiturn: each user's own first message")
    p.add_argument("--answer-tokens", type=int, default=32, help="multiturn: max_tokens per answer")
    p.add_argument("--qps", type=float, default=None, help="multiturn: requests started per second at most")
    p.add_argument(
        "--round-barrier",
        action="store_true",
        help="multiturn: round r+1 starts when every user's round r has finished",
    )


def config_from_args(args: argparse.Namespace) -> ServeConfig:
    endpoint = Endpoint(args.url, args.model, args.api_key, args.temperature, args.extra_body, args.timeout)
    slo = Slo(_seconds(args.slo_ttft), _seconds(args.slo_itl))
    mt = None
    if args.workload == "multiturn":
        mt = Multiturn(
            args.users,
            args.rounds,
            args.system_tokens,
            args.user_tokens,
            args.answer_tokens,
            args.qps,
            args.round_barrier,
        )
    return ServeConfig(
        endpoint,
        args.tokenizer,
        args.concurrency,
        args.request_rate,
        args.num_requests,
        args.isl,
        args.osl,
        args.trace,
        args.time_scale,
        args.max_requests,
        slo,
        args.warmup,
        args.seed,
        mt,
    )


def _seconds(ms: float | None) -> float | None:
    return None if ms is None else ms / 1e3


def cmd_bench_serve(args: argparse.Namespace) -> int:
    if args.structured:
        return cmd_bench_structured(args)
    try:
        cfg = config_from_args(args)
    except ValueError as exc:
        raise SystemExit(f"tandem bench serve: error: {exc}") from None
    try:
        summary, report = asyncio.run(run_serve(cfg))
    except (ServerError, TraceError, OSError) as exc:
        raise SystemExit(f"tandem bench serve: error: {exc}") from None
    print(f"{report['url']} · model {report['model']} · {report['load']}")
    for note in report["notes"]:
        print(f"note: {note}")
    print(format_summary(summary, cfg.slo))
    if "rounds" in report:
        print("\n" + format_rounds(report["rounds"]))
    if args.json is not None:
        write_json(args.json, report)
        print(f"\nwrote {args.json}")
    return 0 if summary.num_errors == 0 else 1


def cmd_bench_structured(args: argparse.Namespace) -> int:
    from tandem.bench.structured_bench import format_structured, run_structured_sync

    if args.workload != "requests" or args.trace is not None or args.request_rate is not None:
        raise SystemExit(
            "tandem bench serve: error: --structured runs closed-loop synthetic requests; drop "
            "--workload multiturn / --trace / --request-rate"
        )
    args.concurrency = args.structured_concurrency[0]
    try:
        cfg = config_from_args(args)
        report = run_structured_sync(
            cfg, args.structured_concurrency, tuple(args.metrics_url), run_serve, args.structured_rounds
        )
    except ValueError as exc:
        raise SystemExit(f"tandem bench serve: error: {exc}") from None
    except (ServerError, OSError) as exc:
        raise SystemExit(f"tandem bench serve: error: {exc}") from None
    print(
        f"{cfg.endpoint.base_url} · grammar cost · isl {cfg.isl}, osl {cfg.osl}, {cfg.num_requests} requests per "
        "row (at least the concurrency)"
    )
    print(format_structured(report))
    if args.json is not None:
        write_json(args.json, report | {"config": _config_dict(cfg)})
        print(f"\nwrote {args.json}")
    return 0 if all(r["num_errors"] == 0 for r in report["rows"]) else 1
