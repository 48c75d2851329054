"""JSON log records (service, request id, trace and span ids of the current span, extra fields) and the
OTEL_* switch that turns tracing on and off."""

import io
import json
import logging

import pytest
from opentelemetry.sdk.trace import TracerProvider

from services.common import tracing
from services.common.logs import JsonFormatter, request_id


def _record(formatter: logging.Formatter, msg: str, *args, **extra) -> dict:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter)
    logger = logging.getLogger("tandem-test-logs")
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    logger.info(msg, *args, extra=extra or None)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1
    return json.loads(lines[0])


def test_a_record_is_one_json_object_with_the_service_and_no_ids_outside_a_request():
    rec = _record(JsonFormatter("router"), "routed to %s", "decode-0", num_tokens=42)
    assert rec["service"] == "router" and rec["level"] == "info" and rec["msg"] == "routed to decode-0"
    assert rec["logger"] == "tandem-test-logs" and rec["num_tokens"] == 42
    assert rec["ts"].endswith("Z") and "T" in rec["ts"]
    assert "req_id" not in rec and "trace_id" not in rec and "span_id" not in rec


def test_a_record_carries_the_request_id_and_the_current_spans_ids():
    tracer = TracerProvider().get_tracer("test")  # a recording tracer, without touching the global provider
    token = request_id.set("chatcmpl-abc-0")
    try:
        with tracer.start_as_current_span("work") as span:
            rec = _record(JsonFormatter("decode"), "Generate OK")
            ctx = span.get_span_context()
    finally:
        request_id.reset(token)
    assert rec["req_id"] == "chatcmpl-abc-0"
    assert rec["trace_id"] == format(ctx.trace_id, "032x") and rec["span_id"] == format(ctx.span_id, "016x")


def test_an_explicit_req_id_wins_and_odd_values_become_strings():
    rec = _record(JsonFormatter("gateway"), "done", req_id="cmpl-1", path=object.__new__(object))
    assert rec["req_id"] == "cmpl-1" and rec["path"].startswith("<object object")


@pytest.mark.parametrize(
    "env, on",
    [
        ({}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4317/v1/traces"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317", "OTEL_SDK_DISABLED": "true"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317", "OTEL_TRACES_EXPORTER": "none"}, False),
    ],
)
def test_tracing_is_on_only_when_otel_says_where_to_send(monkeypatch, env, on):
    for name in (
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_SDK_DISABLED",
        "OTEL_TRACES_EXPORTER",
    ):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert tracing.tracing_requested() is on


def test_with_tracing_off_spans_are_free_no_ops(monkeypatch):
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    assert tracing.setup_tracing("gateway") is False
    with tracing.span("tokenize") as span:
        assert not span.is_recording()
    tracing.timed_span("decode.queue", 1, 2)  # nothing to record, nothing raised


def test_an_unknown_otlp_protocol_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "carrier-pigeon")
    with pytest.raises(RuntimeError, match="grpc or http/protobuf"):
        tracing._exporter()


def test_a_trace_crosses_a_stream_message_by_hand_and_not_at_all_when_off(monkeypatch):
    """RouteStream's messages carry the W3C context the per-call instrumentation cannot (services/router/route_stream.py)."""
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    monkeypatch.setattr(tracing, "_enabled", False)
    assert tracing.trace_carrier() == {}
    with tracing.continued_span(
        "/tandem.v1.Router/Route", {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}
    ) as s:
        assert s is None  # off: nothing made, whatever the message says
    exported = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exported))
    monkeypatch.setattr(tracing, "_enabled", True)
    monkeypatch.setattr(tracing, "tracer", provider.get_tracer("test"))
    with tracing.span("route") as route:
        carrier = tracing.trace_carrier()
    with tracing.continued_span("/tandem.v1.Router/Route", carrier) as server:
        assert server.is_recording()
    with tracing.continued_span("/tandem.v1.Router/Route", {}) as none:
        assert none is None  # a message without a context (a gateway with tracing off) makes no orphan span
    spans = {s.name: s for s in exported.get_finished_spans()}
    got = spans["/tandem.v1.Router/Route"]
    assert got.context.trace_id == route.get_span_context().trace_id
    assert got.parent.span_id == route.get_span_context().span_id
    assert got.kind.name == "SERVER"
