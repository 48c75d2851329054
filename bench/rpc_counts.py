"""gRPC calls and server-streamed messages per request, by method and by serving process, in one concurrency-16
`tandem bench overhead --prefill` phase of a secure stack (mutual TLS, signed KV handles): which calls a request
costs, the unit that TLS makes dear (bench/grpc_call_cost.py). Counts, not times: no lock needed. Bench only.

    python bench/rpc_counts.py [--num-requests 256] [--json bench/results/rpc_counts.json]
"""

import argparse
import asyncio
import collections
import json
import os
import tempfile
import time
from pathlib import Path

from tandem.bench import overhead as ov
from tandem.bench.loadgen import PromptMaker, allowed_token_ids

HOOK = Path(__file__).resolve().parent / "rpc_count_hook"


def read_counts(directory: Path, pids: dict[str, list[int]]) -> dict[str, collections.Counter]:
    by_service = {}
    for name, service_pids in pids.items():
        total = collections.Counter()
        for pid in service_pids:
            path = directory / f"{pid}.json"
            if path.exists():
                total.update(json.loads(path.read_text()))
        by_service[name] = total
    return by_service


def run(model: Path, num_requests: int, counts_dir: Path) -> dict:
    from tandem.launcher import Stack, StackConfig, free_port

    cfg = ov.OverheadConfig(num_requests=num_requests, concurrencies=(16,), num_prefill=1)
    path = os.pathsep.join(p for p in (str(HOOK), os.environ.get("PYTHONPATH", "")) if p)
    env = {**ov._ALWAYS_DISAGGREGATE, "PYTHONPATH": path, "TANDEM_BENCH_RPC_COUNTS": str(counts_dir)}
    stack = Stack(
        StackConfig(
            model=str(model),
            engine="zero",
            num_prefill=1,
            num_decode=1,
            port=free_port(),
            num_threads=1,
            log_dir=model.parent / "logs",
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
        prompts = PromptMaker(allowed_token_ids(model), 0)
        # NOTE: the warm-up inside the phase is counted too: its requests are added to the divisor
        time.sleep(1.0)
        before = read_counts(counts_dir, pids)
        phase = asyncio.run(ov._run_http(stack.url, cfg, prompts, 16, 1, pids, ports))
        time.sleep(1.5)  # NOTE: the hook writes every 0.5 s; the last Completes land first
        after = read_counts(counts_dir, pids)
    finally:
        stack.stop()
    requests = num_requests + cfg.num_warmup
    per_request = {
        name: {
            key: round((after[name][key] - before[name].get(key, 0)) / requests, 3)
            for key in sorted(after[name])
            if after[name][key] != before[name].get(key, 0)
        }
        for name in after
    }
    return {
        "num_requests": num_requests,
        "num_warmup": cfg.num_warmup,
        "errors": phase.summary.num_errors,
        "tokens_per_request": phase.summary.num_output_tokens / max(1, num_requests),
        "per_request": per_request,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--num-requests", type=int, default=256)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="tandem-rpc-counts-") as tmp:
        counts = Path(tmp) / "counts"
        counts.mkdir()
        result = run(ov._tiny_model(Path(tmp) / "tiny"), args.num_requests, counts)
    print("| serving process | calls or messages | per request |")
    print("|---|---|---|")
    for name, keys in result["per_request"].items():
        for key, value in keys.items():
            print(f"| {name} | {key} | {value:.3f} |")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
