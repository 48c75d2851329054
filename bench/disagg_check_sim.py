"""The disaggregation check in the cluster simulator, with the prefill worker's load streamed and on heartbeats alone:
1 prefill and 2 decode workers, heartbeats every 2 s, long prompts at 3x the heartbeat-limited rate (4 waiting per
2 s). Virtual time, so the figures are the same on any host. tests/unit/cluster/test_sim_disagg.py asserts on the same
function; this script writes its figures to JSON and prints a table. Measures only; it judges nothing.

    .venv/bin/python bench/disagg_check_sim.py --json bench/results/sim/disagg_check.json
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from engines.timing.profile import load_profile  # noqa: E402
from tandem.bench.traces import TraceRow  # noqa: E402
from tandem.cluster.des import ClusterSim, SimConfig  # noqa: E402

HEARTBEAT_S, MAX_WAITING = 2.0, 4
RATE = 3 * MAX_WAITING / HEARTBEAT_S  # 6 long prompts a second
NUM_REQUESTS, PROMPT_TOKENS, OUTPUT_TOKENS = 120, 1024, 200


def long_prompts(n: int = NUM_REQUESTS) -> list[TraceRow]:
    """Distinct 1,024-token prompts (two blocks of unique hash ids each), evenly spaced at RATE."""
    return [
        TraceRow(i / RATE, PROMPT_TOKENS, OUTPUT_TOKENS, tuple(10_000 + 3 * i + k for k in range(2))) for i in range(n)
    ]


def share_disaggregated(stream: bool, n: int = NUM_REQUESTS) -> tuple[float, int]:
    """(share of requests given a prefill worker, the prefill worker's peak waiting queue, sampled every 10 ms)."""
    config = SimConfig(2, num_prefill_workers=1, heartbeat_interval_s=HEARTBEAT_S, prefill_load_stream=stream)
    sim = ClusterSim(load_profile(), config, "kv")
    peak = [0]
    sim.every(0.01, lambda now: peak.__setitem__(0, max(peak[0], sim.workers["prefill-000"].core.stats().num_waiting)))
    records = sim.run(long_prompts(n))
    return sum(bool(r.prefill_worker_id) for r in records) / len(records), peak[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    runs = {}
    for name, stream in (("load_stream", True), ("heartbeats_only", False)):
        share, peak = share_disaggregated(stream)
        runs[name] = {"share_disaggregated": share, "prefill_peak_waiting": peak}
    print(f"{'':18} {'disaggregated':>14} {'prefill peak waiting':>21}")
    for name, run in runs.items():
        print(f"{name:18} {run['share_disaggregated']:>14.1%} {run['prefill_peak_waiting']:>21}")
    if args.json:
        header = {
            "num_requests": NUM_REQUESTS,
            "rate_per_s": RATE,
            "heartbeat_s": HEARTBEAT_S,
            "prompt_tokens": PROMPT_TOKENS,
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({**header, "runs": runs}, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
