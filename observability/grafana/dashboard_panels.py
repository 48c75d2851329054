"""The dashboards' building blocks: a query (Target), a panel, a row, and the helpers every panel list uses.

Plain data: the panel lists beside it are made of these, and build_dashboards.py alone writes the JSON."""

from dataclasses import dataclass, field

PROMETHEUS = {"type": "prometheus", "uid": "prometheus"}
RATE = "$__rate_interval"
QUANTILES = (0.5, 0.9, 0.99)


@dataclass(frozen=True, slots=True)
class Target:
    expr: str
    legend: str = ""


@dataclass(frozen=True, slots=True)
class Panel:
    title: str
    targets: tuple[Target, ...]
    unit: str = "short"
    description: str = ""
    width: int = 12
    kind: str = "timeseries"


@dataclass(frozen=True, slots=True)
class Row:
    title: str
    panels: tuple[Panel, ...] = field(default_factory=tuple)


def quantiles(metric: str, selector: str, by: str = "") -> tuple[Target, ...]:
    """p50/p90/p99 of a histogram, from the rate of its buckets."""
    group = ", ".join(["le", *([by] if by else [])])
    suffix = "".join(" {{" + b.strip() + "}}" for b in by.split(",")) if by else ""
    series = f"{metric}_bucket{{{selector}}}" if selector else f"{metric}_bucket"
    return tuple(
        Target(f"histogram_quantile({q}, sum by ({group}) (rate({series}[{RATE}])))", f"p{int(q * 100)}{suffix}")
        for q in QUANTILES
    )


def variable(name: str, label: str, metric: str) -> dict:
    """A multi-value query variable whose 'All' is the regex .* (queries match it with =~)."""
    query = f"label_values({metric}, {label})"
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": PROMETHEUS,
        "query": {"query": query, "refId": f"{name}-values"},
        "definition": query,
        "refresh": 2,
        "sort": 1,
        "multi": True,
        "includeAll": True,
        "allValue": ".*",
        "current": {"text": ["All"], "value": ["$__all"]},
    }
