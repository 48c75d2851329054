"""Speculative decoding through the native engine: greedy output identical to plain decoding on every supported
architecture, in batches shared with chunked prefills, with logprobs, penalties, min_tokens and stop tokens applied
to accepted tokens only."""

import asyncio

import pytest
import torch

from engines.base import EngineRequest
from tests.conftest import TINY_VARIANTS
from tests.unit.engines.helpers import collect, greedy, run_batch, started

# NOTE: the adaptive rule on its fixed costs, not on costs timed at start: what these tests count stays the same
FIXED_COSTS = {"spec_verify_costs": ()}


def copy_heavy_prompts(vocab_size: int) -> list[list[int]]:
    """Prompts that repeat spans, so prompt lookup has something to propose (and tiny random models, which
    fall into loops, give it more), plus one with no repeats at all."""
    gen = torch.Generator().manual_seed(3)
    span = torch.randint(0, vocab_size, (11,), generator=gen).tolist()
    other = torch.randint(0, vocab_size, (29,), generator=gen).tolist()
    return [span * 3, other[:7] + span + other[7:20] + span[:6], other, span + other + span[:3]]


async def generate(model_dir, prompts, params, speculative: str, **kw):
    engine = await started(model_dir, speculative=speculative, **FIXED_COSTS, **kw)
    try:
        tokens = await run_batch(engine, prompts, params)
        spec = engine.channel.core.scheduler.speculator
        return tokens, spec
    finally:
        await engine.shutdown()


@pytest.mark.parametrize("variant", sorted(TINY_VARIANTS))
async def test_greedy_output_is_identical_with_prompt_lookup(tiny_model_factory, variant):
    model_dir = tiny_model_factory(variant)
    vocab = 256  # every tiny variant's vocabulary is larger
    prompts = copy_heavy_prompts(vocab)
    # NOTE: a 16-token budget chunks the prefills, so verifying spans share steps with prefill chunks
    plain, _ = await generate(model_dir, prompts, greedy(48), "", max_num_batched_tokens=16)
    ours, spec = await generate(model_dir, prompts, greedy(48), "ngram", max_num_batched_tokens=16)
    assert ours == plain
    assert spec.num_accepted > 0 and spec.num_proposed > spec.num_accepted  # it did accept and reject


async def test_logprobs_penalties_and_min_tokens_apply_to_accepted_tokens(tiny_llama):
    prompts = copy_heavy_prompts(256)
    stop = 7
    params = greedy(
        40,
        logprobs=True,
        top_logprobs=2,
        repetition_penalty=1.3,
        presence_penalty=0.5,
        frequency_penalty=0.3,
        min_tokens=12,
        stop_token_ids=(stop,),
    )
    results = {}
    for method in ("", "ngram"):
        engine = await started(tiny_llama, speculative=method, **FIXED_COSTS, max_num_batched_tokens=24)
        try:
            outs = [await collect(engine, EngineRequest(f"q{i}", tuple(p), params)) for i, p in enumerate(prompts)]
            results[method] = outs
            spec = engine.channel.core.scheduler.speculator
        finally:
            await engine.shutdown()
    assert spec.num_proposed > 0
    for (plain, plain_last), (ours, ours_last) in zip(results[""], results["ngram"], strict=True):
        assert ours == plain
        assert ours_last.finish_reason == plain_last.finish_reason
    plain_lps = [lp for _, last in results[""] for lp in last.logprobs]
    assert plain_lps  # logprobs arrive with the last output too


async def test_logprobs_of_accepted_tokens_are_the_models(tiny_llama):
    prompt = copy_heavy_prompts(256)[0]
    params = greedy(24, logprobs=True, top_logprobs=3)
    got = {}
    for method in ("", "ngram"):
        engine = await started(tiny_llama, speculative=method, **FIXED_COSTS)
        try:
            got[method] = [o async for o in engine.add_request(EngineRequest("lp", tuple(prompt), params))]
        finally:
            await engine.shutdown()
    plain = [lp for o in got[""] for lp in o.logprobs]
    ours = [lp for o in got["ngram"] for lp in o.logprobs]
    assert len(got["ngram"]) < len(got[""])  # several tokens arrived in one step: it did speculate
    assert [lp.token_id for lp in ours] == [lp.token_id for lp in plain]
    for a, b in zip(ours, plain, strict=True):
        assert a.logprob == pytest.approx(b.logprob, abs=1e-4)
        assert [t for t, _ in a.top] == [t for t, _ in b.top]


