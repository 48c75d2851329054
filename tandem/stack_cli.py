"""`tandem serve <service>` (one service, what a container runs) and `tandem up` (the local stack)."""

import argparse
import importlib
import os
from pathlib import Path

SERVICES = {
    "gateway": "services.gateway.server",
    "router": "services.router.server",
    "prefill": "services.prefill.server",
    "decode": "services.decode.server",
    "planner": "services.planner.server",
    "scaler": "services.scaler.server",
}


def add_stack_commands(commands) -> None:
    from engines.native.config import DTYPES
    from services.common.worker_settings import ENGINES  # NOTE: `up` passes these to every worker
    from services.common.worker_settings import SOURCE as WORKER

    serve = commands.add_parser(
        "serve",
        help="run one service in the foreground",
        description="Run one tandem service; arguments after the name go to it.",
    )
    serve.add_argument("service", choices=sorted(SERVICES))
    serve.add_argument("args", nargs=argparse.REMAINDER, help="the service's own flags (see --help)")
    serve.set_defaults(func=_serve)

    up = commands.add_parser("up", help="start router, workers and gateway as local processes")
    up.add_argument(
        "--model", default=WORKER.read("model"), help="checkpoint directory (default: `tandem model fetch`'s SmolLM2)"
    )
    up.add_argument("--prefill", type=int, default=1, help="prefill workers (0: aggregated serving)")
    up.add_argument("--decode", type=int, default=1, help="decode workers")
    up.add_argument(
        "--routers",
        type=int,
        default=1,
        help="router replicas: every worker registers with each, gateways spread Route calls over them",
    )
    up.add_argument("--port", type=int, default=8000, help="gateway port")
    up.add_argument("--host", default="127.0.0.1", help="the address the gateway binds")
    up.add_argument(
        "--engine",
        default=WORKER.setting("engine").default,
        choices=ENGINES,
        help=f"the workers' engine, one of {', '.join(ENGINES)}",
    )
    up.add_argument(
        "--dtype",
        default=WORKER.setting("dtype").default,
        choices=DTYPES,
        help=f"weights, activations and KV cache: one of {', '.join(DTYPES)}",
    )
    up.add_argument("--num-threads", type=int, default=0, help="torch threads per worker (0: cores / workers)")
    up.add_argument("--device", default=None, help="workers' device, e.g. cuda or cuda:0 (default: theirs, cpu)")
    up.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=None,
        help="share of the card each worker may use (P/D on one GPU: e.g. 0.45 each)",
    )
    up.add_argument(
        "--gateway-workers",
        type=int,
        default=None,
        help="gateway processes on the one port (default: TANDEM_GATEWAY_WORKERS, else 1)",
    )
    up.add_argument(
        "--log-dir",
        type=Path,
        default=Path(os.environ.get("TANDEM_LOG_DIR", ".cache/logs")),
        help="where each process's log goes (env TANDEM_LOG_DIR, default .cache/logs)",
    )
    up.add_argument(
        "--prometheus",
        type=int,
        nargs="?",
        const=9090,
        default=-1,
        metavar="PORT",
        help="also run Prometheus (when installed) scraping every service, on PORT (default 9090)",
    )
    up.add_argument(
        "--planner",
        action="store_true",
        help="also run the planner, adding and removing workers (TANDEM_PLANNER_* configure it)",
    )
    up.add_argument(
        "--kv-host-gb",
        type=float,
        default=None,
        help="per worker: host memory for KV blocks beyond the device pool (>= the device KV)",
    )
    up.add_argument(
        "--kv-disk-gb",
        type=float,
        default=None,
        help="per worker: disk for KV blocks seen twice, under --kv-disk-dir (>= --kv-host-gb)",
    )
    up.add_argument(
        "--kv-disk-dir",
        default=WORKER.read("kv_disk_dir"),
        help="the disk KV tier's directory; each worker keeps its blocks in DIR/<worker name>",
    )
    up.add_argument(
        "--speculative",
        default=WORKER.read("speculative"),
        help="per worker (native engine): speculative decoding, ngram (prompt lookup) or draft:DIR (a "
        "small model with the target's tokenizer); see docs/speculative-decoding.md",
    )
    up.set_defaults(func=_up)


def _serve(args) -> int:
    from services.common.process import die_with_parent

    die_with_parent()  # under `tandem up`: never outlive it
    module = importlib.import_module(SERVICES[args.service])
    return module.main(args.args) or 0  # NOTE: a service's exit code (2: bad settings) is the command's


def _up(args) -> int:
    from tandem.launcher import StackConfig
    from tandem.stack_run import run_stack

    if args.prefill < 0 or args.decode < 1 or args.routers < 1:
        raise SystemExit("tandem up: need --decode >= 1, --prefill >= 0 and --routers >= 1")
    model = args.model or str(_default_model())
    tiers = [
        f"--{name.replace('_', '-')}={value}"
        for name in ("kv_host_gb", "kv_disk_gb")
        if (value := getattr(args, name)) is not None
    ]
    cfg = StackConfig(
        model=model,
        num_prefill=args.prefill,
        num_decode=args.decode,
        num_routers=args.routers,
        port=args.port,
        host=args.host,
        engine=args.engine,
        dtype=args.dtype,
        num_threads=args.num_threads,
        log_dir=args.log_dir,
        prometheus_port=args.prometheus,
        num_gateway_workers=args.gateway_workers,
        planner=args.planner,
        worker_args=(*tiers, *_device_args(args), *_spec_args(args)),
        kv_disk_dir=args.kv_disk_dir,
    )
    return run_stack(cfg)


def _device_args(args) -> tuple[str, ...]:
    device = ("--device", args.device) if args.device else ()
    share = (
        ("--gpu-memory-utilization", str(args.gpu_memory_utilization))
        if args.gpu_memory_utilization is not None
        else ()
    )
    return (*device, *share)


def _spec_args(args) -> tuple[str, ...]:
    return ("--speculative", args.speculative) if args.speculative else ()


def _default_model() -> Path:
    from tandem.models.fetch import fetch_model

    return fetch_model()
