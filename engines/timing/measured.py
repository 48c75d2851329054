"""Measured engine timings as piecewise-linear tables: prefill ms by prompt tokens, decode step ms by (running
sequences, mean context). What `tandem bench profile` writes and a TimingProfile can carry. Pure: no torch.

Between measured points the tables interpolate linearly; past the last one they extend the last segment's slope.
"""

import bisect
import functools
import json
from dataclasses import dataclass
from pathlib import Path

Points1D = tuple[tuple[float, float], ...]  # (x, ms), x ascending
Points2D = tuple[tuple[float, float, float], ...]  # (batch, context, ms)


def interp(points: Points1D, x: float) -> float:
    """y at x on the polyline through `points`; beyond either end, the nearest segment's line."""
    if len(points) == 1:
        return points[0][1]
    i = min(max(bisect.bisect_right(points, (x, float("inf"))) - 1, 0), len(points) - 2)
    (x0, y0), (x1, y1) = points[i], points[i + 1]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


@dataclass(frozen=True, slots=True)
class DecodeTable:
    """Decode step ms: one polyline over batch per measured context, then linear across contexts."""

    contexts: tuple[float, ...]
    rows: tuple[Points1D, ...]  # rows[i]: (batch, ms) at contexts[i]

    def step_ms(self, num_seqs: float, context: float) -> float:
        by_context = tuple((c, interp(row, num_seqs)) for c, row in zip(self.contexts, self.rows))
        if context <= self.contexts[0]:  # NOTE: shorter contexts cost at least the batch's weights pass
            return by_context[0][1]
        return interp(by_context, context)


@functools.cache
def prefill_table(points: Points1D, floor_ms: float) -> Points1D:
    """The prefill polyline, anchored at (0, floor_ms) so a few tokens cost about a bare step."""
    return ((0.0, floor_ms), *sorted(points)) if points[0][0] > 0 else tuple(sorted(points))


@functools.cache
def decode_table(points: Points2D) -> DecodeTable:
    by_context: dict[float, list[tuple[float, float]]] = {}
    for batch, context, ms in points:
        by_context.setdefault(float(context), []).append((float(batch), float(ms)))
    contexts = tuple(sorted(by_context))
    return DecodeTable(contexts, tuple(tuple(sorted(by_context[c])) for c in contexts))


def read_measurements(path: str | Path) -> tuple[dict, Points1D, Points2D]:
    """The shape `tandem bench profile` writes (and /work/shared/data/profiles' H100 file has):
    {"device", "model", "prefill_ms": {"ISL": ms}, "decode_step_ms": [[batch, context, ms], ...]}."""
    data = json.loads(Path(path).read_text())
    try:
        prefill = tuple(sorted((float(k), float(v)) for k, v in data["prefill_ms"].items()))
        decode = tuple((float(b), float(c), float(ms)) for b, c, ms in data["decode_step_ms"])
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ValueError(f"{path}: not an engine measurement file ({exc!r})") from None
    if len(prefill) < 2 or len({c for _, c, _ in decode}) < 1 or len(decode) < 2:
        raise ValueError(f"{path}: need >= 2 prefill points and >= 2 decode points")
    meta = {k: data[k] for k in ("device", "model", "date", "command", "engine") if k in data}
    return meta, prefill, decode
