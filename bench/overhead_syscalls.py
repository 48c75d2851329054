"""System calls per streamed token of each service, a secure (mutual TLS, signed KV handles) against a plaintext stack,
one concurrency-16 `tandem bench overhead --prefill` phase each under `strace -c -f`: whether TLS makes gRPC write
or read more often (one TLS record per write). Counts, not times: strace slows the stack, so no figure here is a
speed. Bench only; needs strace (Linux).

    python bench/overhead_syscalls.py [--num-requests 256] [--out bench/results/overhead-security-strace]
"""

import argparse
import asyncio
import json
import re
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from tandem.bench import overhead as ov
from tandem.bench.loadgen import PromptMaker, allowed_token_ids
from tandem.bench.tcp_conns import opened_to, snapshot

TRACED = ("decode-0", "prefill-0", "gateway")
COUNTED = ("sendmsg", "recvmsg", "write", "read", "recvfrom", "epoll_wait", "futex")


def run_side(model: Path, is_plaintext: bool, num_requests: int, out: Path) -> dict:
    from tandem.launcher import Stack, StackConfig, free_port
    from tandem.stack_certs import KV_KEY_ENV

    cfg = ov.OverheadConfig(num_requests=num_requests, concurrencies=(16,), num_prefill=1)
    env = {**ov._ALWAYS_DISAGGREGATE, **({"TANDEM_GRPC_INSECURE": "1", KV_KEY_ENV: ""} if is_plaintext else {})}
    side = "plain" if is_plaintext else "tls"
    stack = Stack(
        StackConfig(
            model=str(model),
            engine="zero",
            num_prefill=1,
            num_decode=1,
            port=free_port(),
            num_threads=1,
            log_dir=model.parent / f"logs-{side}",
            ready_timeout_s=120,
            env=env,
            num_gateway_workers=1,
        )
    )
    try:
        stack.start()
        stack.wait_ready()
        pids = ov.service_pids(stack)
        ports = {**stack.router_ports, **stack.worker_ports}
        before = snapshot()
        tracers = [
            subprocess.Popen(
                [
                    "strace",
                    "-c",
                    "-f",
                    "-o",
                    str(out / f"strace-{side}-{name}.txt"),
                    *(a for pid in pids[name] for a in ("-p", str(pid))),
                ]
            )
            for name in TRACED
        ]
        time.sleep(1.0)  # NOTE: strace attaches to every thread before the load starts
        phase = asyncio.run(ov._run_http(stack.url, cfg, PromptMaker(allowed_token_ids(model), 0), 16, 1, pids, ports))
        for tracer in tracers:
            tracer.send_signal(signal.SIGINT)
            tracer.wait()
        tokens = phase.summary.num_output_tokens
        return {
            "tokens": tokens,
            "errors": phase.summary.num_errors,
            "grpc_connections_opened_with_warmup": opened_to(before, snapshot(), ports),
            "calls_per_token": {name: per_token(out / f"strace-{side}-{name}.txt", tokens) for name in TRACED},
        }
    finally:
        stack.stop()


def per_token(path: Path, tokens: int) -> dict[str, float]:
    counts = {}
    for line in path.read_text().splitlines():
        m = re.match(r"\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(\w+)$", line)
        if m and m.group(2) in COUNTED:
            counts[m.group(2)] = int(m.group(1)) / max(1, tokens)
    return counts


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--num-requests", type=int, default=256)
    p.add_argument("--out", type=Path, default=Path("bench/results/overhead-security-strace"))
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="tandem-syscalls-") as tmp:
        model = ov._tiny_model(Path(tmp) / "tiny")
        result = {
            side: run_side(model, side == "plaintext", args.num_requests, args.out) for side in ("secure", "plaintext")
        }
    print(f"{'process':<10} {'syscall':<11} {'secure':>8} {'plaintext':>10}  (calls per streamed token)")
    for name in TRACED:
        for call in COUNTED:
            a, b = (result[s]["calls_per_token"][name].get(call, 0.0) for s in ("secure", "plaintext"))
            print(f"{name:<10} {call:<11} {a:8.3f} {b:10.3f}")
    print(
        "gRPC connections opened, warm-up included:",
        {s: result[s]["grpc_connections_opened_with_warmup"] for s in result},
    )
    (args.out / "summary.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out / 'summary.json'}")


if __name__ == "__main__":
    main()
