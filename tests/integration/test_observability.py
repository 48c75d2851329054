"""Observability of a live stack (router, 1 prefill, 1 decode, gateway and planner as real processes,
disaggregated):
one request is one OTLP trace across all four services, correctly parented; every log line is JSON and the
request's lines carry its trace id; every service serves /metrics and `tandem up`'s file_sd file lists them;
and a real Prometheus scraping the stack returns data for every PromQL expression of every dashboard."""

import json
import os
import re
import secrets
import shutil
import subprocess
import threading
import time
from collections import defaultdict
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from engines.transfer.nixl_link import is_available
from tandem.launcher import free_port
from tests.integration.conftest import running_stack
from tests.integration.helpers import poll

REPO = Path(__file__).resolve().parents[2]
DASHBOARDS = REPO / "observability" / "grafana" / "dashboards"
SERVICES = ("gateway", "router", "prefill", "decode")
PROMPT = "tell me about the " + "very " * 40 + "long prompt"  # long enough to go through the prefill worker


@dataclass(frozen=True)
class Span:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    start_ns: int
    end_ns: int


class OtlpReceiver(trace_service_pb2_grpc.TraceServiceServicer):
    """The OTLP/gRPC trace endpoint of a collector, keeping every span it is sent."""

    def __init__(self):
        self.spans: list[Span] = []
        self._lock = threading.Lock()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")

    def Export(self, request, context):
        with self._lock:
            for resource_spans in request.resource_spans:
                attrs = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
                for scope_spans in resource_spans.scope_spans:
                    for s in scope_spans.spans:
                        self.spans.append(
                            Span(
                                attrs.get("service.name", "?"),
                                s.name,
                                s.trace_id.hex(),
                                s.span_id.hex(),
                                s.parent_span_id.hex(),
                                s.start_time_unix_nano,
                                s.end_time_unix_nano,
                            )
                        )
        return trace_service_pb2.ExportTraceServiceResponse()

    def trace(self, trace_id: str) -> list[Span]:
        with self._lock:
            return [s for s in self.spans if s.trace_id == trace_id]


@pytest.fixture(scope="module")
def otlp():
    receiver = OtlpReceiver()
    receiver.server.start()
    yield receiver
    receiver.server.stop(0)


@pytest.fixture(scope="module")
def prometheus_port() -> int:
    return free_port()


# the planner reads the test's Prometheus (its SLO panels need the gateway's histograms) and, held at one worker
# per role, never scales the stack under the other tests
PLANNER_ENV = {
    "TANDEM_PLANNER_SOURCE": "prometheus",
    "TANDEM_PLANNER_PROMETHEUS_RANGE_S": "10",
    "TANDEM_PLANNER_TICK_S": "0.5",
    "TANDEM_PLANNER_ADJUSTMENT_INTERVAL_S": "1",
    "TANDEM_PLANNER_MAX_PREFILL": "1",
    "TANDEM_PLANNER_MAX_DECODE": "1",
}


@pytest.fixture(scope="module")
def stack(tiny_stack_model, tmp_path_factory, otlp, prometheus_port):
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{otlp.port}",
        "OTEL_BSP_SCHEDULE_DELAY": "200",
        "TANDEM_ROUTER_DISAGG_MIN_TOKENS": "1",
        **PLANNER_ENV,
        "TANDEM_PLANNER_PROMETHEUS_URL": f"http://127.0.0.1:{prometheus_port}",
    }
    tiers = ("--kv-host-gb", "0.01")  # the Workers dashboard's "KV tiers" row needs a host tier
    tiers += ("--speculative", "ngram")  # and its "Speculative decoding" row a worker that speculates
    with running_stack(
        tiny_stack_model,
        tmp_path_factory.mktemp("observed"),
        num_prefill=1,
        num_decode=1,
        env=env,
        planner=True,
        worker_args=("--num-blocks", "512", "--max-num-batched-tokens", "1024", *tiers),
    ) as s:
        yield s


@pytest.fixture(scope="module")
def traced_request(stack, tiny_stack_model, otlp):
    """One chat request sent inside a client-side trace (W3C traceparent), and the spans it produced."""
    trace_id, client_span = secrets.token_hex(16), secrets.token_hex(8)
    response = httpx.post(
        f"{stack.url}/v1/chat/completions",
        timeout=60,
        headers={"traceparent": f"00-{trace_id}-{client_span}-01"},
        json={
            "model": tiny_stack_model.name,
            "temperature": 0,
            "max_tokens": 8,
            "messages": [{"role": "user", "content": PROMPT}],
        },
    )
    assert response.status_code == 200, response.text
    # every span the tests below look at; server spans end after their streams, so they may come last
    expected = {
        ("gateway", "POST /v1/chat/completions"),
        ("gateway", "tokenize"),
        ("gateway", "route"),
        ("gateway", "detokenize"),
        ("router", "/tandem.v1.Router/Route"),
        ("prefill", "/tandem.v1.PrefillWorker/Prefill"),
        ("prefill", "prefill.queue"),
        ("prefill", "prefill.compute"),
        ("prefill", "/tandem.v1.PrefillWorker/PullKv"),
        ("decode", "/tandem.v1.DecodeWorker/Generate"),
        ("decode", "kv.transfer"),
        ("decode", "/tandem.v1.PrefillWorker/PullKv"),
        ("decode", "decode.queue"),
        ("decode", "decode.first_token"),
        ("decode", "decode.stream"),
    }
    expected = {(f"tandem-{service}", name) for service, name in expected}
    poll(lambda: otlp.trace(trace_id), lambda got: expected <= {(s.service, s.name) for s in got}, 30)
    time.sleep(0.5)  # anything else in flight (both sides of PullKv, the Complete call)
    return trace_id, client_span, otlp.trace(trace_id), response.json()


