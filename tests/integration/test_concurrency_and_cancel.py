"""Many streams at once, and clients that leave, against a live disaggregated stack (tiny model with no EOS,
so every request runs to max_tokens): concurrent streams all finish whole and match their sequential
answers; a closed stream or an abandoned request stops its work and frees every block on every worker."""

import asyncio
import json
import random

import httpx
import openai
import pytest

from tests.integration.conftest import ENDLESS_CONTEXT, all_worker_stats, running_stack
from tests.integration.helpers import busy_counts, sse_json, wait_all_idle, wait_for

NUM_CONCURRENT = 32
MAX_TOKENS = 24
LONG_MAX_TOKENS = ENDLESS_CONTEXT - 100  # far more than a test waits for: it must be cut short
IDLE_TIMEOUT_S = 5.0


@pytest.fixture(scope="module")
def stack(endless_model, tmp_path_factory):
    with running_stack(
        endless_model,
        tmp_path_factory.mktemp("concurrency"),
        num_prefill=1,
        num_decode=1,
        env={"TANDEM_ROUTER_DISAGG_MIN_TOKENS": "1"},
    ) as running:
        yield running


@pytest.fixture
def idle(stack):
    """Each test starts and ends with every worker empty."""
    wait_all_idle(stack, num_workers=2, timeout_s=IDLE_TIMEOUT_S)
    yield stack
    wait_all_idle(stack, num_workers=2, timeout_s=IDLE_TIMEOUT_S)


def _prompt(i: int, length: int = 0) -> list[int]:
    rng = random.Random(i)
    return [rng.randrange(3, 512) for _ in range(length or 5 + i % 40)]


def _generated(stack) -> int:
    return sum(s.num_generated_tokens for s in all_worker_stats(stack).values())


async def _stream_one(http: httpx.AsyncClient, url: str, model: str, prompt: list[int]) -> list:
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "logprobs": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with http.stream("POST", f"{url}/v1/completions", json=body) as response:
        assert response.status_code == 200, await response.aread()
        return [event async for event in _aiter_sse(response)]


async def _aiter_sse(response: httpx.Response):
    async for line in response.aiter_lines():
        if line.startswith("data:"):
            data = line[len("data:") :].strip()
            yield data if data == "[DONE]" else json.loads(data)


def test_concurrent_streams_all_complete_whole(idle, endless_model):
    stack, model = idle, endless_model.name
    prompts = [_prompt(i) for i in range(NUM_CONCURRENT)]

    async def run_all() -> list[list]:
        limits = httpx.Limits(max_connections=NUM_CONCURRENT)
        async with httpx.AsyncClient(timeout=120, limits=limits) as http:
            return await asyncio.gather(*(_stream_one(http, stack.url, model, p) for p in prompts))

    streams = asyncio.run(run_all())
    with httpx.Client(timeout=60) as http:
        sequential = [
            http.post(
                f"{stack.url}/v1/completions",
                json={"model": model, "prompt": p, "max_tokens": MAX_TOKENS, "temperature": 0},
            ).json()
            for p in prompts
        ]

    for i, events in enumerate(streams):
        *chunks, usage, done = events
        assert done == "[DONE]", i
        assert 0 <= usage["usage"].pop("prompt_tokens_details")["cached_tokens"] <= len(prompts[i]), i
        assert usage["choices"] == [] and usage["usage"] == {
            "prompt_tokens": len(prompts[i]),
            "completion_tokens": MAX_TOKENS,
            "total_tokens": len(prompts[i]) + MAX_TOKENS,
        }, i
        choices = [c["choices"][0] for c in chunks]
        assert sum(len(c["logprobs"]["tokens"]) for c in choices) == MAX_TOKENS, i
        assert [c["finish_reason"] for c in choices] == [None] * (len(choices) - 1) + ["length"], i
        assert len({c["id"] for c in chunks}) == 1, i
        # batching with 31 others changes nothing under greedy decoding
        assert "".join(c["text"] for c in choices) == sequential[i]["choices"][0]["text"], i
        assert sequential[i]["choices"][0]["finish_reason"] == "length", i


def _wait_decoding(stack, n: int) -> None:
    wait_for(
        lambda: busy_counts(stack)["decode-0"]["num_running"],
        lambda running: running == n,
        IDLE_TIMEOUT_S,
        f"{n} requests running on the decode worker",
    )


def _assert_cut_short(stack, generated_before: int, requested: int) -> None:
    """All workers empty soon after the client left, well before the requests could have finished."""
    wait_all_idle(stack, num_workers=2, timeout_s=IDLE_TIMEOUT_S)
    generated = _generated(stack) - generated_before
    assert 0 < generated < requested, f"{generated} tokens generated of {requested} requested"


def test_closed_httpx_stream_frees_every_worker(idle, endless_model):
    stack = idle
    before = _generated(stack)
    body = {
        "model": endless_model.name,
        "prompt": _prompt(1000, 40),
        "max_tokens": LONG_MAX_TOKENS,
        "temperature": 0,
        "stream": True,
    }
    with httpx.Client(timeout=30) as http, http.stream("POST", f"{stack.url}/v1/completions", json=body) as response:
        assert response.status_code == 200
        events = sse_json(response)
        first = [next(events) for _ in range(3)]
        assert all(e["choices"][0]["finish_reason"] is None for e in first)
        _wait_decoding(stack, 1)  # still generating when the client leaves
    _assert_cut_short(stack, before, LONG_MAX_TOKENS)


@pytest.mark.parametrize("n", [1, 3])
def test_closed_openai_stream_frees_every_worker(idle, endless_model, n):
    stack = idle
    before = _generated(stack)
    with openai.OpenAI(base_url=f"{stack.url}/v1", api_key="unused", max_retries=0, timeout=30) as client:
        stream = client.chat.completions.create(
            model=endless_model.name,
            messages=[{"role": "user", "content": "count forever"}],
            max_tokens=LONG_MAX_TOKENS,
            temperature=0,
            n=n,
            stream=True,
        )
        seen = set()
        for chunk in stream:
            seen.update(c.index for c in chunk.choices)
            if len(seen) == n:
                break
        _wait_decoding(stack, n)  # the first tokens come from the prefill worker: the decode side may lag
        stream.close()
    _assert_cut_short(stack, before, n * LONG_MAX_TOKENS)


@pytest.mark.parametrize("wait_s", [0.05, 0.2, 0.5, 1.0])
def test_abandoned_request_frees_every_worker(idle, endless_model, wait_s):
    """A non-streaming client that gives up at various points: during prefill, the KV handoff, or decoding."""
    stack = idle
    before = _generated(stack)
    body = {
        "model": endless_model.name,
        "prompt": _prompt(2000 + int(wait_s * 100), 1500),
        "max_tokens": 2000,
        "temperature": 0,
    }
    with httpx.Client(timeout=httpx.Timeout(10, read=wait_s)) as http, pytest.raises(httpx.ReadTimeout):
        http.post(f"{stack.url}/v1/completions", json=body)
    wait_all_idle(stack, num_workers=2, timeout_s=IDLE_TIMEOUT_S)
    assert _generated(stack) - before < 2000


def test_stack_serves_after_the_cancellations(idle, endless_model):
    with httpx.Client(timeout=30) as http:
        response = http.post(
            f"{idle.url}/v1/completions",
            json={"model": endless_model.name, "prompt": "hello", "max_tokens": MAX_TOKENS, "temperature": 0},
        )
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] == MAX_TOKENS
