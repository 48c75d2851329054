"""Writes the Grafana dashboards (observability/grafana/dashboards/*.json) from the panel lists below.

The JSON files are what Grafana provisions; this script is where they are edited, so every query
reads as a list and the layout stays consistent. Run it after a change:
    python observability/grafana/build_dashboards.py
Only metrics from observability/README.md's catalog may appear (a unit test checks it).
"""

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

OUT_DIR = Path(__file__).resolve().parent / "dashboards"
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


# --- Overview: what clients see, from the gateway -------------------------------------------------------------

GW = 'model=~"$model"'
OVERVIEW = (
    Row(
        "Traffic",
        (
            Panel(
                "Requests by status",
                (Target(f"sum by (status) (rate(tandem_gateway_requests_total{{{GW}}}[{RATE}]))", "{{status}}"),),
                unit="reqps",
                width=8,
                description="Finished HTTP requests per second by final status (499: the client left).",
            ),
            Panel(
                "Error rate by status",
                (
                    Target(
                        f'sum by (status) (rate(tandem_gateway_requests_total{{{GW}, status!~"2.."}}[{RATE}]))'
                        f" / ignoring(status) group_left sum(rate(tandem_gateway_requests_total{{{GW}}}[{RATE}]))",
                        "{{status}}",
                    ),
                ),
                unit="percentunit",
                width=8,
                description="Share of all requests that ended with this non-2xx status (4xx: the client's, 5xx: ours).",
            ),
            Panel(
                "Requests in flight",
                (Target(f"sum by (model) (tandem_gateway_requests_in_flight{{{GW}}})", "{{model}}"),),
                width=8,
                description="Requests the gateway is serving now (admission refuses more than TANDEM_GATEWAY_MAX_INFLIGHT).",
            ),
        ),
    ),
    Row(
        "Latency",
        (
            Panel(
                "Time to first token",
                (
                    *quantiles("tandem_gateway_time_to_first_token_seconds", GW),
                    Target('max(tandem_gateway_slo_seconds{slo="ttft"})', "SLO"),
                ),
                unit="s",
                width=8,
                description="Request arrival to the first generated token.",
            ),
            Panel(
                "Inter-token latency",
                (
                    *quantiles("tandem_gateway_inter_token_latency_seconds", GW),
                    Target('max(tandem_gateway_slo_seconds{slo="itl"})', "SLO"),
                ),
                unit="s",
                width=8,
                description="Time between consecutive tokens of one choice.",
            ),
            Panel(
                "End-to-end latency",
                quantiles("tandem_gateway_request_duration_seconds", GW),
                unit="s",
                width=8,
                description="Request arrival to its last byte.",
            ),
        ),
    ),
    Row(
        "Goodput and tokens",
        (
            Panel(
                "Goodput",
                (
                    Target(f"sum(rate(tandem_gateway_goodput_requests_total{{{GW}}}[{RATE}]))", "met both SLOs"),
                    Target(f'sum(rate(tandem_gateway_requests_total{{{GW}, status=~"2.."}}[{RATE}]))', "successful"),
                ),
                unit="reqps",
                width=8,
                description="Successful requests per second, and those that met both the TTFT and the ITL SLO.",
            ),
            Panel(
                "Goodput share",
                (
                    Target(
                        f"sum(rate(tandem_gateway_goodput_requests_total{{{GW}}}[{RATE}]))"
                        f' / sum(rate(tandem_gateway_requests_total{{{GW}, status=~"2.."}}[{RATE}]))',
                        "met both SLOs",
                    ),
                ),
                unit="percentunit",
                width=8,
                description="Of the successful requests, the share that met both SLOs.",
            ),
            Panel(
                "Tokens per second",
                (
                    Target(f"sum(rate(tandem_gateway_prompt_tokens_total{{{GW}}}[{RATE}]))", "prompt"),
                    Target(f"sum(rate(tandem_gateway_completion_tokens_total{{{GW}}}[{RATE}]))", "generated"),
                ),
                unit="short",
                width=8,
                description="Prompt tokens of served requests and generated tokens, per second.",
            ),
        ),
    ),
)