def test_one_request_is_one_trace_across_every_service(traced_request):
    trace_id, client_span, spans, _ = traced_request
    services = {s.service for s in spans}
    assert services == {f"tandem-{name}" for name in SERVICES}, services
    by_id = {s.span_id: s for s in spans}
    assert len(by_id) == len(spans), "span ids must be unique"
    roots = [s for s in spans if s.parent_id not in by_id]
    assert len(roots) == 1 and roots[0].service == "tandem-gateway", [(r.service, r.name) for r in roots]
    assert roots[0].parent_id == client_span  # continued from the client's traceparent
    for s in spans:
        assert s.start_ns <= s.end_ns, s

    def ancestors(span: Span) -> list[Span]:
        chain = []
        while span.parent_id in by_id:
            span = by_id[span.parent_id]
            chain.append(span)
        return chain

    def one(service: str, name: str) -> Span:
        found = [s for s in spans if s.service == f"tandem-{service}" and s.name == name]
        assert len(found) == 1, (service, name, [(s.service, s.name) for s in spans])
        return found[0]

    route = one("gateway", "route")
    router_span = one("router", "/tandem.v1.Router/Route")
    assert route in ancestors(router_span)  # router's server span under the gateway's route span
    prefill_rpc = one("prefill", "/tandem.v1.PrefillWorker/Prefill")
    decode_rpc = one("decode", "/tandem.v1.DecodeWorker/Generate")
    for rpc in (prefill_rpc, decode_rpc):
        assert roots[0] in ancestors(rpc)
    for name in ("prefill.queue", "prefill.compute"):
        assert one("prefill", name).parent_id == prefill_rpc.span_id
    transfer = one("decode", "kv.transfer")
    assert transfer.parent_id == decode_rpc.span_id
    if is_available():  # the decode engine READs the blocks itself (NIXL), then has the prefill worker free them
        assert decode_rpc in ancestors(one("prefill", "/tandem.v1.PrefillWorker/ReleaseKv"))
    else:  # the pull crosses processes
        assert transfer in ancestors(one("prefill", "/tandem.v1.PrefillWorker/PullKv"))
    for name in ("decode.queue", "decode.first_token", "decode.stream"):
        assert one("decode", name).parent_id == decode_rpc.span_id
    assert one("decode", "decode.first_token").end_ns <= one("decode", "decode.stream").start_ns
    assert one("gateway", "tokenize").parent_id == roots[0].span_id
    assert roots[0] in ancestors(one("gateway", "detokenize"))


