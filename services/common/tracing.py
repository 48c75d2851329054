"""OpenTelemetry tracing for every service, configured by the standard OTEL_* variables.

Off unless `OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set (and
`OTEL_SDK_DISABLED` is not true): then spans go over OTLP (`OTEL_EXPORTER_OTLP_PROTOCOL` `grpc`, the
default, or `http/protobuf`) in batches, and the gRPC client and server instrumentations carry the W3C
trace context in call metadata, so one request is one trace across gateway, router and workers.
Off, the OpenTelemetry API hands out non-recording spans: `span()` below costs next to nothing.
"""

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager

from opentelemetry import trace

log = logging.getLogger(__name__)
tracer = trace.get_tracer("tandem")
_enabled = False


def tracing_requested() -> bool:
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if os.environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() == "none":
        return False
    return bool(os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"))


def setup_tracing(service: str) -> bool:
    """Install the SDK's tracer provider and the gRPC instrumentations when OTEL_* asks for it.

    Returns whether tracing is on. The service name is `OTEL_SERVICE_NAME` or `tandem-<service>`.
    """
    global _enabled
    if _enabled or not tracing_requested():
        return _enabled
    from opentelemetry.instrumentation.grpc import GrpcAioInstrumentorClient, GrpcAioInstrumentorServer
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    name = os.environ.get("OTEL_SERVICE_NAME") or f"tandem-{service}"
    provider = TracerProvider(resource=Resource.create({"service.name": name, "tandem.service": service}))
    provider.add_span_processor(BatchSpanProcessor(_exporter()))
    trace.set_tracer_provider(provider)
    GrpcAioInstrumentorServer().instrument()
    GrpcAioInstrumentorClient().instrument()
    _enabled = True
    log.info("tracing on: OTLP export as %s", name)
    return True


def shutdown_tracing() -> None:
    """Flush what is buffered (at service exit)."""
    provider = trace.get_tracer_provider()
    if _enabled and hasattr(provider, "shutdown"):
        provider.shutdown()


def _exporter():
    protocol = (
        (
            os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
            or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
            or "grpc"
        )
        .strip()
        .lower()
    )
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    elif protocol == "http/protobuf":
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError as exc:
            raise RuntimeError(
                "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf needs `pip install opentelemetry-exporter-otlp-proto-http`"
            ) from exc
    else:
        raise RuntimeError(f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol!r}: tandem exports grpc or http/protobuf")
    return OTLPSpanExporter()  # endpoint, headers, timeout, compression: from the OTEL_* variables


@contextmanager
def span(name: str, **attributes) -> Iterator[trace.Span]:
    """A child span of the current one (a no-op span when tracing is off)."""
    with tracer.start_as_current_span(name, attributes=attributes or None) as current:
        yield current


def trace_carrier() -> dict[str, str]:
    """The current trace context as W3C headers, for a message that carries it by hand (a call on a long-lived
    stream, where the instrumentations' per-call metadata cannot); empty when tracing is off."""
    if not _enabled:
        return {}
    from opentelemetry import propagate

    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier


@contextmanager
def continued_span(name: str, carrier, **attributes) -> Iterator[trace.Span | None]:
    """A server span continuing the trace that `carrier` (trace_carrier's headers) names; nothing when it is empty."""
    if not carrier or not _enabled:
        yield None
        return
    from opentelemetry import propagate

    parent = propagate.extract(dict(carrier))
    kind = trace.SpanKind.SERVER
    with tracer.start_as_current_span(name, context=parent, kind=kind, attributes=attributes or None) as current:
        yield current


def timed_span(name: str, start_ns: int, end_ns: int, **attributes) -> None:
    """A finished child span for an interval measured elsewhere (e.g. time queued in the engine)."""
    if not _enabled:
        return
    s = tracer.start_span(name, start_time=start_ns, attributes=attributes or None)
    s.end(end_time=end_ns)
