"""Grammar cost at serving time, as the issue states it: one aggregated native stack (one decode worker, one torch
thread) and ONE `tandem bench serve --structured` invocation against it, with the decode worker's /metrics for the
mask time per token. Everything after the known flags goes to `tandem bench serve` as it is. The host (CPU, flags)
and the load average before and after are added to the benchmark's JSON.

  python bench/structured_itl.py --model DIR --json OUT [bench serve flags, e.g. --structured-concurrency 1,16
      --structured-rounds 3 --num-requests 6 --isl 128 --osl 64 --warmup 2]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--json", required=True, type=Path)
    args, serve_args = ap.parse_known_args()
    from tandem.bench.overhead_report import host_info
    from tandem.launcher import StackConfig, free_port
    from tandem.stack_run import make_stack

    cfg = StackConfig(
        model=args.model,
        port=free_port(),
        num_prefill=0,
        num_decode=1,
        num_threads=1,
        log_dir=Path(tempfile.mkdtemp()) / "logs",
        ready_timeout_s=300,
    )
    stack = make_stack(cfg)
    try:
        stack.start()
        stack.wait_ready()
        before = os.getloadavg()
        command = [
            sys.executable,
            "-m",
            "tandem.cli",
            "bench",
            "serve",
            "--url",
            stack.url,
            "--tokenizer",
            args.model,
            "--structured",
            "--metrics-url",
            stack.metrics_urls["decode-0"],
            "--json",
            str(args.json),
            *serve_args,
        ]
        code = subprocess.call(command)
        after = os.getloadavg()
    finally:
        stack.stop()
    if args.json.exists():
        report = json.loads(args.json.read_text())
        report["host"] = host_info() | {
            "load_average_before": before,
            "load_average_after": after,
            "stack": "tandem up --prefill 0 --decode 1 --num-threads 1 (native, float32)",
        }
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return code


if __name__ == "__main__":
    sys.exit(main())
