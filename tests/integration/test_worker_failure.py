"""A decode worker killed (SIGKILL) mid-stream, live: the client's stream goes on on the surviving worker (token-level
migration) with every token it asked for, the router hears of the failure at once, the gateway stays healthy, new
requests succeed, and losing the last worker is a clean error, not a hang."""

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx
import openai
import pytest

from tests.integration.conftest import running_stack, workers
from tests.integration.helpers import assert_error, busy_counts, poll, sse_json, wait_for

LONG_MAX_TOKENS = 1500  # the stream is still going when its worker dies
MAX_GAP_S = 5.0  # from SIGKILL to the client's next token (or its error)
RECOVERY_S = 15.0  # from SIGKILL to the router dropping the dead worker: the lease TTL (10 s), a probe and slack


@pytest.fixture(scope="module")
def stack(endless_model, tmp_path_factory):
    with running_stack(endless_model, tmp_path_factory.mktemp("failure"), num_prefill=0, num_decode=2) as running:
        yield running


def _kill_serving_worker(stack, exclude: str = "") -> str:
    """SIGKILL the decode worker running the one live request; its id."""

    def running_on(counts: dict) -> list[str]:
        return [w for w, c in counts.items() if c["num_running"] == 1 and w != exclude]

    counts = wait_for(lambda: busy_counts(stack), lambda c: len(running_on(c)) == 1, 5.0, "one worker serving")
    (victim,) = running_on(counts)
    child = next(c for c in stack.children if c.name == victim)
    child.proc.kill()
    child.proc.wait(timeout=5)
    return victim


@dataclass(frozen=True)
class Kill:
    victim: str
    survivor: str
    killed_at: float  # time.monotonic()
    events_before: list  # read before the kill
    events_after: list  # read after it, until the stream ended
    transport_error: str  # "" when the stream ended as HTTP/SSE should
    gap_s: float  # the longest wait for an event from the kill on (the migration's stall)
    quarantine_left_s: float  # the victim's, as the router listed it once the stream went on


def _first_quarantine(stack, worker_id: str, timeout_s: float) -> float:
    """The quarantine the router first lists for `worker_id` within `timeout_s`; 0.0 if none."""
    return poll(
        lambda: {w.worker.worker_id: w.quarantine_left_s for w in workers(stack)}.get(worker_id, 0.0),
        lambda left: left > 0,
        timeout_s,
        interval_s=0.05,
    )


@pytest.fixture(scope="module")
def kill(stack, endless_model) -> Kill:
    body = {
        "model": endless_model.name,
        "prompt": "the long story goes",
        "max_tokens": LONG_MAX_TOKENS,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    # NOTE: the read timeout is above MAX_GAP_S: a hang shows as a slow end, not as a timeout here
    with (
        httpx.Client(timeout=httpx.Timeout(3 * MAX_GAP_S)) as http,
        http.stream("POST", f"{stack.url}/v1/completions", json=body) as response,
        ThreadPoolExecutor(1) as watcher,
    ):
        assert response.status_code == 200, response.read()
        events = sse_json(response)
        before = [next(events) for _ in range(3)]
        victim = _kill_serving_worker(stack)
        killed_at = time.monotonic()
        # the router is watched beside the stream: events already in flight when the worker died arrive first
        quarantine = watcher.submit(_first_quarantine, stack, victim, MAX_GAP_S)
        after, transport_error, gap_s, last = [], "", 0.0, killed_at
        try:
            for event in events:
                now = time.monotonic()
                gap_s, last = max(gap_s, now - last), now
                after.append(event)
        except httpx.HTTPError as exc:
            transport_error = repr(exc)
    (survivor,) = {"decode-0", "decode-1"} - {victim}
    return Kill(victim, survivor, killed_at, before, after, transport_error, gap_s, quarantine.result())


def test_the_stream_goes_on_on_the_survivor_to_its_last_token(kill):
    assert kill.transport_error == ""
    assert kill.gap_s < MAX_GAP_S
    *chunks, usage, done = kill.events_after
    assert done == "[DONE]" and not [e for e in chunks if "error" in e]
    assert all(e["choices"][0]["finish_reason"] is None for e in kill.events_before + chunks[:-1])
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert usage["usage"]["completion_tokens"] == LONG_MAX_TOKENS  # every token asked for, none twice


def test_the_router_heard_of_it_at_once(kill):
    assert 0 < kill.quarantine_left_s <= 5.0  # quarantined, well before its lease could run out


def test_gateway_stays_healthy(stack, kill):
    assert httpx.get(f"{stack.url}/health", timeout=5).json() == {"status": "ok"}
    ready = httpx.get(f"{stack.url}/ready", timeout=5)
    assert ready.status_code == 200, ready.text


def test_new_requests_succeed_on_the_survivor(stack, kill, endless_model):
    body = {"model": endless_model.name, "prompt": "after the crash", "max_tokens": 8, "temperature": 0}
    with httpx.Client(timeout=10) as http:
        for _ in range(6):
            response = http.post(f"{stack.url}/v1/completions", json=body)
            assert response.status_code == 200, response.text
            assert response.json()["usage"]["completion_tokens"] == 8
            assert response.json()["choices"][0]["text"]


def test_router_drops_the_dead_worker(stack, kill):
    remaining = wait_for(
        lambda: sorted(w.worker.worker_id for w in workers(stack)),
        lambda ids: ids == [kill.survivor],
        RECOVERY_S - (time.monotonic() - kill.killed_at),
        "the router forgetting the dead worker",
    )
    assert remaining == [kill.survivor]


def test_losing_the_last_worker_raises_in_openai_client_and_then_503(stack, kill, endless_model):
    wait_for(
        lambda: sorted(w.worker.worker_id for w in workers(stack)),
        lambda ids: ids == [kill.survivor],
        RECOVERY_S,
        "the router forgetting the first dead worker",
    )
    with openai.OpenAI(base_url=f"{stack.url}/v1", api_key="unused", max_retries=0, timeout=3 * MAX_GAP_S) as client:
        stream = client.chat.completions.create(
            model=endless_model.name,
            temperature=0,
            stream=True,
            max_tokens=LONG_MAX_TOKENS,
            messages=[{"role": "user", "content": "go on"}],
        )
        next(iter(stream))
        _kill_serving_worker(stack)
        started = time.monotonic()
        with pytest.raises(openai.APIError) as raised:  # nowhere left to migrate to
            for _ in stream:
                pass
        assert time.monotonic() - started < MAX_GAP_S
    assert not isinstance(raised.value, openai.APITimeoutError | openai.APIConnectionError), raised.value
    assert raised.value.body["type"] == "service_unavailable_error"

    response = httpx.post(
        f"{stack.url}/v1/completions",
        timeout=10,
        json={"model": endless_model.name, "prompt": "anyone?", "max_tokens": 4},
    )
    err = response.json().get("error", {})
    # the dead worker is still leased (worker_failed) or already dropped (no_worker_available): 503 either way
    assert_error(response, 503, type="service_unavailable_error", code=err.get("code"), retry_after="1")
    assert err["code"] in ("worker_failed", "no_worker_available")
    assert httpx.get(f"{stack.url}/health", timeout=5).status_code == 200
