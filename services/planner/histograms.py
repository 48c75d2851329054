"""Cumulative Prometheus histogram buckets read as Prometheus does: a quantile by linear interpolation inside
its bucket (histogram_quantile), and the share of observations at or under a bound. Pure."""

import math


def quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """`buckets`: (upper bound, cumulative count), any order, +Inf included. None when empty."""
    ordered = sorted(buckets)
    if not ordered or ordered[-1][1] <= 0:
        return None
    rank = q * ordered[-1][1]
    lower, below = 0.0, 0.0
    for upper, count in ordered:
        if count >= rank:
            if math.isinf(upper):
                return lower  # NOTE: as Prometheus: the highest finite bound
            return lower + (upper - lower) * (rank - below) / (count - below) if count > below else upper
        lower, below = upper, count
    return lower


def share_within(bound: float, buckets: list[tuple[float, float]]) -> float | None:
    """The share of observations <= `bound`, interpolating inside the bucket that holds it."""
    ordered = sorted(buckets)
    if not ordered or ordered[-1][1] <= 0:
        return None
    lower, below = 0.0, 0.0
    for upper, count in ordered:
        if bound < upper:
            inside = 0.0 if math.isinf(upper) else (count - below) * (bound - lower) / (upper - lower)
            return (below + inside) / ordered[-1][1]
        lower, below = upper, count
    return 1.0
