"""Grammar-constrained sampling in the native engine: outputs follow the grammar (even from random weights), a
request continued after tokens generated elsewhere resumes the grammar where they left it, and engines that cannot
constrain refuse a structured request by the field's name."""

import asyncio
import json

import jsonschema
import pytest
import torch
from tokenizers import Tokenizer

from engines.base import EngineRequest, SamplingParams
from engines.base.errors import InvalidRequestError
from engines.base.structured import StructuredSpec
from engines.core.engine_core import validate
from engines.native.grammar import unpack_bitmask
from engines.native.sampler import SampleRow, sample
from engines.zero.runner import ZeroRunner
from tests.unit.engines.helpers import collect, started

SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["city", "population"],
    "properties": {"city": {"type": "string", "maxLength": 12}, "population": {"type": "integer"}},
}


def _text(model_dir, tokens: list[int]) -> str:
    return Tokenizer.from_file(str(model_dir / "tokenizer.json")).decode(tokens, skip_special_tokens=True)


def _prompt(model_dir, text: str) -> tuple[int, ...]:
    return tuple(Tokenizer.from_file(str(model_dir / "tokenizer.json")).encode(text).ids)


def test_the_mask_hook_only_lets_allowed_tokens_through():
    logits = torch.tensor([[5.0, 4.0, 3.0, 2.0], [5.0, 4.0, 3.0, 2.0]])
    allowed = torch.tensor([[False, False, True, True], [True, True, True, True]])
    gen = torch.Generator().manual_seed(0)
    got = sample(logits, [SampleRow(SamplingParams(), 0), SampleRow(SamplingParams(), 0)], gen, allowed).to_host()
    assert [t for t, _ in got] == [2, 0]
    hot = SamplingParams(temperature=5.0, seed=1)
    assert {sample(logits, [SampleRow(hot, i)], gen, allowed[:1]).to_host()[0][0] for i in range(100)} == {2, 3}


def test_bitmask_unpacks_bit_j_of_word_w_as_token_32w_plus_j():
    import numpy as np

    words = np.zeros((1, 2), dtype=np.int32)
    words[0, 0], words[0, 1] = 1 | (1 << 5), np.uint32(1 << 31).view(np.int32)
    assert unpack_bitmask(words, 64)[0].nonzero().flatten().tolist() == [0, 5, 63]


async def test_choice_holds_even_for_random_weights(tiny_llama):
    spec = StructuredSpec("choice", json.dumps(["alpha", "beta", "gamma"]), "structured_outputs")
    engine = await started(tiny_llama)
    try:
        outs = [
            await collect(
                engine,
                EngineRequest(
                    f"c{i}",
                    _prompt(tiny_llama, f"pick {i}"),
                    SamplingParams(max_tokens=20, temperature=1.0, seed=i, structured=spec),
                ),
            )
            for i in range(4)
        ]
        stats = engine.stats()
    finally:
        await engine.shutdown()
    for tokens, last in outs:
        assert _text(tiny_llama, tokens) in {"alpha", "beta", "gamma"}
        assert last.finish_reason.value == "stop"
    # NOTE: one mask per sampled token (the stop token that ended the answer is one of them); timed on both threads
    assert stats.num_grammar_masks == sum(len(tokens) for tokens, _ in outs)
    assert stats.grammar_mask_seconds > 0 and stats.grammar_wait_seconds >= 0


async def test_a_finished_grammar_with_ignore_eos_only_repeats_stop_tokens_and_hurts_no_one(tiny_llama):
    spec = StructuredSpec("choice", json.dumps(["yes", "no"]), "structured_outputs")
    engine = await started(tiny_llama)
    try:
        free = EngineRequest("free", _prompt(tiny_llama, "b"), SamplingParams(max_tokens=12, ignore_eos=True))
        both = await asyncio.gather(
            collect(
                engine,
                EngineRequest(
                    "held", _prompt(tiny_llama, "a"), SamplingParams(max_tokens=12, ignore_eos=True, structured=spec)
                ),
            ),
            collect(engine, free),
        )
    finally:
        await engine.shutdown()
    (held, held_last), (other, other_last) = both
    assert held_last.error is None and other_last.error is None
    assert len(held) == 12 and len(other) == 12
    eos = set(engine.info.eos_token_ids)
    answer = [t for t in held if t not in eos]
    assert _text(tiny_llama, answer) in ("yes", "no") and set(held[len(answer) :]) <= eos


