"""Prometheus metrics of the gateway: requests by route/model/status, TTFT, inter-token and end-to-end
latency, prompt/completion tokens, requests in flight. One registry per app, so tests can build many.

Under several gateway processes (PROMETHEUS_MULTIPROC_DIR set by the supervisor before prometheus-client is
imported) every process writes its values to that directory and /metrics, in any process, merges them all.
"""

import logging
import os
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.multiprocess import MultiProcessCollector

from services.common.metrics import LATENCY_BUCKETS as WORKER_LATENCY_BUCKETS

# 5 ms to 10 minutes: the workers' latency buckets from 5 ms on
LATENCY_BUCKETS = WORKER_LATENCY_BUCKETS[WORKER_LATENCY_BUCKETS.index(0.005) :]
# the routes and statuses every request series starts with, at zero, so dashboards have data from start-up
ROUTES = ("/v1/chat/completions", "/v1/completions")
KNOWN_STATUSES = ("200", "400", "429", "499", "500", "503")
ITL_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.015,
    0.02,
    0.03,
    0.05,
    0.075,
    0.1,
    0.15,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)


log = logging.getLogger(__name__)


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry | None = None, slo_ttft_s: float = 2.0, slo_itl_s: float = 0.1):
        self.registry = registry or CollectorRegistry()
        self.slo_ttft_s, self.slo_itl_s = slo_ttft_s, slo_itl_s
        r = self.registry
        self.requests = Counter(
            "tandem_gateway_requests",
            "HTTP requests by final status (499: client left)",
            ["route", "model", "status"],
            registry=r,
        )
        self.ttft = Histogram(
            "tandem_gateway_time_to_first_token_seconds",
            "Request arrival to first token",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "tandem_gateway_inter_token_latency_seconds",
            "Time between tokens of one choice",
            ["model"],
            buckets=ITL_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "tandem_gateway_request_duration_seconds",
            "Request arrival to its last byte",
            ["route", "model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.prompt_tokens = Counter(
            "tandem_gateway_prompt_tokens", "Prompt tokens of served requests", ["model"], registry=r
        )
        self.completion_tokens = Counter("tandem_gateway_completion_tokens", "Generated tokens", ["model"], registry=r)
        self.inflight = Gauge(
            "tandem_gateway_requests_in_flight",
            "Requests being served",
            ["model"],
            registry=r,
            multiprocess_mode="livesum",
        )
        self.goodput = Counter(
            "tandem_gateway_goodput_requests",
            "Successful requests that met the TTFT and mean inter-token latency SLOs",
            ["model"],
            registry=r,
        )
        self.migrations = Counter(
            "tandem_gateway_migrations",
            "Requests moved to another worker after theirs failed mid-stream (prompt + tokens so far)",
            ["model"],
            registry=r,
        )
        slo = Gauge(
            "tandem_gateway_slo_seconds",
            "The SLOs goodput is judged against",
            ["slo"],
            registry=r,
            multiprocess_mode="max",
        )
        slo.labels("ttft").set(slo_ttft_s)
        slo.labels("itl").set(slo_itl_s)
        self._multiproc_dir = os.environ.get("PROMETHEUS_MULTIPROC_DIR")

    def start_at_zero(self, model: str) -> None:
        """Create every series of `model` the dashboards read, so each exists (at 0) before the first request."""
        for route in ROUTES:
            for status in KNOWN_STATUSES:
                self.requests.labels(route, model, status)
            self.e2e.labels(route, model)
        for family in (
            self.ttft,
            self.itl,
            self.prompt_tokens,
            self.completion_tokens,
            self.inflight,
            self.goodput,
            self.migrations,
        ):
            family.labels(model)

    def migrated(self, model: str) -> None:
        self.migrations.labels(model).inc()

    def start(self, route: str, model: str) -> "RequestTimer":
        return RequestTimer(self, route, model)

    def render(self) -> tuple[bytes, str]:
        if self._multiproc_dir is None:
            return generate_latest(self.registry), CONTENT_TYPE_LATEST
        merged = CollectorRegistry()
        MultiProcessCollector(merged, path=self._multiproc_dir)
        return generate_latest(merged), CONTENT_TYPE_LATEST


class RequestTimer:
    """One request's clock: TTFT at its first token, ITL per choice, totals once at the end."""

    def __init__(self, metrics: GatewayMetrics, route: str, model: str):
        self._m, self._route, self._model = metrics, route, model
        self._start = time.perf_counter()
        self._first: float | None = None
        self._last: dict[int, float] = {}  # choice index -> when its latest tokens came
        self.request_id = ""
        self.num_prompt_tokens = 0
        self.num_completion_tokens = 0
        self.num_cached_tokens = 0  # prompt tokens a worker found in its prefix cache (the most any choice saw)
        self.is_finished = False
        self._itl = metrics.itl.labels(model)  # NOTE: looked up once; observed per token
        metrics.inflight.labels(model).inc()

    def on_tokens(self, index: int, num_tokens: int) -> None:
        now = time.perf_counter()
        if not self._last:
            self._first = now
            self._m.ttft.labels(self._model).observe(now - self._start)
        last = self._last.get(index)
        if last is not None and num_tokens:
            gap = (now - last) / num_tokens
            for _ in range(num_tokens):
                self._itl.observe(gap)
        self._last[index] = now
        self.num_completion_tokens += num_tokens

    def on_cached_tokens(self, num_cached_tokens: int | None) -> None:
        if num_cached_tokens is not None and num_cached_tokens > self.num_cached_tokens:
            self.num_cached_tokens = num_cached_tokens

    def finish(self, status: int) -> None:
        """Record the outcome; only the first call counts."""
        if self.is_finished:
            return
        self.is_finished = True
        m, model = self._m, self._model
        m.inflight.labels(model).dec()
        m.requests.labels(self._route, model, str(status)).inc()
        m.e2e.labels(self._route, model).observe(time.perf_counter() - self._start)
        m.prompt_tokens.labels(model).inc(self.num_prompt_tokens)
        m.completion_tokens.labels(model).inc(self.num_completion_tokens)
        ttft = self._first - self._start if self._first is not None else None
        itl = self.mean_itl_s()
        if status == 200 and ttft is not None and ttft <= m.slo_ttft_s and (itl is None or itl <= m.slo_itl_s):
            m.goodput.labels(model).inc()
        log.info(
            "%s %d",
            self._route,
            status,
            extra={
                "req_id": self.request_id,
                "status": status,
                "prompt_tokens": self.num_prompt_tokens,
                "completion_tokens": self.num_completion_tokens,
                "duration_s": round(time.perf_counter() - self._start, 6),
                "ttft_s": round(ttft, 6) if ttft is not None else None,
            },
        )

    def mean_itl_s(self) -> float | None:
        """Mean time per token after the first, over every choice (None with one token or none)."""
        if self._first is None or self.num_completion_tokens <= len(self._last):
            return None
        span = max(self._last.values()) - self._first
        return span / (self.num_completion_tokens - len(self._last))
