"""The live sim cluster against the cluster simulator, with figures kept: the run of
tests/integration/test_sim_agreement.py (its trace, its stacks, its simulator), written to JSON with a table.
The test judges agreement; this script only records what both sides measured. Live TTFT is wall time: run it locked.

    .venv/bin/python bench/sim_agreement.py --json bench/results/sim/sim_agreement.json
"""

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from tandem.models.init import init_model  # noqa: E402
from tests.integration.test_sim_agreement import (  # noqa: E402
    HIT_RATE_TOLERANCE,
    POLICIES,
    live,
    simulated,
    write_trace,
)

KEYS = ("prefix_hit_rate", "ttft_mean_s")


def measure(work: Path) -> dict[str, dict[str, dict[str, float]]]:
    """{policy: {"live": {...}, "sim": {...}}} with KEYS on each side."""
    model = init_model(
        work / "model", "llama", tiny=True, config_only=True, overrides={"max_position_embeddings": 8192}
    )
    trace = write_trace(work / "trace.jsonl")
    out = {}
    for policy in POLICIES:
        sim = simulated(trace, policy)
        out[policy] = {"sim": {k: sim[k] for k in KEYS}, "live": live(model, trace, policy, work)}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="sim-agreement-") as tmp:
        runs = measure(Path(tmp))
    print(f"{'policy':12} {'hit live':>9} {'hit sim':>8} {'TTFT live s':>12} {'TTFT sim s':>11}")
    for policy, run in runs.items():
        live_run, sim_run = run["live"], run["sim"]
        print(
            f"{policy:12} {live_run['prefix_hit_rate']:>9.3f} {sim_run['prefix_hit_rate']:>8.3f} "
            f"{live_run['ttft_mean_s']:>12.3f} {sim_run['ttft_mean_s']:>11.3f}"
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        body = {"hit_rate_tolerance": HIT_RATE_TOLERANCE, "runs": runs}
        args.json.write_text(json.dumps(body, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
