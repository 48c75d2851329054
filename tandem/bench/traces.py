"""Public request traces (Mooncake JSONL, Azure 2023 CSV) as rows of arrival time and token counts.

Parsing, time scaling and clipping to a context length only; no prompts, no I/O beyond reading the file.
"""

import csv
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import datetime
from itertools import islice
from pathlib import Path

MOONCAKE_BLOCK_SIZE = 512  # tokens behind each hash id of a Mooncake trace
_EPOCH = datetime(1970, 1, 1)


class TraceError(ValueError):
    """A trace file this loader cannot read."""


@dataclass(frozen=True, slots=True)
class TraceRow:
    arrival_s: float  # since the trace's first row
    isl: int  # prompt tokens
    osl: int  # output tokens
    hash_ids: tuple[int, ...] = ()  # Mooncake: one chained prefix hash per 512-token block


def load_trace(path: Path, max_requests: int | None = None, time_scale: float = 1.0) -> list[TraceRow]:
    """The first `max_requests` rows of a Mooncake or Azure trace, every arrival time multiplied by `time_scale`."""
    if time_scale <= 0:
        raise TraceError(f"time_scale must be > 0, got {time_scale}")
    rows = read_rows(Path(path), detect_format(Path(path)))
    return [replace(r, arrival_s=r.arrival_s * time_scale) for r in islice(rows, max_requests)]


def detect_format(path: Path) -> str:
    """ "mooncake" or "azure": by extension, else by the first line's shape."""
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json"):
        return "mooncake"
    if suffix == ".csv":
        return "azure"
    with open(path) as f:
        first = f.readline().strip()
    if first.startswith("{"):
        return "mooncake"
    if first.upper().startswith("TIMESTAMP"):
        return "azure"
    raise TraceError(f"{path}: neither a Mooncake JSONL nor an Azure CSV trace (first line {first[:60]!r})")


def read_rows(path: Path, fmt: str) -> Iterator[TraceRow]:
    if fmt == "mooncake":
        return read_mooncake(path)
    if fmt == "azure":
        return read_azure(path)
    raise TraceError(f"unknown trace format {fmt!r}")


def read_mooncake(path: Path) -> Iterator[TraceRow]:
    """Rows of a Mooncake JSONL trace: `timestamp` in ms, `input_length`, `output_length`, `hash_ids`."""
    with open(path) as f:
        for num, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
                yield TraceRow(
                    r["timestamp"] / 1000.0,
                    int(r["input_length"]),
                    int(r["output_length"]),
                    tuple(r.get("hash_ids", ())),
                )
            except (ValueError, KeyError, TypeError) as exc:
                raise TraceError(f"{path}:{num}: not a Mooncake row: {exc}") from None


def read_azure(path: Path) -> Iterator[TraceRow]:
    """Rows of an Azure 2023 CSV: `TIMESTAMP` (7 fractional digits), `ContextTokens`, `GeneratedTokens`."""
    t0 = None
    with open(path, newline="") as f:
        for num, row in enumerate(csv.DictReader(f), start=2):
            try:
                t = _azure_time(row["TIMESTAMP"])
                t0 = t if t0 is None else t0
                yield TraceRow(t - t0, int(row["ContextTokens"]), int(row["GeneratedTokens"]))
            except (ValueError, KeyError, TypeError) as exc:
                raise TraceError(f"{path}:{num}: not an Azure row: {exc}") from None


def _azure_time(stamp: str) -> float:
    # NOTE: strptime's %f takes at most 6 fractional digits; the file has 7. Naive times, no zone:
    # differences from a naive epoch, so a local DST change cannot shift them
    stamp = stamp.strip() if "." in stamp else stamp.strip() + ".0"
    return (datetime.strptime(stamp[:26], "%Y-%m-%d %H:%M:%S.%f") - _EPOCH).total_seconds()


def clip_to_context(row: TraceRow, max_model_len: int) -> TraceRow:
    """The row unchanged if prompt plus output fit `max_model_len`, else both scaled down in proportion.

    Each keeps at least one token and the sum is at most `max_model_len`.
    """
    if max_model_len < 2:
        raise TraceError(f"max_model_len must be >= 2, got {max_model_len}")
    if row.isl + row.osl <= max_model_len:
        return row
    factor = max_model_len / (row.isl + row.osl)
    isl = min(max_model_len - 1, max(1, math.floor(row.isl * factor)))
    osl = max(1, min(row.osl, max_model_len - isl))
    return replace(row, isl=isl, osl=osl)


def clip_all(rows: list[TraceRow], max_model_len: int) -> tuple[list[TraceRow], int]:
    """Every row clipped to the context, and how many had to be."""
    clipped = [clip_to_context(r, max_model_len) for r in rows]
    return clipped, sum(1 for a, b in zip(rows, clipped) if a != b)
