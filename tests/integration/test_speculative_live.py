"""Speculative decoding live: stacks whose workers speculate (`tandem up --speculative ngram`, and `draft:DIR` with a
tiny draft) answer greedy prompts exactly as a stack without it does, whether the decode worker prefilled a prompt
itself (aggregated) or imported its KV from the prefill worker (disaggregated); the decode worker's speculative
counters show it verified proposals in both cases, and the prefill worker never speculates."""

import random
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.conftest import all_worker_stats, running_stack
from tests.integration.helpers import poll

MAX_TOKENS = 24
DISAGG_MIN_TOKENS = 40  # uncached prompt tokens from which the router sends a prompt through the prefill worker
SPEC_COUNTERS = ("tandem_worker_spec_proposed_tokens", "tandem_worker_spec_accepted_tokens")


def _prompt(seed: int, length: int) -> list[int]:
    """Random ids with a span repeated: prompt lookup has something to propose (so have the tiny model's loops)."""
    rng = random.Random(seed)
    head = [rng.randrange(3, 512) for _ in range(length)]
    span = [rng.randrange(3, 512) for _ in range(9)]
    return head + span + head[:5] + span


# short prompts (29 tokens) stay on the decode worker, long ones (63) are prefilled on the prefill worker
PROMPTS = {**{f"agg-{i}": _prompt(i, 6) for i in range(3)}, **{f"disagg-{i}": _prompt(10 + i, 40) for i in range(3)}}


def _spec_counters(stack, worker: str) -> dict[str, float]:
    text = httpx.get(stack.metrics_urls[worker], timeout=5).text
    return {
        f.name: s.value
        for f in text_string_to_metric_families(text)
        if f.name in SPEC_COUNTERS
        for s in f.samples
        if s.name.endswith("_total")
    }


def _serve(model: Path, tmp_path: Path, speculative: str) -> dict[str, dict]:
    """name -> {"tokens", "disaggregated", "spec"}: each prompt's completion (greedy) on a fresh stack, whether the
    prefill worker computed its prompt, and how the decode worker's speculative counters moved."""
    args = ("--num-blocks", "256", "--max-num-batched-tokens", "512")
    args += ("--speculative", speculative) if speculative else ()  # what `tandem up --speculative` passes on
    env = {"TANDEM_ROUTER_DISAGG_MIN_TOKENS": str(DISAGG_MIN_TOKENS)}
    out = {}
    with (
        running_stack(model, tmp_path, num_prefill=1, num_decode=1, env=env, worker_args=args) as stack,
        httpx.Client(timeout=120) as http,
    ):
        for name, prompt in PROMPTS.items():
            before, spec_before = all_worker_stats(stack), _spec_counters(stack, "decode-0")
            response = http.post(
                f"{stack.url}/v1/completions",
                json={
                    "model": model.name,
                    "prompt": prompt,
                    "max_tokens": MAX_TOKENS,
                    "temperature": 0,
                    "ignore_eos": True,
                    "logprobs": 1,
                },
            )
            assert response.status_code == 200, (name, response.text)
            after = all_worker_stats(stack)
            spec = poll(
                lambda: _spec_counters(stack, "decode-0"), lambda c, was=spec_before: c != was or not speculative, 5
            )
            computed = after["prefill-0"].num_prompt_tokens_computed - before["prefill-0"].num_prompt_tokens_computed
            out[name] = {
                "tokens": response.json()["choices"][0]["logprobs"]["tokens"],
                "disaggregated": computed > 0,
                "spec": {k: spec.get(k, 0) - spec_before.get(k, 0) for k in SPEC_COUNTERS},
            }
        out["prefill-0 spec"] = _spec_counters(stack, "prefill-0")
    return out


@pytest.fixture(scope="module")
def plain(tiny_stack_model, tmp_path_factory):
    return _serve(tiny_stack_model, tmp_path_factory.mktemp("plain"), "")


@pytest.fixture(scope="module")
def tiny_draft(tmp_path_factory) -> Path:
    """A tiny llama of other random weights with the target's tokenizer: a draft that is mostly wrong."""
    from tandem.models.init import init_model

    return init_model(tmp_path_factory.mktemp("draft"), "llama", tiny=True, seed=1)


@pytest.fixture(scope="module", params=["ngram", "draft"])
def speculating(request, tiny_stack_model, tiny_draft, tmp_path_factory, plain):
    speculative = "ngram" if request.param == "ngram" else f"draft:{tiny_draft}"
    return _serve(tiny_stack_model, tmp_path_factory.mktemp(request.param), speculative)


@pytest.mark.parametrize("name", sorted(PROMPTS))
def test_greedy_output_equals_the_stack_without_speculation(plain, speculating, name):
    assert len(plain[name]["tokens"]) == MAX_TOKENS
    assert speculating[name]["tokens"] == plain[name]["tokens"]
    assert speculating[name]["disaggregated"] == plain[name]["disaggregated"] == name.startswith("disagg")


def test_the_decode_worker_speculates_in_both_modes_and_the_prefill_worker_never(speculating):
    for mode in ("agg", "disagg"):
        moved = [speculating[name]["spec"] for name in PROMPTS if name.startswith(f"{mode}-")]
        proposed = sum(m["tandem_worker_spec_proposed_tokens"] for m in moved)
        accepted = sum(m["tandem_worker_spec_accepted_tokens"] for m in moved)
        assert proposed > 0 and 0 <= accepted <= proposed, (mode, moved)
    assert speculating["prefill-0 spec"].get("tandem_worker_spec_proposed_tokens", 0) == 0