# --- Workers: queues, KV cache, throughput and transfers of every prefill and decode worker -----------------

WK = 'worker_id=~"$worker", role=~"$role"'


def per_worker(metric: str, suffix: str = "") -> Target:
    return Target(f"sum by (worker_id) ({metric}{{{WK}}})", "{{worker_id}}" + suffix)


def per_worker_rate(metric: str, by: str = "worker_id") -> Target:
    legend = " ".join("{{" + b.strip() + "}}" for b in by.split(","))
    return Target(f"sum by ({by}) (rate({metric}{{{WK}}}[{RATE}]))", legend)


def per_worker_tier(metric: str, suffix: str = "") -> Target:
    """A per-tier gauge of every worker."""
    return Target(f"sum by (worker_id, tier) ({metric}{{{WK}}})", "{{worker_id}} {{tier}}" + suffix)


WORKERS = (
    Row(
        "Queues",
        (
            Panel(
                "Waiting requests",
                (per_worker("tandem_worker_requests_waiting"),),
                width=8,
                description="Requests queued in the engine, not yet scheduled.",
            ),
            Panel(
                "Running requests (batch size)",
                (per_worker("tandem_worker_requests_running"),),
                width=8,
                description="Requests in the running batch.",
            ),
            Panel(
                "Prefills held for KV pull",
                (per_worker("tandem_worker_requests_held"),),
                width=8,
                description="Prefill workers: finished prefills whose KV cache waits for a decode worker to pull it.",
            ),
        ),
    ),
    Row(
        "KV cache",
        (
            Panel(
                "KV blocks used / total",
                (
                    per_worker("tandem_worker_kv_blocks_used", " used"),
                    per_worker("tandem_worker_kv_blocks_total", " total"),
                ),
                width=8,
            ),
            Panel(
                "KV cache usage",
                (
                    Target(
                        f"sum by (worker_id) (tandem_worker_kv_blocks_used{{{WK}}})"
                        f" / sum by (worker_id) (tandem_worker_kv_blocks_total{{{WK}}})",
                        "{{worker_id}}",
                    ),
                ),
                unit="percentunit",
                width=8,
            ),
            Panel(
                "Prefix cache hit rate",
                (
                    Target(
                        f"sum by (worker_id) (rate(tandem_worker_prefix_cache_hits_total{{{WK}}}[{RATE}]))"
                        f" / sum by (worker_id) (rate(tandem_worker_prefix_cache_queries_total{{{WK}}}[{RATE}]))",
                        "{{worker_id}}",
                    ),
                ),
                unit="percentunit",
                width=8,
                description="Prompt tokens served from the prefix cache / prompt tokens looked up.",
            ),
            Panel(
                "Free blocks holding a reusable prefix", (per_worker("tandem_worker_kv_blocks_cached_free"),), width=12
            ),
            Panel(
                "Preemptions per second",
                (per_worker_rate("tandem_worker_preemptions_total"),),
                width=12,
                description="Sequences preempted (recomputed later) because KV blocks ran out.",
            ),
        ),
    ),
    Row(
        "KV tiers",
        (
            Panel(
                "Tier blocks used / total",
                (
                    per_worker_tier("tandem_worker_kv_tier_blocks_used", " used"),
                    per_worker_tier("tandem_worker_kv_tier_blocks_total", " total"),
                ),
                width=8,
                description="Host and disk KV tiers (workers run with --kv-host-gb / --kv-disk-gb).",
            ),
            Panel(
                "Tier hit rate",
                (
                    Target(
                        f"sum by (worker_id, tier) (rate(tandem_worker_kv_tier_prefix_hits_total{{{WK}}}[{RATE}]))"
                        f" / on (worker_id) group_left sum by (worker_id) "
                        f"(rate(tandem_worker_prefix_cache_queries_total{{{WK}}}[{RATE}]))",
                        "{{worker_id}} {{tier}}",
                    ),
                ),
                unit="percentunit",
                width=8,
                description="Prompt tokens onboarded from each tier / prompt tokens looked up.",
            ),
            Panel(
                "Onboarding time per second",
                (per_worker_rate("tandem_worker_kv_onboard_seconds_total"),),
                unit="s",
                width=8,
                description="Seconds of onboarding loads per second; divided by the rate of "
                "tandem_worker_kv_onboards_total it is the mean onboard latency.",
            ),
            Panel(
                "Bytes offloaded per second",
                (per_worker_rate("tandem_worker_kv_tier_offloaded_bytes_total", "worker_id, tier"),),
                unit="Bps",
                width=8,
                description="Into the host tier (write-through) and onto disk.",
            ),
            Panel(
                "Bytes onboarded per second",
                (per_worker_rate("tandem_worker_kv_tier_onboarded_bytes_total", "worker_id, tier"),),
                unit="Bps",
                width=8,
            ),
            Panel("Disk write errors", (per_worker("tandem_worker_kv_disk_write_errors_total"),), width=8),
        ),
    ),
    Row(
        "Throughput",
        (
            Panel(
                "Prefill tokens per second",
                (per_worker_rate("tandem_worker_prompt_tokens_total"),),
                width=8,
                description="Prompt tokens computed (cache hits excluded).",
            ),
            Panel("Decode tokens per second", (per_worker_rate("tandem_worker_generated_tokens_total"),), width=8),
            Panel("RPCs by status", (per_worker_rate("tandem_worker_rpcs_total", "rpc, code"),), unit="reqps", width=8),
        ),
    ),
    Row(
        "Speculative decoding",
        (
            Panel(
                "Acceptance rate",
                (
                    Target(
                        f"sum by (worker_id) (rate(tandem_worker_spec_accepted_tokens_total{{{WK}}}[{RATE}]))"
                        f" / sum by (worker_id) (rate(tandem_worker_spec_proposed_tokens_total{{{WK}}}[{RATE}]))",
                        "{{worker_id}}",
                    ),
                ),
                unit="percentunit",
                width=8,
                description="Proposed tokens accepted / proposed (workers with --speculative).",
            ),
            Panel(
                "Mean accepted length",
                (
                    Target(
                        f"sum by (worker_id) (rate(tandem_worker_spec_accepted_tokens_total{{{WK}}}[{RATE}]))"
                        f" / sum by (worker_id) (rate(tandem_worker_spec_verify_steps_total{{{WK}}}[{RATE}]))",
                        "{{worker_id}}",
                    ),
                ),
                width=8,
                description="Proposed tokens accepted per verifying step (each step also adds one token).",
            ),
            Panel(
                "Proposed and accepted tokens per second",
                (
                    per_worker_rate("tandem_worker_spec_proposed_tokens_total"),
                    per_worker_rate("tandem_worker_spec_accepted_tokens_total"),
                ),
                width=8,
            ),
        ),
    ),
    Row(
        "KV transfer",
        (
            Panel(
                "KV transfer bytes per second",
                (per_worker_rate("tandem_worker_kv_transfer_bytes_total", "worker_id, direction, transport"),),
                unit="Bps",
                width=12,
                description="Export: sent by a prefill worker; import: received by a decode worker "
                "(a NIXL READ counts on the decode side only).",
            ),
            Panel(
                "KV transfer latency",
                quantiles("tandem_worker_kv_transfer_seconds", WK, by="direction, transport"),
                unit="s",
                width=12,
                description="Time of one request's KV transfer.",
            ),
        ),
    ),
)

