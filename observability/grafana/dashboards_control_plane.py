"""The panel lists of the Router and Planner dashboards."""

from dashboard_panels import RATE, Panel, Row, Target, quantiles

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
