"""The disaggregation check live, with figures kept: the run of tests/integration/test_disagg_live_queue.py (1 prefill
and 2 decode sim workers, long prompts at 3x the heartbeat-limited rate), with the load stream and on heartbeats alone,
written to JSON with a table. The test judges; this script only records. Arrivals are paced in wall time: run it locked.

    .venv/bin/python bench/disagg_check_live.py --json bench/results/sim/disagg_check_live.json
"""

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from tandem.models.init import init_model  # noqa: E402
from tests.integration.test_disagg_live_queue import NUM_REQUESTS, RATE, run_at_rate  # noqa: E402

STREAMS = (("load_stream", 0.01), ("heartbeats_only", 0.0))


def measure(work: Path) -> dict[str, dict]:
    model = init_model(work / "model", "llama", tiny=True, config_only=True)
    runs = {}
    for name, stream_s in STREAMS:
        (work / name).mkdir()
        run = run_at_rate(model, work / name, stream_s)
        statuses = run.pop("statuses")
        runs[name] = {**run, "num_ok": statuses.count(200), "share_disaggregated": run["disaggregated"] / run["routed"]}
    return runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="disagg-live-") as tmp:
        runs = measure(Path(tmp))
    print(f"{'':18} {'ok':>4} {'disaggregated':>14} {'prefill peak waiting':>21}")
    for name, run in runs.items():
        share = run["share_disaggregated"]
        print(f"{name:18} {run['num_ok']:>4} {share:>14.1%} {run['prefill_peak_waiting']:>21}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        body = {"num_requests": NUM_REQUESTS, "rate_per_s": RATE, "runs": runs}
        args.json.write_text(json.dumps(body, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