async def test_json_schema_from_smollm2_validates_and_resumes_after_a_first_token(smollm2_dir):
    spec = StructuredSpec("json_schema", json.dumps(SCHEMA))
    prompt = _prompt(
        smollm2_dir, "<|im_start|>user\nGive the largest city of France as JSON.<|im_end|>\n<|im_start|>assistant\n"
    )
    params = SamplingParams(max_tokens=60, structured=spec)
    engine = await started(smollm2_dir)
    try:
        whole, last = await collect(engine, EngineRequest("whole", prompt, params))
        # as a decode worker continues a prefill worker's first token: a fresh matcher replays it
        rest, _ = await collect(engine, EngineRequest("rest", prompt, params, output_token_ids=(whole[0],)))
    finally:
        await engine.shutdown()
    assert last.finish_reason.value == "stop"
    jsonschema.validate(json.loads(_text(smollm2_dir, whole)), SCHEMA)
    assert [whole[0]] + rest == whole


def test_an_engine_that_cannot_constrain_refuses_by_the_fields_name():
    runner = ZeroRunner(1000)
    request = EngineRequest("z", (1, 2, 3), SamplingParams(structured=StructuredSpec("regex", "a+", "tool_choice")))
    with pytest.raises(InvalidRequestError, match="tool_choice") as info:
        validate(request, runner.info)
    assert info.value.param == "tool_choice"
    validate(EngineRequest("z", (1, 2, 3), SamplingParams()), runner.info)


def test_a_tokenizer_llguidance_cannot_read_leaves_the_model_serving_without_grammars(tmp_path):
    from tokenizers.models import WordLevel

    from engines.native.grammar import Grammars

    tokenizer = Tokenizer(WordLevel({"<unk>": 0, "a": 1, "</s>": 2}, unk_token="<unk>"))  # no decoder at all
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    assert Grammars.maybe_load(str(tmp_path), 3, (2,)) is None


def _grammars_and_seq(model_dir, req_id: str, spec: StructuredSpec):
    from engines.core.sequence import Sequence
    from engines.native.grammar import Grammars

    vocab = Tokenizer.from_file(str(model_dir / "tokenizer.json")).get_vocab_size()
    grammars = Grammars.maybe_load(str(model_dir), vocab, (0,))
    return grammars, Sequence(req_id, [5, 6, 7], 3, SamplingParams(max_tokens=8, structured=spec))


def test_after_its_first_step_a_request_masks_without_the_grammar_thread(tiny_llama, monkeypatch):
    spec = StructuredSpec("choice", json.dumps(["alpha", "beta"]), "structured_outputs")
    grammars, seq = _grammars_and_seq(tiny_llama, "a", spec)
    submitted = []
    real_submit = grammars._thread.submit
    monkeypatch.setattr(grammars._thread, "submit", lambda *a: submitted.append(a[0]) or real_submit(*a))
    first = grammars.start([seq]).wait()  # [1, vocab]
    seq.token_ids.append(int(first[0].nonzero()[0]))  # any allowed token
    second = grammars.start([seq]).wait()
    assert len(submitted) == 1  # the matcher's build, once per request
    assert grammars.counters.num_masks == 2 and first.shape == second.shape == (1, first.shape[1])
    assert 0 < int(second[0].sum()) < second.shape[1]  # still constrained, by the grammar's next state


def test_a_grammar_that_does_not_compile_stops_its_own_row_only(tiny_llama):
    from engines.core.sequence import Sequence

    grammars, bad = _grammars_and_seq(tiny_llama, "bad", StructuredSpec("grammar", "start: {{{", "structured_outputs"))
    good = Sequence("good", [5, 6], 2, SamplingParams(max_tokens=8))
    allowed = grammars.start([good, bad]).wait()
    assert bool(allowed[0].all())  # the unconstrained row: everything
    assert allowed[1].nonzero().flatten().tolist() == [0]  # the stop token alone
