"""Where a planner run's SLA misses fall: per time bucket and per cause, beside the fleet it held, read from
`tandem sim --planner sla --keep-requests` JSON (one or more runs). Analysis only: it replays nothing.

    python bench/planner/miss_buckets.py RUN.json[:NAME] ... [--bucket-s 60] [--json OUT]

Causes (each missed request gets exactly one, first that applies):
  infeasible   its own uncached prompt takes longer than the TTFT SLO alone on an idle worker (truth profile):
               no fleet serves it in time
  ttft_prefill a TTFT miss prefilled on a prefill worker (its queue)
  ttft_decode  a TTFT miss prefilled on a decode worker (overflowed, or no prefill pool)
  itl          first token in time, mean ITL over the SLO
Each miss is also tagged `cold` when a worker it used had begun serving less than --cold-s before it arrived.
"""

import argparse
import json
from collections import Counter, defaultdict
from pathlib import Path

from engines.timing.profile import TimingProfile
from services.planner.perf_model import PerfModel, Slo

CAUSES = ("infeasible", "ttft_prefill", "ttft_decode", "itl")


def load_run(spec: str) -> tuple[str, dict, dict]:
    """`path[:name]` -> (label, header, run): the named planner run, else the first one in the file."""
    path, _, name = spec.partition(":")
    doc = json.loads(Path(path).read_text())
    names = [k for k, v in doc.items() if isinstance(v, dict) and "requests" in v]
    if not names:
        raise SystemExit(f"{path}: no run with requests (was it written with --keep-requests?)")
    key = name or names[0]
    return f"{Path(path).stem}:{key}", doc, doc[key]


def cause(row: dict, model: PerfModel) -> str | None:
    """The one cause of a request's miss, None when it met both SLOs."""
    slo = model.slo
    ttft_miss = row["ttft_s"] > slo.ttft_s
    if not ttft_miss and (row["itl_s"] is None or row["itl_s"] <= slo.itl_s):
        return None
    if ttft_miss and model.prefill_s(row["prompt"] - row["cached"]) > slo.ttft_s:
        return "infeasible"
    if ttft_miss:
        return "ttft_prefill" if row["prefill_worker"] else "ttft_decode"
    return "itl"


def is_cold(row: dict, added: dict[str, float], cold_s: float) -> bool:
    workers = [w for w in (row["prefill_worker"], row["decode_worker"]) if w]
    return any(added.get(w, 0.0) > 0 and row["arrival_s"] - added[w] < cold_s for w in workers)


def fleet_at(timeline: list[dict], t: float) -> tuple[int, int]:
    """The (prefill, decode) the planner wanted at the last tick before `t`."""
    last = {"prefill": 0, "decode": 0}
    for tick in timeline:
        if tick["t_s"] > t:
            break
        last = tick["replicas"]
    return last.get("prefill", 0), last.get("decode", 0)


def buckets(run: dict, model: PerfModel, bucket_s: float, cold_s: float) -> list[dict]:
    req = run["requests"]
    rows = [dict(zip(req["fields"], r)) for r in req["rows"]]
    out: dict[int, dict] = defaultdict(lambda: {"num": 0, "causes": Counter(), "num_cold": 0})
    for row in rows:
        b = out[int(row["arrival_s"] // bucket_s)]
        b["num"] += 1
        c = cause(row, model)
        if c is not None:
            b["causes"][c] += 1
            b["num_cold"] += is_cold(row, req["worker_added_s"], cold_s)
    return [
        {
            "start_s": k * bucket_s,
            "num_requests": v["num"],
            "fleet": fleet_at(run.get("timeline", []), (k + 0.5) * bucket_s),
            **{c: v["causes"][c] for c in CAUSES},
            "num_cold": v["num_cold"],
        }
        for k, v in sorted(out.items())
    ]


def totals(table: list[dict]) -> dict:
    num = sum(b["num_requests"] for b in table)
    out = {c: sum(b[c] for b in table) for c in (*CAUSES, "num_cold")}
    return {"num_requests": num, **out, "num_missed": sum(out[c] for c in CAUSES)}


def format_table(label: str, table: list[dict]) -> str:
    head = f"{'start':>6} {'reqs':>5} {'P+D':>5} " + " ".join(f"{c:>12}" for c in CAUSES) + f" {'cold':>5}"
    lines = [label, head]
    for b in table:
        p, d = b["fleet"]
        lines.append(
            f"{b['start_s']:>6.0f} {b['num_requests']:>5} {f'{p}+{d}':>5} "
            + " ".join(f"{b[c]:>12}" for c in CAUSES)
            + f" {b['num_cold']:>5}"
        )
    t = totals(table)
    lines.append(
        f"{'total':>6} {t['num_requests']:>5} {'':>5} "
        + " ".join(f"{t[c]:>12}" for c in CAUSES)
        + f" {t['num_cold']:>5}   missed {t['num_missed']} ({t['num_missed'] / t['num_requests']:.1%})"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("runs", nargs="+", help="JSON[:run name] written with --keep-requests")
    p.add_argument("--bucket-s", type=float, default=60.0)
    p.add_argument("--cold-s", type=float, default=60.0, help="a worker younger than this at arrival is cold")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    report = {}
    for spec in args.runs:
        label, doc, run = load_run(spec)
        slo = Slo(doc["slo"]["ttft_s"], doc["slo"]["itl_s"]) if "planner_config" not in doc else None
        slo = slo or Slo(doc["planner_config"]["slo_ttft_s"], doc["planner_config"]["slo_itl_s"])
        model = PerfModel(TimingProfile.from_dict(doc["profile"]), slo)  # NOTE: the engines' truth, not the planner's
        table = buckets(run, model, args.bucket_s, args.cold_s)
        print(format_table(label, table) + "\n")
        report[label] = {"buckets": table, "totals": totals(table)}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