def _log_records(stack) -> dict[str, list[dict]]:
    records = defaultdict(list)
    for path in sorted(stack.cfg.log_dir.glob("*.log")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                pytest.fail(f"{path.name}:{number} is not JSON: {line[:200]!r}")
            assert isinstance(record, dict), (path.name, number, line)
            assert {"ts", "level", "service", "msg"} <= record.keys(), (path.name, number, record)
            records[record["service"]].append(record)
    return records


def test_log_lines_are_json_and_carry_the_requests_trace_id(traced_request, stack):
    trace_id, _, spans, body = traced_request
    records = _log_records(stack)
    assert set(SERVICES) <= records.keys(), records.keys()
    span_ids = {s.span_id for s in spans}
    for service in SERVICES:
        mine = [r for r in records[service] if r.get("trace_id") == trace_id]
        assert mine, f"no {service} log line carries trace id {trace_id}"
        for r in mine:
            assert r["span_id"] in span_ids, (service, r)  # the span it was logged under was exported
            assert r.get("req_id", "").startswith(body["id"]), (service, r)  # and names the request
    content = body["choices"][0]["message"]["content"]
    text = json.dumps(records)
    assert "very very very" not in text  # the prompt never reaches info-level logs
    if len(content) > 12:
        assert content not in text


def test_every_service_serves_metrics_listed_in_the_file_sd_file(traced_request, stack):
    groups = json.loads(stack.targets_path.read_text())
    listed = {g["labels"]["instance_name"]: g["targets"][0] for g in groups}
    assert set(listed) == {"gateway", "router", "prefill-0", "decode-0", "planner"}
    prefixes = {
        "gateway": "tandem_gateway_",
        "router": "tandem_router_",
        "prefill-0": "tandem_worker_",
        "decode-0": "tandem_worker_",
        "planner": "tandem_planner_",
    }
    for name, target in listed.items():
        assert stack.metrics_urls[name] == f"http://{target}/metrics"
        text = httpx.get(f"http://{target}/metrics", timeout=5).text
        assert prefixes[name] in text, name
    decode = httpx.get(stack.metrics_urls["decode-0"], timeout=5).text
    assert re.search(
        r'tandem_worker_kv_transfer_bytes_total\{direction="import",role="decode",'
        r'transport="[a-z]+",worker_id="decode-0"\} [1-9]',
        decode,
    ), decode


# --- a real Prometheus against the stack: every dashboard expression has data ------------------------------------


def _dashboard_exprs() -> list[tuple[str, str, str]]:
    """(dashboard, panel title, expr) for every target of every panel, rows included."""
    found = []

    def walk(panels, dashboard):
        for panel in panels:
            walk(panel.get("panels", []), dashboard)
            for target in panel.get("targets", []):
                if target.get("expr"):
                    found.append((dashboard, panel.get("title", "?"), target["expr"]))

    for path in sorted(DASHBOARDS.glob("*.json")):
        walk(json.loads(path.read_text()).get("panels", []), path.stem)
    return found


def _concrete(expr: str) -> str:
    """Grafana's variables replaced as the dashboards would see them over the last minutes."""
    expr = expr.replace("$__rate_interval", "1m").replace("$__interval", "15s").replace("$__range", "5m")
    expr = expr.replace("${__rate_interval}", "1m")
    return re.sub(r"\$\{?\w+(:\w+)?\}?", ".*", expr)


@pytest.fixture(scope="module")
def prometheus(stack, tmp_path_factory, prometheus_port):
    binary = shutil.which("prometheus")
    if binary is None:
        if os.environ.get("TANDEM_REQUIRE_PROMETHEUS"):
            pytest.fail("TANDEM_REQUIRE_PROMETHEUS is set (.ci/run) but no prometheus binary is installed")
        pytest.skip("the prometheus binary is not installed (.ci/run installs Debian's package)")
    work = tmp_path_factory.mktemp("prometheus")
    # the config `make up` runs, next to the targets file as there; scraping every second to keep this short
    local = (REPO / "observability" / "prometheus" / "prometheus-local.yml").read_text()
    assert "scrape_interval: 5s" in local and "refresh_interval: 30s" in local and "scrape_timeout: 4s" in local
    config = stack.targets_path.parent / "prometheus.yml"
    config.write_text(
        local.replace("scrape_interval: 5s", "scrape_interval: 1s")
        .replace("scrape_timeout: 4s", "scrape_timeout: 1s")
        .replace("refresh_interval: 30s", "refresh_interval: 1s")
    )
    port = prometheus_port  # the planner was told it up front
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={work / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=open(work / "prometheus.log", "w"),
    )
    url = f"http://127.0.0.1:{port}"
    try:

        def up_targets():
            try:  # until it listens and has loaded its storage (a 503 with a text body before that)
                return _query(url, "sum(up)")
            except (httpx.HTTPError, ValueError):
                return []

        num_targets = len(json.loads(stack.targets_path.read_text()))
        poll(up_targets, lambda r: bool(r) and float(r[0]["value"][1]) == num_targets, 30)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _query(url: str, expr: str) -> list:
    reply = httpx.get(f"{url}/api/v1/query", params={"query": expr}, timeout=10).json()
    assert reply["status"] == "success", (expr, reply)
    return reply["data"]["result"]


def test_every_dashboard_expression_returns_live_data(stack, tiny_stack_model, prometheus):
    exprs = _dashboard_exprs()
    assert len({d for d, _, _ in exprs}) >= 4 and len(exprs) >= 20, exprs  # Overview, Workers, Router, Planner
    with httpx.Client(timeout=60) as http:  # traffic across several scrapes: streamed, whole, and refused
        for i in range(6):
            body = {
                "model": tiny_stack_model.name,
                "max_tokens": 8,
                "temperature": 0,
                "messages": [{"role": "user", "content": f"{PROMPT} {i}"}],
            }
            if i % 2:
                with http.stream("POST", f"{stack.url}/v1/chat/completions", json={**body, "stream": True}) as r:
                    assert r.status_code == 200
                    r.read()
            else:
                assert http.post(f"{stack.url}/v1/chat/completions", json=body).status_code == 200
            assert http.post(f"{stack.url}/v1/chat/completions", json={**body, "model": "nope"}).status_code == 404
            time.sleep(0.5)
    time.sleep(3)  # a few scrapes after the last request
    # the planner reads the gateway's histograms from this Prometheus, then is scraped itself: a few ticks later
    observed = "tandem_planner_observed_latency_seconds"  # NaN until the planner has seen a latency
    poll(lambda: _query(prometheus, observed), lambda r: len(r) == 2 and "NaN" not in {s["value"][1] for s in r}, 30)
    empty = []
    for dashboard, title, expr in exprs:
        result = _query(prometheus, _concrete(expr))
        values = [float(sample["value"][1]) for sample in result] if result and "value" in result[0] else []
        if not any(v == v for v in values):  # no series, or only NaN (a quantile of nothing)
            empty.append(f"{dashboard} / {title}: {expr}")
    assert not empty, "panels without live data:\n" + "\n".join(empty)
