"""The official `openai` client against a live disaggregated stack serving the real SmolLM2: answers are
right, greedy output is token for token the engine's own, and usage counts what was templated and generated."""

import asyncio
import json
import math
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest
from transformers import AutoTokenizer

from engines.base import EngineRequest, FinishReason, SamplingParams
from engines.transfer.nixl_link import is_available
from tandem.launcher import served_name
from tests.integration.conftest import all_worker_stats, running_stack
from tests.unit.engines.helpers import collect, started

pytestmark = pytest.mark.slow


@dataclass(frozen=True)
class Case:
    endpoint: str  # "chat" | "completion"
    prompt: str
    max_tokens: int
    finish_reason: str  # what greedy decoding of this prompt ends with
    must_contain: str = ""


CASES = {
    "france": Case("chat", "What is the capital of France?", 24, "stop", "Paris"),
    "story": Case("chat", "Tell me a long story about a dragon who learns to fly.", 24, "length"),
    "completion": Case("completion", "The capital of France is", 16, "length", "Paris"),
    # 259 prompt tokens: 17 KV blocks of 720 KiB, so the handoff streams four 4 MiB chunks
    "long": Case(
        "chat",
        "Read this and answer the question at the end. "
        + " ".join(f"Room {i} of the museum holds paintings from the year {1500 + 7 * i}." for i in range(12))
        + " Which room holds paintings from the year 1556?",
        24,
        "stop",
    ),
}
_FINISH = {FinishReason.STOP: "stop", FinishReason.LENGTH: "length"}


@dataclass(frozen=True)
class Expected:
    prompt_ids: list[int]
    token_ids: list[int]
    finish_reason: str


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir):
    return AutoTokenizer.from_pretrained(str(smollm2_dir))


def prompt_ids(tokenizer, case: Case) -> list[int]:
    """What the gateway must have fed the model: the chat template with the assistant turn opened, or the text."""
    if case.endpoint == "chat":
        encoded = tokenizer.apply_chat_template(
            _messages(case), add_generation_prompt=True, tokenize=True, return_dict=True
        )
        return list(encoded["input_ids"])
    return tokenizer(case.prompt).input_ids


@pytest.fixture(scope="module")
def expected(smollm2_dir, tokenizer) -> dict[str, Expected]:
    """Greedy output of an in-process NativeEngine on the same checkpoint, dtype and prompt token ids."""

    async def run() -> dict[str, Expected]:
        engine = await started(smollm2_dir, num_blocks=64)
        try:
            out = {}
            for name, case in CASES.items():
                ids = prompt_ids(tokenizer, case)
                params = SamplingParams(max_tokens=case.max_tokens, temperature=0.0)  # EOS stops it, as served
                tokens, last = await collect(engine, EngineRequest(f"ref-{name}", tuple(ids), params))
                out[name] = Expected(ids, tokens, _FINISH[last.finish_reason])
            return out
        finally:
            await engine.shutdown()

    return asyncio.run(run())


@pytest.fixture(scope="module")
def stack(smollm2_dir, expected, tmp_path_factory):
    # NOTE: `expected` first, so the reference engine never competes with the stack for the CPU
    with running_stack(
        smollm2_dir,
        tmp_path_factory.mktemp("openai"),
        num_prefill=1,
        num_decode=1,
        env={"TANDEM_ROUTER_DISAGG_MIN_TOKENS": "1"},
    ) as running:
        yield running


