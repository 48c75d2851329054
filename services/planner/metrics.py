"""Prometheus metrics of the planner: predicted and observed load, desired and actual replicas per role, SLO
budgets and attainment, decisions, connector failures, ticks without metrics, counts held after a hand edit.
Documented in observability/README.md."""

from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge

from services.planner.types import ROLES, Observation, Replicas, TickResult, WorkerRole

STATES = ("ready", "starting", "draining")
QUANTITIES = ("request_rate", "isl", "osl")
OPERATIONS = ("replicas", "scale")


class PlannerMetrics:
    def __init__(self, connector: str, slo: dict[str, float], registry: CollectorRegistry | None = None):
        self.registry = r = registry or CollectorRegistry()
        self.connector = connector
        self.predicted = Gauge(
            "tandem_planner_predicted_load",
            "The next interval's predicted load: request_rate (req/s), isl and osl (tokens)",
            ["quantity"],
            registry=r,
        )
        self.observed = Gauge(
            "tandem_planner_observed_load", "The last tick's observed load (same quantities)", ["quantity"], registry=r
        )
        self.desired = Gauge("tandem_planner_replicas_desired", "Replicas the planner wants", ["role"], registry=r)
        self.replicas = Gauge(
            "tandem_planner_replicas", "Replicas the connector reports, by state", ["role", "state"], registry=r
        )
        self.budget = Gauge(
            "tandem_planner_slo_budget_ratio",
            "The busiest worker's estimated latency over its SLO (TTFT for prefill, ITL for decode)",
            ["role"],
            registry=r,
        )
        self.latency = Gauge(
            "tandem_planner_observed_latency_seconds", "Observed TTFT and ITL at the SLO quantile", ["slo"], registry=r
        )
        self.attainment = Gauge(
            "tandem_planner_slo_attainment_ratio",
            "Share of requests (TTFT) or tokens (ITL) within the SLO over the last window",
            ["slo"],
            registry=r,
        )
        self.slo = Gauge("tandem_planner_slo_seconds", "The SLOs the planner sizes for", ["slo"], registry=r)
        self.decisions = Counter(
            "tandem_planner_decisions", "Replica changes asked of the connector", ["role", "direction"], registry=r
        )
        self.failures = Counter(
            "tandem_planner_connector_failures",
            "Connector calls that failed (each attempt)",
            ["connector", "operation"],
            registry=r,
        )
        self.missing = Counter(
            "tandem_planner_missing_observations", "Ticks without metrics: every count held", registry=r
        )
        self.held = Gauge(
            "tandem_planner_manual_hold", "1 while a hand-edited replica count is left alone", ["role"], registry=r
        )
        self._zero(slo)

    def _zero(self, slo: dict[str, float]) -> None:
        """Every labelled series exists from the start: counts at 0, what is not known yet at NaN."""
        for name, seconds in slo.items():
            self.slo.labels(name).set(seconds)
            self.latency.labels(name).set(float("nan"))
            self.attainment.labels(name).set(float("nan"))
        for quantity in QUANTITIES:
            self.predicted.labels(quantity).set(float("nan"))
            self.observed.labels(quantity).set(float("nan"))
        for role in ROLES:
            self.desired.labels(role.value)
            self.budget.labels(role.value)
            self.held.labels(role.value)
            for direction in ("up", "down"):
                self.decisions.labels(role.value, direction)
            for state in STATES:
                self.replicas.labels(role.value, state)
        for operation in OPERATIONS:
            self.failures.labels(self.connector, operation)

    def ticked(self, obs: Observation, result: TickResult) -> None:
        if obs.num_requests is None:
            self.missing.inc()
        elif obs.window_s > 0:
            self.observed.labels("request_rate").set(obs.num_requests / obs.window_s)
            for name, value in (("isl", obs.mean_isl), ("osl", _osl(obs))):
                if value is not None:
                    self.observed.labels(name).set(value)
        if result.predicted is not None:
            for name in QUANTITIES:
                self.predicted.labels(name).set(getattr(result.predicted, name))
        for role, target in result.targets.items():
            self.desired.labels(role.value).set(target)
        for role, value in result.budgets.items():
            self.budget.labels(role.value).set(value)
        for name, value in (("ttft", obs.ttft_s), ("itl", obs.itl_s)):
            if value is not None:
                self.latency.labels(name).set(value)
        for name, value in obs.attainment.items():
            self.attainment.labels(name).set(value)
        self.counted(obs.replicas)

    def counted(self, replicas: Mapping[WorkerRole, Replicas]) -> None:
        for role, r in replicas.items():
            for state in STATES:
                self.replicas.labels(role.value, state).set(getattr(r, state))
            self.held.labels(role.value).set(1 if r.is_held else 0)

    def scaled(self, role: WorkerRole, current: int, target: int) -> None:
        self.decisions.labels(role.value, "up" if target > current else "down").inc()

    def failed(self, operation: str) -> None:
        self.failures.labels(self.connector, operation).inc()


def _osl(obs: Observation) -> float | None:
    if obs.num_output_tokens is not None and obs.num_requests:
        return obs.num_output_tokens / obs.num_requests
    return obs.mean_osl