# --- Router: decisions, their cost, what it predicted, and the load it sees ---------------------------------

ROUTER = (
    Row(
        "Decisions",
        (
            Panel(
                "Decisions by policy and outcome",
                (
                    Target(
                        f"sum by (policy, outcome) (rate(tandem_router_decisions_total[{RATE}]))",
                        "{{policy}} {{outcome}}",
                    ),
                ),
                unit="reqps",
                width=8,
            ),
            Panel(
                "Route latency",
                quantiles("tandem_router_route_seconds", ""),
                unit="s",
                width=8,
                description="Time to take one routing decision.",
            ),
            Panel(
                "Workers by role",
                (Target("sum by (role) (tandem_router_workers)", "{{role}}"),),
                width=8,
                description="Workers holding a live lease.",
            ),
        ),
    ),
    Row(
        "Prefix overlap",
        (
            Panel(
                "Predicted overlap",
                (*quantiles("tandem_router_predicted_overlap_ratio", "", by="policy"),),
                unit="percentunit",
                width=12,
                description="Share of the prompt the chosen decode worker is predicted to hold cached.",
            ),
            Panel(
                "Predicted cached share of routed tokens",
                (
                    Target(
                        f"sum by (policy) (rate(tandem_router_predicted_cached_tokens_total[{RATE}]))"
                        f" / sum by (policy) (rate(tandem_router_routed_tokens_total[{RATE}]))",
                        "{{policy}}",
                    ),
                ),
                unit="percentunit",
                width=12,
            ),
        ),
    ),
    Row(
        "Load the router sees",
        (
            Panel(
                "Running requests (last report)",
                (Target("sum by (worker_id) (tandem_router_worker_requests_running)", "{{worker_id}}"),),
                width=6,
            ),
            Panel(
                "Waiting requests (last report)",
                (Target("sum by (worker_id) (tandem_router_worker_requests_waiting)", "{{worker_id}}"),),
                width=6,
            ),
            Panel(
                "Routed, not completed",
                (Target("sum by (worker_id) (tandem_router_worker_requests_in_flight)", "{{worker_id}}"),),
                width=6,
            ),
            Panel(
                "KV usage (last report)",
                (Target("max by (worker_id) (tandem_router_worker_kv_usage_ratio)", "{{worker_id}}"),),
                unit="percentunit",
                width=6,
            ),
        ),
    ),
)

