"""bench/gpu_all.sh's last step: every section's outcome and JSON folded into ONE JSON, and the issue's target
table with each target met, missed, or not measured (and why: the section failed, timed out, or never ran).
Reads only the files the sections wrote; measures nothing.

    python bench/gpu_all_report.py WORK_DIR --json OUT.json
"""

import argparse
import json
import sys
from pathlib import Path

SECTIONS = ("pytest_gpu", "engine", "pd", "kv_tiers", "serve")


def load_sections(work: Path) -> dict[str, dict]:
    """name -> {rc, seconds, limit_s, timed_out, data (its JSON or None)} from sections.jsonl."""
    out = {name: {"rc": None, "seconds": 0, "limit_s": 0, "timed_out": False, "data": None} for name in SECTIONS}
    lines = (work / "sections.jsonl").read_text().splitlines() if (work / "sections.jsonl").exists() else []
    for line in lines:
        row = json.loads(line)
        path = work / f"{row['section']}.json"
        data = json.loads(path.read_text()) if path.exists() and path.stat().st_size else None
        if row["section"] == "pytest_gpu":
            data = junit_counts(work / "pytest_gpu.xml")
        out[row["section"]] = {**row, "timed_out": row["rc"] in (124, 137), "data": data}
    return out


def junit_counts(path: Path) -> dict | None:
    """pytest's --junitxml summed over its suites: tests, failed, errors, skipped, passed."""
    if not path.exists():
        return None
    import xml.etree.ElementTree as ET

    suites = ET.parse(path).getroot().iter("testsuite")
    total = {k: 0 for k in ("tests", "failures", "errors", "skipped")}
    for suite in suites:
        for k in total:
            total[k] += int(suite.get(k, 0))
    return {
        "tests": total["tests"],
        "failed": total["failures"],
        "errors": total["errors"],
        "skipped": total["skipped"],
        "passed": total["tests"] - total["failures"] - total["errors"] - total["skipped"],
    }


def _target(name: str, measured, goal: float, at_most: bool = False, why: str = "") -> dict:
    met = None if measured is None else (measured <= goal if at_most else measured >= goal)
    return {
        "target": name,
        "measured": measured,
        "goal": goal,
        "at_most": at_most,
        "met": met,
        "note": why if measured is None else "",
    }


def _why(section: dict) -> str:
    if section["rc"] is None:
        return "section did not run"
    if section["timed_out"]:
        return f"section timed out ({section['limit_s']} s)"
    return f"section failed (exit {section['rc']})" if section["rc"] else "section wrote no figure"


def targets(sections: dict[str, dict]) -> list[dict]:
    out = []
    engine = sections["engine"]
    if engine["data"] and engine["data"].get("targets"):
        out += [
            _target(t["target"], t["measured"], t["goal"], why="engine: row missing") for t in engine["data"]["targets"]
        ]
    else:
        out.append(_target("gpu_engine.py targets (decode, FP8/NVFP4, kernel, offline)", None, 0, why=_why(engine)))
    serve, why = sections["serve"]["data"], _why(sections["serve"])
    out.append(_target("serving / in-process engine, output tok/s", serve and serve["throughput_ratio"], 0.90, why=why))
    out.append(_target("serving / in-process engine, TTFT p50", serve and serve["ttft_ratio"], 1.2, True, why))
    pd, why = sections["pd"]["data"], _why(sections["pd"])
    runs = pd and pd["runs"]
    out.append(
        _target("P/D errors (both modes)", runs and runs["pd"]["errors"] + runs["aggregated"]["errors"], 0, True, why)
    )
    out.append(_target("P/D KV import GB/s", runs and runs["pd"]["kv_gb_per_s"], 20.0, why=why))
    out.append(_target("P/D TTFT p50 / aggregated", pd and pd["ttft_ratio"], 1.5, True, why))
    copy, why = (sections["kv_tiers"]["data"] or {}).get("copy"), _why(sections["kv_tiers"])
    out.append(_target("host tier G1 -> G2 GB/s", copy and copy["g1_to_g2_gb_per_s"], 40.0, why=why))
    out.append(_target("host tier G2 -> G1 GB/s", copy and copy["g2_to_g1_gb_per_s"], 40.0, why=why))
    tests = sections["pytest_gpu"]["data"]
    out.append(
        _target(
            "pytest -m gpu: failures",
            tests and tests["failed"] + tests["errors"],
            0,
            True,
            _why(sections["pytest_gpu"]),
        )
    )
    return out


def render(sections: dict[str, dict], rows: list[dict]) -> str:
    lines = ["| section | exit | seconds | limit s |", "|---|---:|---:|---:|"]
    lines += [
        f"| {n} | {s['rc'] if s['rc'] is not None else '-'}{' (timeout)' if s['timed_out'] else ''} | "
        f"{s['seconds']} | {s['limit_s']} |"
        for n, s in sections.items()
    ]
    lines += ["", "| target | measured | goal | met |", "|---|---:|---:|---|"]
    for t in rows:
        measured = "n/a" if t["measured"] is None else f"{t['measured']:.4g}"
        met = {True: "yes", False: "NO", None: f"not measured: {t['note']}"}[t["met"]]
        lines.append(f"| {t['target']} | {measured} | {'<=' if t['at_most'] else '>='} {t['goal']:g} | {met} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("work", type=Path)
    p.add_argument("--json", type=Path, required=True)
    p.add_argument("--device", default="")
    p.add_argument("--dry-run", action="store_true")
    args = p.parse_args(argv)
    sections = load_sections(args.work)
    rows = targets(sections)
    table = render(sections, rows)
    if args.dry_run:
        table = "DRY RUN (CPU, tiny shapes): every section's code ran; no figure below is a measurement\n\n" + table
    print(table)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(
        json.dumps(
            {"device": args.device, "dry_run": args.dry_run, "targets": rows, "sections": sections, "table": table},
            indent=1,
            default=str,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
