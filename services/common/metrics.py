"""Prometheus plumbing shared by the gRPC services: latency buckets, the /metrics HTTP endpoint, and the
worker's metrics (engine gauges read at scrape time, RPC and KV-transfer counters updated as they happen).
Names and meanings are documented in observability/README.md."""

import logging
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from engines.base import EngineStats

log = logging.getLogger(__name__)

# 1 ms to 10 minutes: a cached short prompt on a GPU up to a long generation on a CPU
LATENCY_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.25,
    0.5,
    0.75,
    1.0,
    1.5,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
)
# a routing decision: microseconds to a (pathological) second
FAST_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


class MetricsEndpoint:
    """/metrics over HTTP on its own port (a daemon thread). port -1: none; 0: any free port."""

    def __init__(self, registry: CollectorRegistry, host: str, port: int):
        self.port = -1
        self._server = None
        if port < 0:
            return
        self._server, _ = start_http_server(port, addr=host, registry=registry)
        self.port = self._server.server_port
        log.info("metrics on http://%s:%d/metrics", host, self.port)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


class EngineCollector(Collector):
    """The engine's own counters and gauges, read when Prometheus scrapes (never stale, no polling)."""

    def __init__(self, stats: Callable[[], EngineStats], worker_id: Callable[[], str], role: str, model_name: str = ""):
        self._stats, self._worker_id, self._role, self._model_name = stats, worker_id, role, model_name

    def collect(self):
        s = self._stats()
        labels = ["worker_id", "role"]
        values = [self._worker_id(), self._role]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc, labels=labels)
            g.add_metric(values, value)
            return g

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            c = CounterMetricFamily(name, doc, labels=labels)
            c.add_metric(values, value)
            return c

        yield gauge("tandem_worker_requests_waiting", "Requests queued in the engine", s.num_waiting)
        yield gauge("tandem_worker_requests_running", "Requests in the running batch (the batch size)", s.num_running)
        yield gauge("tandem_worker_requests_held", "Finished prefills whose KV waits to be pulled", s.num_held)
        yield gauge("tandem_worker_kv_blocks_used", "KV cache blocks in use", s.num_blocks_used)
        yield gauge("tandem_worker_kv_blocks_total", "KV cache blocks in the pool", s.num_blocks_total)
        yield gauge(
            "tandem_worker_kv_blocks_cached_free",
            "Free blocks still holding a reusable prefix",
            s.num_blocks_cached_free,
        )
        yield counter(
            "tandem_worker_prefix_cache_queries", "Prompt tokens looked up in the prefix cache", s.prefix_queries
        )
        yield counter("tandem_worker_prefix_cache_hits", "Prompt tokens served from the prefix cache", s.prefix_hits)
        yield counter("tandem_worker_prompt_tokens", "Prompt tokens computed", s.num_prompt_tokens_computed)
        yield counter("tandem_worker_generated_tokens", "Tokens generated", s.num_generated_tokens)
        yield counter("tandem_worker_preemptions", "Sequences preempted for lack of KV blocks", s.num_preemptions)
        yield counter(
            "tandem_worker_grammar_masks",
            "Sampling rows masked by a grammar (one per constrained token)",
            s.num_grammar_masks,
        )
        yield counter(
            "tandem_worker_grammar_mask_seconds",
            "Time on grammar masks: building matchers (grammar thread), feeding them and filling masks (step thread)",
            s.grammar_mask_seconds,
        )
        yield counter(
            "tandem_worker_grammar_wait_seconds",
            "Step-thread time on grammar masks: starting them, and filling them after the forward pass",
            s.grammar_wait_seconds,
        )
        yield counter(
            "tandem_worker_spec_proposed_tokens",
            "Speculative decoding: tokens proposed and verified",
            s.num_spec_proposed,
        )
        yield counter(
            "tandem_worker_spec_accepted_tokens", "Speculative decoding: proposed tokens accepted", s.num_spec_accepted
        )
        yield counter(
            "tandem_worker_spec_verify_steps",
            "Speculative decoding: sequence-steps that verified proposals",
            s.num_spec_verify_steps,
        )
        if s.num_host_blocks_total:
            yield from tier_metrics(s, labels, values)
        yield from model_server_metrics(s, self._model_name)


# NOTE: the names the Gateway API Inference Extension's endpoint picker (and llm-d's, KEDA, inference-perf) read from
# a vLLM model server by default; the same meaning here, so those tools read a tandem worker unchanged
MODEL_SERVER_METRICS = ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc")


def model_server_metrics(s: EngineStats, model_name: str):
    """Queue depth, running batch and KV usage (a fraction, 0-1, as vLLM's) under the model-server names."""
    values = (s.num_waiting, s.num_running, s.num_blocks_used / s.num_blocks_total if s.num_blocks_total else 0.0)
    docs = ("Requests waiting to be scheduled", "Requests in the running batch", "KV cache usage: 1 is full")
    for name, doc, value in zip(MODEL_SERVER_METRICS, docs, values):
        metric = GaugeMetricFamily(name, doc, labels=["model_name"])
        metric.add_metric([model_name], value)
        yield metric