# --- Planner: the load it predicts, the replicas it wants and has, and the SLOs it sizes for -------------------

PLANNER = (
    Row(
        "Load",
        (
            Panel(
                "Request rate: observed and predicted",
                (
                    Target('max(tandem_planner_observed_load{quantity="request_rate"})', "observed"),
                    Target('max(tandem_planner_predicted_load{quantity="request_rate"})', "predicted (next interval)"),
                ),
                unit="reqps",
                width=12,
                description="Arrivals per second over the last tick, and the predictor's "
                "forecast for the next adjustment interval.",
            ),
            Panel(
                "Prompt and output length",
                (
                    Target(
                        'max by (quantity) (tandem_planner_observed_load{quantity=~"isl|osl"})', "observed {{quantity}}"
                    ),
                    Target(
                        'max by (quantity) (tandem_planner_predicted_load{quantity=~"isl|osl"})',
                        "predicted {{quantity}}",
                    ),
                ),
                width=12,
                description="Mean prompt (ISL) and output (OSL) tokens per request.",
            ),
        ),
    ),
    Row(
        "Replicas",
        (
            Panel(
                "Desired and ready replicas",
                (
                    Target("sum by (role) (tandem_planner_replicas_desired)", "desired {{role}}"),
                    Target('sum by (role) (tandem_planner_replicas{state="ready"})', "ready {{role}}"),
                ),
                width=8,
                description="What the planner wants per role, and what serves now.",
            ),
            Panel(
                "Replicas by state",
                (Target("sum by (role, state) (tandem_planner_replicas)", "{{role}} {{state}}"),),
                width=8,
                description="Ready, starting (asked for, not serving yet) and draining (leaving after their requests).",
            ),
            Panel(
                "Scaling decisions",
                (
                    Target(
                        f"sum by (role, direction) (increase(tandem_planner_decisions_total[{RATE}]))",
                        "{{role}} {{direction}}",
                    ),
                ),
                width=8,
                description="Replica changes asked of the connector.",
            ),
        ),
    ),
    Row(
        "SLOs",
        (
            Panel(
                "Observed latency and the SLO",
                (
                    Target("max by (slo) (tandem_planner_observed_latency_seconds)", "observed {{slo}}"),
                    Target("max by (slo) (tandem_planner_slo_seconds)", "SLO {{slo}}"),
                ),
                unit="s",
                width=8,
                description="TTFT and inter-token latency at the SLO quantile (Prometheus source).",
            ),
            Panel(
                "SLO attainment",
                (Target("max by (slo) (tandem_planner_slo_attainment_ratio)", "{{slo}}"),),
                unit="percentunit",
                width=8,
                description="Share of requests (TTFT) and tokens (ITL) within the SLO.",
            ),
            Panel(
                "SLO budget per role",
                (Target("max by (role) (tandem_planner_slo_budget_ratio)", "{{role}}"),),
                width=8,
                description="The busiest worker's estimated latency over its SLO (> 1: over; < 0.8: room to shrink).",
            ),
        ),
    ),
    Row(
        "Health",
        (
            Panel(
                "Connector failures per second",
                (
                    Target(
                        f"sum by (connector, operation) (rate(tandem_planner_connector_failures_total[{RATE}]))",
                        "{{connector}} {{operation}}",
                    ),
                ),
                width=8,
                description="Failed reads and scaling calls (each retry).",
            ),
            Panel(
                "Ticks without metrics per second",
                (Target(f"sum(rate(tandem_planner_missing_observations_total[{RATE}]))", "held"),),
                width=8,
                description="Ticks whose load could not be read: every replica count was held.",
            ),
            Panel(
                "Held after a hand edit",
                (Target("max by (role) (tandem_planner_manual_hold)", "{{role}}"),),
                width=8,
                description="1 while a replica count changed by hand is left alone (Kubernetes connector).",
            ),
        ),
    ),
)