async def test_seeded_sampling_is_reproducible_with_speculation(tiny_llama):
    prompts = copy_heavy_prompts(256)
    params = greedy(32, temperature=0.7, seed=11)
    first, spec = await generate(tiny_llama, prompts, params, "ngram")
    again, _ = await generate(tiny_llama, prompts[::-1], params, "ngram")
    assert spec.num_proposed > 0
    assert again[::-1] == first


async def test_disaggregated_and_migrated_requests_speculate_on_their_decode_engine(tiny_llama):
    """A prefill-only request does not speculate (one token, then its KV waits); the decode engine that imports
    its KV does, and so does one continuing a migrated request (prompt + tokens already sent): output unchanged."""
    p = copy_heavy_prompts(256)[1]
    plain = await started(tiny_llama)
    prefill = await started(tiny_llama, speculative="ngram", **FIXED_COSTS)
    # as a worker runs it, in its own process: the counters cross too
    decode = await started(tiny_llama, speculative="ngram", **FIXED_COSTS, process=True)
    try:
        reference, _ = await collect(plain, EngineRequest("ref", tuple(p), greedy(40)))
        first, _ = await collect(prefill, EngineRequest("pre", tuple(p), greedy(40), hold_kv=True))
        kv = await prefill.export_kv("pre")
        await prefill.release_kv("pre")
        rest, last = await collect(
            decode, EngineRequest("dec", tuple(p), greedy(40), kv=kv, output_token_ids=tuple(first))
        )
        assert last.num_cached_tokens == len(p)
        migrated, _ = await collect(
            decode, EngineRequest("mig", tuple(p), greedy(40), output_token_ids=tuple(reference[:9]))
        )
        assert prefill.stats().num_spec_proposed == 0
        stats = decode.stats()
        assert 0 < stats.num_spec_accepted < stats.num_spec_proposed and stats.num_spec_verify_steps > 0
    finally:
        for engine in (plain, prefill, decode):
            await engine.shutdown()
    assert first + rest == reference
    assert reference[:9] + migrated == reference


@pytest.fixture(scope="module")
def other_draft(tmp_path_factory):
    """A tiny llama of other random weights: the target's tokenizer, proposals mostly wrong."""
    from tandem.models.init import init_model

    return init_model(tmp_path_factory.mktemp("draft"), "llama", tiny=True, seed=1)


async def test_a_draft_model_proposes_and_greedy_output_is_unchanged(tiny_llama, other_draft):
    prompts = copy_heavy_prompts(256)
    plain, _ = await generate(tiny_llama, prompts, greedy(32), "", max_num_batched_tokens=16)
    same, _ = await generate(tiny_llama, prompts, greedy(32), f"draft:{tiny_llama}", max_num_batched_tokens=16)
    other, _ = await generate(tiny_llama, prompts, greedy(32), f"draft:{other_draft}", max_num_batched_tokens=16)
    engine = await started(tiny_llama, speculative=f"draft:{tiny_llama}", **FIXED_COSTS)
    try:
        await run_batch(engine, prompts[:1], greedy(32))
        stats = engine.stats()
    finally:
        await engine.shutdown()
    assert same == plain and other == plain
    # NOTE: the target as its own draft: every proposal is the target's own argmax
    assert stats.num_spec_accepted >= 0.9 * stats.num_spec_proposed > 0


def test_a_draft_with_another_vocabulary_is_refused(tiny_llama, tmp_path):
    import json
    import shutil

    from engines.native.draft import DraftError, check_draft

    other = tmp_path / "other"
    shutil.copytree(tiny_llama, other)
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "vocab_size": config["vocab_size"] + 64}))
    with pytest.raises(DraftError, match="token ids"):
        check_draft(str(tiny_llama), str(other))


async def test_every_published_block_holds_accepted_tokens_only(tiny_llama):
    from engines.base import chain_block_hashes
    from engines.base.events import KvEventKind

    prompts = copy_heavy_prompts(256)
    # small blocks: many fill with output
    engine = await started(tiny_llama, speculative="ngram", **FIXED_COSTS, block_size=4)
    try:
        outputs = await run_batch(engine, prompts, greedy(40))
        await asyncio.sleep(0.2)  # NOTE: the loop publishes a step's events after its outputs
        events = await engine.kv_events_since(0)
        stats = engine.stats()
    finally:
        await engine.shutdown()
    real = {h for p, o in zip(prompts, outputs) for h in chain_block_hashes(tuple(p + o), 4)}
    stored = {h for e in events if e.kind is KvEventKind.STORED for h in e.block_hashes}
    assert stats.num_spec_proposed > stats.num_spec_accepted > 0  # some proposals were rejected
    assert len(stored) > sum(len(p) for p in prompts) // 4  # output blocks were published too
    assert stored <= real
