"""Sampling: seeded requests reproduce whatever the batch, top-k/top-p limits hold, stop tokens
end a request, and log-probabilities are those of the model's distribution."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from engines.base import EngineRequest, SamplingParams
from engines.native.sampler import SampleRow, sample
from tests.unit.engines.helpers import collect, greedy, run_batch, started

PROMPT = (11, 22, 33, 44, 55)


async def test_seeded_sampling_reproduces_alone_and_in_batch(tiny_llama):
    params = SamplingParams(max_tokens=24, temperature=1.0, top_p=0.9, top_k=50, seed=1234, ignore_eos=True)
    engine = await started(tiny_llama)
    try:
        alone, _ = await collect(engine, EngineRequest("alone", PROMPT, params))
        others = [
            EngineRequest(f"o{i}", (i + 1,) * (i + 3), SamplingParams(max_tokens=24, temperature=1.0)) for i in range(7)
        ]
        batch = await run_batch(engine, [PROMPT] + [r.prompt_token_ids for r in others], params)
        other_seed, _ = await collect(
            engine,
            EngineRequest(
                "s2",
                PROMPT,
                SamplingParams(max_tokens=24, temperature=1.0, top_p=0.9, top_k=50, seed=99, ignore_eos=True),
            ),
        )
    finally:
        await engine.shutdown()
    assert batch[0] == alone
    assert other_seed != alone


async def test_top_k_one_and_tiny_top_p_are_greedy(tiny_llama):
    engine = await started(tiny_llama)
    try:
        ref, _ = await collect(engine, EngineRequest("g", PROMPT, greedy(16)))
        k1, _ = await collect(engine, EngineRequest("k", PROMPT, greedy(16, temperature=1.5, top_k=1, seed=3)))
        p0, _ = await collect(engine, EngineRequest("p", PROMPT, greedy(16, temperature=1.5, top_p=1e-6, seed=3)))
    finally:
        await engine.shutdown()
    assert k1 == ref and p0 == ref


def test_top_k_and_top_p_restrict_the_support():
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0]])
    gen = torch.Generator().manual_seed(0)

    def draw(params: SamplingParams) -> int:
        return sample(logits, [SampleRow(params, 0)], gen).to_host()[0][0]

    assert {draw(SamplingParams(temperature=5.0, top_k=2)) for _ in range(200)} == {0, 1}
    # probabilities at T=1: .64 .24 .09 .03 .01 -> top_p .8 keeps the first two
    assert {draw(SamplingParams(temperature=1.0, top_p=0.8)) for _ in range(200)} == {0, 1}


def test_banned_tokens_are_never_drawn_and_seeds_key_on_the_token_index():
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0]])
    gen = torch.Generator().manual_seed(0)
    greedy_row = SampleRow(SamplingParams(), 0, banned=(0, 1))
    assert sample(logits, [greedy_row], gen).to_host()[0][0] == 2
    seeded = [SampleRow(SamplingParams(temperature=5.0, seed=7), i) for i in range(32)]
    first = [t for t, _ in sample(logits.expand(32, 5), seeded, gen).to_host()]
    again = [t for t, _ in sample(logits.expand(32, 5), seeded[::-1], gen).to_host()][::-1]
    assert first == again and len(set(first)) > 1  # same (seed, index), same token, in any row order


async def test_stop_token_ends_request(tiny_llama):
    engine = await started(tiny_llama)
    try:
        ref, _ = await collect(engine, EngineRequest("g", PROMPT, greedy(16)))
        stop_at = ref[5]
        first = ref.index(stop_at)
        tokens, last = await collect(
            engine,
            EngineRequest("s", PROMPT, SamplingParams(max_tokens=16, stop_token_ids=(stop_at,), ignore_eos=True)),
        )
    finally:
        await engine.shutdown()
    assert tokens == ref[: first + 1]
    assert last.finish_reason.value == "stop"


async def test_logprobs_are_the_models(tiny_llama):
    ref_model = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32).eval()
    engine = await started(tiny_llama)
    try:
        tokens, _ = await collect(engine, EngineRequest("lp", PROMPT, greedy(1)))
        out = [
            o async for o in engine.add_request(EngineRequest("lp2", PROMPT, greedy(1, logprobs=True, top_logprobs=3)))
        ]
    finally:
        await engine.shutdown()
    with torch.inference_mode():
        expected = ref_model(torch.tensor([PROMPT])).logits[0, -1].float().log_softmax(-1)
    lp = out[-1].logprobs[0]
    assert lp.token_id == tokens[0]
    assert lp.logprob == pytest.approx(float(expected[tokens[0]]), abs=1e-4)
    top_ids = [t for t, _ in lp.top]
    assert top_ids == torch.topk(expected, 3).indices.tolist()
    assert [v for _, v in lp.top] == sorted((v for _, v in lp.top), reverse=True)


async def test_min_tokens_keeps_stop_tokens_out_until_reached(tiny_llama):
    engine = await started(tiny_llama)
    try:
        ref, _ = await collect(engine, EngineRequest("g", PROMPT, greedy(16)))
        stop = ref[0]
        at_once, last = await collect(engine, EngineRequest("s", PROMPT, greedy(16, stop_token_ids=(stop,))))
        held_off, _ = await collect(
            engine, EngineRequest("m", PROMPT, greedy(16, stop_token_ids=(stop,), min_tokens=4))
        )
    finally:
        await engine.shutdown()
    assert at_once == [stop] and last.finish_reason.value == "stop"
    assert stop not in held_off[:4] and held_off[0] != stop and len(held_off) >= 4
    assert stop not in held_off[:-1]  # after min_tokens it stops at its first stop token


@pytest.mark.parametrize("with_kv", [True, False])
async def test_a_seeded_request_continued_elsewhere_samples_what_one_run_would(tiny_llama, with_kv):
    params = SamplingParams(max_tokens=20, temperature=1.0, top_k=50, seed=4321, ignore_eos=True)
    first_engine, second_engine = await started(tiny_llama), await started(tiny_llama)
    try:
        whole, _ = await collect(first_engine, EngineRequest("whole", PROMPT, params))
        first, _ = await collect(first_engine, EngineRequest("pre", PROMPT, params, hold_kv=True))
        kv = await first_engine.export_kv("pre") if with_kv else None
        await first_engine.release_kv("pre")
        rest, last = await collect(
            second_engine, EngineRequest("rest", PROMPT, params, kv=kv, output_token_ids=tuple(first))
        )
    finally:
        await first_engine.shutdown()
        await second_engine.shutdown()
    assert len(first) == 1 and first + rest == whole and len(set(whole)) > 1
    assert last.num_prompt_tokens == len(PROMPT)