DASHBOARDS = {
    "overview": (
        "tandem-overview",
        "tandem / Overview",
        OVERVIEW,
        [variable("model", "model", "tandem_gateway_requests_total")],
    ),
    "workers": (
        "tandem-workers",
        "tandem / Workers",
        WORKERS,
        [
            variable("role", "role", "tandem_worker_kv_blocks_total"),
            variable("worker", "worker_id", "tandem_worker_kv_blocks_total"),
        ],
    ),
    "router": ("tandem-router", "tandem / Router", ROUTER, []),
    "planner": ("tandem-planner", "tandem / Planner", PLANNER, []),
}


def panel_json(panel: Panel, panel_id: int, x: int, y: int) -> dict:
    targets = [
        {"refId": chr(ord("A") + i), "datasource": PROMETHEUS, "expr": t.expr, "legendFormat": t.legend, "range": True}
        for i, t in enumerate(panel.targets)
    ]
    return {
        "id": panel_id,
        "type": panel.kind,
        "title": panel.title,
        "description": panel.description,
        "datasource": PROMETHEUS,
        "gridPos": {"h": 8, "w": panel.width, "x": x, "y": y},
        "fieldConfig": {
            "defaults": {"unit": panel.unit, "min": 0, "custom": {"fillOpacity": 10, "showPoints": "never"}},
            "overrides": [],
        },
        "options": {
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
        "targets": targets,
    }


def dashboard_json(uid: str, title: str, rows: tuple[Row, ...], variables: list[dict]) -> dict:
    panels, y, panel_id = [], 0, 1
    for row in rows:
        panels.append(
            {
                "id": panel_id,
                "type": "row",
                "title": row.title,
                "collapsed": False,
                "panels": [],
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
            }
        )
        panel_id, y, x = panel_id + 1, y + 1, 0
        for panel in row.panels:
            if x + panel.width > 24:
                x, y = 0, y + 8
            panels.append(panel_json(panel, panel_id, x, y))
            panel_id, x = panel_id + 1, x + panel.width
        y += 8
    links = [
        {
            "title": "tandem",
            "type": "dashboards",
            "tags": ["tandem"],
            "asDropdown": False,
            "includeVars": False,
            "keepTime": True,
        }
    ]
    return {
        "uid": uid,
        "title": title,
        "tags": ["tandem"],
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "10s",
        "timezone": "browser",
        "time": {"from": "now-30m", "to": "now"},
        "links": links,
        "annotations": {"list": []},
        "templating": {"list": variables},
        "panels": panels,
    }


def render() -> dict[str, str]:
    """File name -> JSON text of every dashboard."""
    return {f"{name}.json": json.dumps(dashboard_json(*spec), indent=2) + "\n" for name, spec in DASHBOARDS.items()}


def main() -> int:
    OUT_DIR.mkdir(exist_ok=True)
    for name, text in render().items():
        (OUT_DIR / name).write_text(text)
        print(OUT_DIR / name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
