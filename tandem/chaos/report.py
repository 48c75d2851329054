"""The chaos run's table (one row per scenario, then each failed check) and its JSON. Pure formatting."""

import json
import math
import platform
import time
from pathlib import Path

from tandem.chaos.outcomes import COMPLETED, CORRUPTED, FAILED_CLEANLY, LEFT, LOST, UNCLEAN, ScenarioResult

COLUMNS = (
    "scenario",
    "sent",
    "completed",
    "migrated",
    "failed cleanly",
    "left",
    "LOST",
    "corrupt",
    "unclean",
    "in flight",
    "recovery s",
    "1st token s",
    "result",
)


def _row(r: ScenarioResult) -> list[str]:
    c = r.counts
    first = "-" if math.isnan(r.first_token_after_s) else f"{r.first_token_after_s:.2f}"
    return [
        r.name,
        str(r.sent),
        str(c[COMPLETED]),
        str(r.migrated),
        str(c[FAILED_CLEANLY]),
        str(c[LEFT]),
        str(c[LOST]),
        str(c[CORRUPTED]),
        str(c[UNCLEAN]),
        str(r.max_in_flight),
        f"{r.recovery_s:.2f}",
        first,
        "pass" if r.passed else "FAIL",
    ]


def table(results: list[ScenarioResult]) -> str:
    rows = [list(COLUMNS), *(_row(r) for r in results)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    lines = [
        "  ".join(cell.rjust(w) if i else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths))) for row in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    for r in results:
        for check in r.checks:
            mark = "ok  " if check.ok else "FAIL"
            lines.append(f"  {mark} {r.name}: {check.name} ({check.detail})")
    return "\n".join(lines)


def write_json(results: list[ScenarioResult], path: Path, wall_s: float, short: bool) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "host": platform.node(),
        "short": short,
        "wall_s": round(wall_s, 1),
        "passed": all(r.passed for r in results),
        "scenarios": [_clean(r.to_json()) for r in results],
    }
    path.write_text(json.dumps(doc, indent=2) + "\n")


def _clean(value):
    """JSON has no NaN: a value never measured is null."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value
