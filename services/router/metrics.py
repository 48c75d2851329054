"""Prometheus metrics of the router: decisions by policy and outcome, decision time, predicted prefix
overlap, and the per-worker load the router sees (read from the registry at scrape time).
Documented in observability/README.md."""

from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from services.common.metrics import FAST_BUCKETS
from services.router.types import RouteDecision, WorkerRole, WorkerView

# decided, or failed with these gRPC statuses (lower case, as RouterError subclasses name them)
KNOWN_OUTCOMES = ("aggregated", "disaggregated", "unavailable", "not_found", "invalid_argument", "resource_exhausted")
OVERLAP_BUCKETS = (0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)


class RegistryCollector(Collector):
    """Workers with a live lease, and what each last reported, as gauges; with a prefix index, its size."""

    def __init__(
        self, views: Callable[[], Iterable[WorkerView]], index_blocks: Callable[[], dict[str, int]] | None = None
    ):
        self._views = views
        self._index_blocks = index_blocks

    def collect(self):
        views = list(self._views())
        workers = GaugeMetricFamily("tandem_router_workers", "Workers holding a live lease", labels=["role"])
        for role in WorkerRole:
            workers.add_metric([role.value], sum(v.info.role is role for v in views))
        yield workers
        labels = ["worker_id", "role"]
        running = GaugeMetricFamily(
            "tandem_router_worker_requests_running", "Running requests the worker last reported", labels=labels
        )
        waiting = GaugeMetricFamily(
            "tandem_router_worker_requests_waiting", "Waiting requests the worker last reported", labels=labels
        )
        kv = GaugeMetricFamily(
            "tandem_router_worker_kv_usage_ratio", "Used / total KV blocks the worker last reported", labels=labels
        )
        inflight = GaugeMetricFamily(
            "tandem_router_worker_requests_in_flight",
            "Requests routed to the worker and not yet completed",
            labels=labels,
        )
        for v in views:
            key = [v.worker_id, v.info.role.value]
            running.add_metric(key, v.load.num_running)
            waiting.add_metric(key, v.load.num_waiting)
            kv.add_metric(key, v.load.num_blocks_used / v.load.num_blocks_total if v.load.num_blocks_total else 0.0)
            inflight.add_metric(key, v.num_inflight)
        yield from (running, waiting, kv, inflight)
        if self._index_blocks is not None:
            indexed = GaugeMetricFamily(
                "tandem_router_kv_index_blocks",
                "KV blocks the prefix index holds per worker, from its KV events",
                labels=["worker_id"],
            )
            for worker_id, count in self._index_blocks().items():
                indexed.add_metric([worker_id], count)
            yield indexed


class RouterMetrics:
    def __init__(
        self,
        views: Callable[[], Iterable[WorkerView]],
        registry: CollectorRegistry | None = None,
        index_blocks: Callable[[], dict[str, int]] | None = None,
    ):
        self.registry = registry or CollectorRegistry()
        r = self.registry
        r.register(RegistryCollector(views, index_blocks))
        self.decisions = Counter(
            "tandem_router_decisions", "Route calls by policy and outcome", ["policy", "outcome"], registry=r
        )
        self.route_seconds = Histogram(
            "tandem_router_route_seconds",
            "Time to take one routing decision",
            ["policy"],
            buckets=FAST_BUCKETS,
            registry=r,
        )
        self.overlap = Histogram(
            "tandem_router_predicted_overlap_ratio",
            "Share of the prompt predicted cached at the chosen decode worker",
            ["policy"],
            buckets=OVERLAP_BUCKETS,
            registry=r,
        )
        self.cached_tokens = Counter(
            "tandem_router_predicted_cached_tokens",
            "Prompt tokens predicted cached at the chosen worker",
            ["policy"],
            registry=r,
        )
        self.routed_tokens = Counter("tandem_router_routed_tokens", "Prompt tokens routed", ["policy"], registry=r)
        self.worker_failures = Counter(
            "tandem_router_worker_failures",
            "Failures gateways reported, each starting a quarantine",
            ["worker_id"],
            registry=r,
        )

    def start_at_zero(self, policy: str) -> None:
        """Create the series of `policy` the dashboards read, so each exists (at 0) from start-up."""
        for outcome in KNOWN_OUTCOMES:
            self.decisions.labels(policy, outcome)
        for family in (self.route_seconds, self.overlap, self.cached_tokens, self.routed_tokens):
            family.labels(policy)

    def decided(self, decision: RouteDecision, num_tokens: int, seconds: float) -> None:
        policy = decision.policy
        self.decisions.labels(policy, "disaggregated" if decision.prefill is not None else "aggregated").inc()
        self.route_seconds.labels(policy).observe(seconds)
        self.overlap.labels(policy).observe(decision.num_cached_tokens / num_tokens if num_tokens else 0.0)
        self.cached_tokens.labels(policy).inc(decision.num_cached_tokens)
        self.routed_tokens.labels(policy).inc(num_tokens)

    def failed(self, policy: str, outcome: str) -> None:
        self.decisions.labels(policy, outcome).inc()

    def worker_failed(self, worker_id: str) -> None:
        self.worker_failures.labels(worker_id).inc()
