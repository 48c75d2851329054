"""The SSE event stream's bookkeeping: however it ends, the request is counted once, with the right status."""

from services.gateway.admission import Admission
from services.gateway.choices import ChoiceDelta
from services.gateway.metrics import GatewayMetrics
from services.gateway.responses import CompletionFormat
from services.gateway.serving import _events, _UsageIn


def events_of(admission: Admission, metrics: GatewayMetrics):
    async def rest():
        yield ChoiceDelta(0, "b", 1)
        yield ChoiceDelta(0, "c", 1, finish_reason="length")

    timer = metrics.start("/v1/completions", "m")
    fmt = CompletionFormat("cmpl-1", "m", None, wants_logprobs=False)
    return timer, _events(ChoiceDelta(0, "a", 1), rest(), fmt, timer, admission.acquire(), _UsageIn(False, False, 3))


def count(metrics: GatewayMetrics, status: str) -> float:
    labels = {"route": "/v1/completions", "model": "m", "status": status}
    return metrics.registry.get_sample_value("tandem_gateway_requests_total", labels) or 0.0


async def test_a_stream_read_to_the_end_is_a_200():
    admission, metrics = Admission(max_inflight=1), GatewayMetrics()
    timer, events = events_of(admission, metrics)
    payloads = [p async for p in events]
    assert payloads[-1] == b"[DONE]" and len(payloads) == 4
    assert (count(metrics, "200"), count(metrics, "499"), admission.num_inflight) == (1, 0, 0)


async def test_a_stream_closed_while_the_client_was_being_written_to_is_a_499():
    admission, metrics = Admission(max_inflight=1), GatewayMetrics()
    timer, events = events_of(admission, metrics)
    assert b'"text": "a"' in await anext(events)
    await events.aclose()  # what the response does when the client left during a send
    assert (count(metrics, "200"), count(metrics, "499"), admission.num_inflight) == (0, 1, 0)
    assert timer.is_finished