def tier_metrics(s: EngineStats, labels: list[str], values: list[str]):
    """The host and disk KV tiers (only when the worker has them): one series per tier."""
    per_tier = {
        "host": (
            s.num_host_blocks_used,
            s.num_host_blocks_total,
            s.num_blocks_offloaded_host,
            s.num_blocks_onboarded_host,
            s.prefix_hits_host,
        ),
        "disk": (
            s.num_disk_blocks_used,
            s.num_disk_blocks_total,
            s.num_blocks_offloaded_disk,
            s.num_blocks_onboarded_disk,
            s.prefix_hits_disk,
        ),
    }
    families = [
        (GaugeMetricFamily, "tandem_worker_kv_tier_blocks_used", "KV blocks held in the tier", 0, 1),
        (GaugeMetricFamily, "tandem_worker_kv_tier_blocks_total", "KV blocks the tier can hold", 1, 1),
        (CounterMetricFamily, "tandem_worker_kv_tier_offloaded_blocks", "KV blocks written into the tier", 2, 1),
        (
            CounterMetricFamily,
            "tandem_worker_kv_tier_offloaded_bytes",
            "KV bytes written into the tier",
            2,
            s.kv_block_bytes,
        ),
        (
            CounterMetricFamily,
            "tandem_worker_kv_tier_onboarded_blocks",
            "KV blocks loaded from the tier to the device",
            3,
            1,
        ),
        (
            CounterMetricFamily,
            "tandem_worker_kv_tier_onboarded_bytes",
            "KV bytes loaded from the tier to the device",
            3,
            s.kv_block_bytes,
        ),
        (
            CounterMetricFamily,
            "tandem_worker_kv_tier_prefix_hits",
            "Prompt tokens served from the tier (of tandem_worker_prefix_cache_queries)",
            4,
            1,
        ),
    ]
    for family, name, doc, index, scale in families:
        metric = family(name, doc, labels=[*labels, "tier"])
        for tier, row in per_tier.items():
            metric.add_metric([*values, tier], row[index] * scale)
        yield metric
    for family, name, doc, value in (
        (CounterMetricFamily, "tandem_worker_kv_onboards", "Onboarding loads that ended well", s.num_onboards),
        (CounterMetricFamily, "tandem_worker_kv_onboard_seconds", "Summed latency of those loads", s.onboard_seconds),
        (
            CounterMetricFamily,
            "tandem_worker_kv_disk_write_errors",
            "Failed writes to the disk tier",
            s.num_disk_write_errors,
        ),
        (
            CounterMetricFamily,
            "tandem_worker_kv_disk_blocks_refused",
            "Disk tier files refused and removed: planted, another worker's, tampered or corrupt",
            s.num_disk_blocks_refused,
        ),
        (
            GaugeMetricFamily,
            "tandem_worker_kv_prefill_tokens_per_second",
            "Measured prefill rate (the cost check's yardstick)",
            s.prefill_tokens_per_s,
        ),
    ):
        metric = family(name, doc, labels=labels)
        metric.add_metric(values, value)
        yield metric


class WorkerMetrics:
    def __init__(
        self,
        stats: Callable[[], EngineStats],
        worker_id: Callable[[], str],
        role: str,
        registry: CollectorRegistry | None = None,
        model_name: str = "",
    ):
        self.registry = registry or CollectorRegistry()
        self.role = role
        self._worker_id = worker_id
        self.registry.register(EngineCollector(stats, worker_id, role, model_name))
        labels = ["worker_id", "role"]
        self.rpcs = Counter(
            "tandem_worker_rpcs",
            "Requests served by RPC and gRPC status",
            [*labels, "rpc", "code"],
            registry=self.registry,
        )
        self.kv_bytes = Counter(
            "tandem_worker_kv_transfer_bytes",
            "KV cache bytes sent to / received from another worker",
            [*labels, "direction", "transport"],
            registry=self.registry,
        )
        self.kv_seconds = Histogram(
            "tandem_worker_kv_transfer_seconds",
            "Time of one request's KV transfer",
            [*labels, "direction", "transport"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.kv_handles_refused = Counter(
            "tandem_worker_kv_handles_refused",
            "KV handles a decode worker refused before any pull or READ, by reason",
            [*labels, "reason"],
            registry=self.registry,
        )

    def kv_handle_refused(self, reason: str) -> None:
        """A decode worker refused a KV handle (kv_signing.py names the reasons)."""
        self.kv_handles_refused.labels(self._worker_id(), self.role, reason).inc()

    def start_at_zero(self, rpcs: tuple[str, ...], directions: tuple[str, ...], transport: str) -> None:
        """Create this worker's RPC (status OK) and KV-transfer series (over its own transport), so each exists
        (at 0) from start-up; call once the worker id is known."""
        key = (self._worker_id(), self.role)
        for rpc in rpcs:
            self.rpcs.labels(*key, rpc, "OK")
        for direction in directions:
            self.kv_bytes.labels(*key, direction, transport)
            self.kv_seconds.labels(*key, direction, transport)

    def rpc_done(self, rpc: str, code: str) -> None:
        self.rpcs.labels(self._worker_id(), self.role, rpc, code).inc()

    def kv_transfer(self, direction: str, num_bytes: int, seconds: float, transport: str) -> None:
        """One request's KV moved: `transport` is "nixl" (a READ), "grpc" (PullKv through staging memory) or
        "bytes" (PullKv of an engine that takes KV as bytes)."""
        self.kv_bytes.labels(self._worker_id(), self.role, direction, transport).inc(num_bytes)
        self.kv_seconds.labels(self._worker_id(), self.role, direction, transport).observe(seconds)