@pytest.fixture(scope="module")
def client(stack):
    with openai.OpenAI(base_url=f"{stack.url}/v1", api_key="unused", max_retries=0, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def model_name(smollm2_dir) -> str:
    return served_name(str(smollm2_dir))  # what `tandem up` serves it as


def _messages(case: Case) -> list[dict]:
    return [{"role": "user", "content": case.prompt}]


def _create(client: openai.OpenAI, model: str, case: Case, **kw):
    if case.endpoint == "chat":
        return client.chat.completions.create(
            model=model, messages=_messages(case), temperature=0, max_tokens=case.max_tokens, **kw
        )
    return client.completions.create(model=model, prompt=case.prompt, temperature=0, max_tokens=case.max_tokens, **kw)


def _text(choice, case: Case) -> str:
    return choice.message.content if case.endpoint == "chat" else choice.text


def _usage(expect: Expected) -> dict:
    n, m = len(expect.prompt_ids), len(expect.token_ids)
    return {"prompt_tokens": n, "completion_tokens": m, "total_tokens": n + m}


def _counts(usage) -> dict:
    """The token counts, without prompt_tokens_details (what a prefix cache held depends on earlier requests)."""
    counts = usage.model_dump(exclude_none=True)
    assert 0 <= counts.pop("prompt_tokens_details")["cached_tokens"] <= counts["prompt_tokens"]
    return counts


def test_reference_cases_cover_stop_and_length(expected):
    # the cases below mean something only if the engine itself ends them as declared
    for name, case in CASES.items():
        got = expected[name]
        assert got.finish_reason == case.finish_reason, name
        if case.finish_reason == "length":
            assert len(got.token_ids) == case.max_tokens, name
        else:
            assert len(got.token_ids) < case.max_tokens, name


@pytest.mark.parametrize("name", sorted(CASES))
def test_whole_response_is_the_engines_greedy_output(client, model_name, tokenizer, expected, name):
    case, expect = CASES[name], expected[name]
    response = _create(client, model_name, case)
    (choice,) = response.choices
    text = _text(choice, case)
    assert text == tokenizer.decode(expect.token_ids, skip_special_tokens=True)
    assert case.must_contain in text
    assert choice.finish_reason == expect.finish_reason == case.finish_reason
    assert _counts(response.usage) == _usage(expect)
    assert response.model == model_name
    assert response.object == ("chat.completion" if case.endpoint == "chat" else "text_completion")


@pytest.mark.parametrize("name", ["france", "story"])
def test_chat_logprobs_name_the_engines_tokens(client, model_name, tokenizer, expected, name):
    case, expect = CASES[name], expected[name]
    response = _create(client, model_name, case, logprobs=True, top_logprobs=2)
    content = response.choices[0].logprobs.content
    assert [bytes(c.bytes) for c in content] == [tokenizer.decode([t]).encode() for t in expect.token_ids]
    for entry in content:
        assert len(entry.top_logprobs) == 2
        # greedy: the chosen token is the most likely one
        assert entry.top_logprobs[0].bytes == entry.bytes
        assert math.isclose(entry.top_logprobs[0].logprob, entry.logprob, rel_tol=1e-6)
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob
        assert entry.logprob <= 0.0


@pytest.mark.parametrize("name", sorted(CASES))
def test_stream_with_usage_equals_whole_response(client, model_name, expected, name):
    case, expect = CASES[name], expected[name]
    whole = _create(client, model_name, case)
    chunks = list(_create(client, model_name, case, stream=True, stream_options={"include_usage": True}))

    *deltas, usage_chunk = chunks
    assert usage_chunk.choices == []
    assert _counts(usage_chunk.usage) == _counts(whole.usage) == _usage(expect)
    if case.endpoint == "chat":  # the same templated prompt again: its full blocks come from the prefix cache
        assert 0 < usage_chunk.usage.prompt_tokens_details.cached_tokens < len(expect.prompt_ids)
    assert all(c.usage is None for c in deltas)
    assert len({c.id for c in chunks}) == 1
    assert all(len(c.choices) == 1 and c.choices[0].index == 0 for c in deltas)
    finishes = [c.choices[0].finish_reason for c in deltas]
    assert finishes[-1] == whole.choices[0].finish_reason and all(f is None for f in finishes[:-1])
    if case.endpoint == "chat":
        assert deltas[0].choices[0].delta.role == "assistant"
        text = "".join(c.choices[0].delta.content or "" for c in deltas)
    else:
        text = "".join(c.choices[0].text for c in deltas)
    assert text == _text(whole.choices[0], case)


def test_stream_without_include_usage_has_no_usage(client, model_name, expected):
    case = CASES["france"]
    chunks = list(_create(client, model_name, case, stream=True))
    assert chunks and all(c.usage is None and len(c.choices) == 1 for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "stop"


async def test_async_client_streams_the_same_answer(stack, model_name, tokenizer, expected):
    case, expect = CASES["france"], expected["france"]
    async with openai.AsyncOpenAI(base_url=f"{stack.url}/v1", api_key="unused", max_retries=0, timeout=120) as aclient:
        stream = await aclient.chat.completions.create(
            model=model_name,
            messages=_messages(case),
            temperature=0,
            max_tokens=case.max_tokens,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [c async for c in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == tokenizer.decode(expect.token_ids, skip_special_tokens=True)
    assert _counts(chunks[-1].usage) == _usage(expect)


def test_models_lists_the_served_model(client, model_name):
    assert [m.id for m in client.models.list().data] == [model_name]
    assert client.models.retrieve(model_name).id == model_name


def test_prompt_is_prefilled_on_the_prefill_worker(stack, client, model_name, smollm2_dir, tokenizer):
    """One request moves its prompt's KV from the prefill worker to the decode worker, which computes only the
    first token's position itself."""
    # a prefix no earlier request cached, long enough that its KV crosses in several chunks
    prompt = "Zanzibar quokkas juggle eleven turquoise melons. " + CASES["long"].prompt
    ids = tokenizer(prompt).input_ids
    before = _by_role(all_worker_stats(stack))
    response = client.completions.create(model=model_name, prompt=prompt, temperature=0, max_tokens=8)
    after = _by_role(all_worker_stats(stack))

    def delta(role: str, field: str) -> int:
        return getattr(after[role], field) - getattr(before[role], field)

    assert response.usage.prompt_tokens == len(ids)
    assert delta("prefill", "num_prompt_tokens_computed") == len(ids)
    assert delta("prefill", "num_generated_tokens") == 1
    assert delta("decode", "num_prompt_tokens_computed") == 0  # only the first token's KV: an output token
    assert delta("decode", "num_generated_tokens") == response.usage.completion_tokens - 1
    expected = _kv_bytes(smollm2_dir, len(ids), after["prefill"].block_size)
    assert delta("decode", "kv_bytes_imported") == expected
    # a NIXL READ is the decode worker's alone; the gRPC fallback's pull is served by the prefill worker
    assert delta("prefill", "kv_bytes_exported") == (0 if is_available() else expected)


def _by_role(stats: dict) -> dict:
    assert sorted(stats) == ["decode-0", "prefill-0"], sorted(stats)
    return {"prefill": stats["prefill-0"], "decode": stats["decode-0"]}


def _kv_bytes(model_dir, num_tokens: int, block_size: int) -> int:
    """float32 KV of the blocks holding `num_tokens`: [layers, 2, blocks, block_size, kv_heads, head_dim]."""
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    num_blocks = -(-num_tokens // block_size)
    return cfg["num_hidden_layers"] * 2 * num_blocks * block_size * cfg["num_key_value_heads"] * head_dim * 4
