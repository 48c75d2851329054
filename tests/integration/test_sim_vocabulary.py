"""A sim-engine stack serving the real SmolLM2 (49,152 tokens): the sim workers' vocabulary follows the model
directory, so any chat is answered (once a 400 "prompt token ids must be in [0, 32000)"); what the sim engine
cannot honour (it has no logits) is a 400 naming the field and the engine."""

import httpx
import pytest
from transformers import AutoTokenizer

from tests.integration.conftest import running_stack

# words whose SmolLM2 token ids lie past 32,000 (checked below, so the test cannot pass vacuously)
MESSAGE = "Summarize: photosynthesis, mitochondria, cryptocurrency, Tchaikovsky, Reykjavík."


@pytest.fixture(scope="module")
def sim_stack(smollm2_dir, tmp_path_factory):
    with running_stack(
        smollm2_dir, tmp_path_factory.mktemp("sim-vocab"), engine="sim", num_prefill=1, num_decode=1, worker_args=()
    ) as stack:
        yield stack


@pytest.fixture(scope="module")
def served(sim_stack) -> str:
    return httpx.get(f"{sim_stack.url}/v1/models", timeout=30).json()["data"][0]["id"]


def test_a_chat_with_token_ids_past_32000_is_answered(sim_stack, served, smollm2_dir):
    tokenizer = AutoTokenizer.from_pretrained(str(smollm2_dir))
    messages = [{"role": "user", "content": MESSAGE}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    prompt = tokenizer.encode(text, add_special_tokens=False)
    assert max(prompt) >= 32000
    reply = httpx.post(
        f"{sim_stack.url}/v1/chat/completions",
        timeout=60,
        json={"model": served, "messages": messages, "max_tokens": 24, "ignore_eos": True},
    )
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["completion_tokens"] == 24


def test_what_the_sim_engine_cannot_honour_is_a_clear_400(sim_stack, served):
    reply = httpx.post(
        f"{sim_stack.url}/v1/chat/completions",
        timeout=60,
        json={
            "model": served,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4,
            "frequency_penalty": 0.5,
        },
    )
    assert reply.status_code == 400, reply.text
    message = reply.json()["error"]["message"]
    assert "sim engine" in message and "frequency_penalty" in message


def test_vllm_bench_serve_fields_at_their_off_values_are_served(sim_stack, served):
    # what `vllm bench serve` sends with its defaults: off values are no shaping, so even the sim engine serves them
    reply = httpx.post(
        f"{sim_stack.url}/v1/completions",
        timeout=60,
        json={
            "model": served,
            "prompt": "hello",
            "max_tokens": 8,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
            "repetition_penalty": 1.0,
            "top_k": -1,
            "min_p": 0.0,
            "top_p": 1.0,
            "temperature": 0.0,
            "logit_bias": {},
        },
    )
    assert reply.status_code == 200, reply.text
    assert reply.text.rstrip().endswith("data: [DONE]") and '"completion_tokens":8' in reply.text.replace(" ", "")
