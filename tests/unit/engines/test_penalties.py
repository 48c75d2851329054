"""Logit shaping: logit_bias, presence/frequency (generated tokens only), repetition (prompt + generated), min_p;
exact on hand-made logits, then through the engine, alone and continued on a second engine as disaggregation
does (the first token sampled on one engine, the rest on the other, same tokens as one run)."""

import pytest
import torch

from engines.base import EngineRequest, SamplingParams
from engines.base.errors import InvalidRequestError
from engines.core.engine_core import check_shaping
from engines.core.messages import Add, decode, encode
from engines.native.penalties import shape_logits
from engines.native.sampler import SampleRow, sample
from tests.unit.engines.helpers import collect, greedy, started

PROMPT = (11, 22, 33, 44, 55)
LOGITS = torch.tensor([[4.0, 3.0, -2.0, 1.0, 0.5]])


def shaped(params: SamplingParams, history=(), num_prompt=0) -> list[float]:
    return shape_logits(LOGITS, [params], [history], [num_prompt])[0].tolist()


def test_no_shaping_returns_the_same_tensor():
    assert shape_logits(LOGITS, [SamplingParams()], [(1, 2)], [1]) is LOGITS


def test_logit_bias_adds_to_the_named_tokens():
    assert shaped(SamplingParams(logit_bias=((1, 2.5), (4, -100.0)))) == [4.0, 5.5, -2.0, 1.0, -99.5]


def test_presence_and_frequency_count_generated_tokens_only():
    # prompt (3, 3) is ignored; generated: token 0 twice, token 2 once
    params = SamplingParams(presence_penalty=0.5, frequency_penalty=0.25)
    assert shaped(params, history=(3, 3, 0, 2, 0), num_prompt=2) == [4.0 - 0.5 - 0.5, 3.0, -2.0 - 0.5 - 0.25, 1.0, 0.5]


def test_repetition_divides_positive_and_multiplies_negative_logits_of_every_seen_token():
    params = SamplingParams(repetition_penalty=2.0)
    assert shaped(params, history=(0, 2, 2), num_prompt=2) == [2.0, 3.0, -4.0, 1.0, 0.5]


def test_in_place_shaping_writes_into_the_given_tensor():
    logits = LOGITS.clone()
    assert shape_logits(logits, [SamplingParams(logit_bias=((0, 1.0),))], [()], [0], in_place=True) is logits
    assert logits[0, 0] == 5.0 and LOGITS[0, 0] == 4.0


def test_rows_are_shaped_independently():
    params = [SamplingParams(), SamplingParams(frequency_penalty=1.0), SamplingParams(logit_bias=((2, 1.0),))]
    out = shape_logits(LOGITS.expand(3, 5), params, [(0,), (0, 1, 1), (0,)], [1, 1, 1])
    assert out[0].tolist() == LOGITS[0].tolist()
    assert out[1].tolist() == [4.0, 1.0, -2.0, 1.0, 0.5]
    assert out[2].tolist() == [4.0, 3.0, -1.0, 1.0, 0.5]


def test_greedy_follows_the_bias_and_penalties():
    gen = torch.Generator().manual_seed(0)
    row = SampleRow(SamplingParams(logit_bias=((3, 10.0),)), 0)
    assert sample(LOGITS.clone(), [row], gen).to_host()[0][0] == 3
    row = SampleRow(SamplingParams(presence_penalty=2.0), 2, token_ids=(0, 0, 0), num_prompt_tokens=1)
    assert sample(LOGITS.clone(), [row], gen).to_host()[0][0] == 1  # 4 - 2 < 3


def test_min_p_restricts_the_support():
    gen = torch.Generator().manual_seed(0)
    logits = torch.tensor([[2.0, 1.9, 0.0, -1.0, -3.0]])
    params = SamplingParams(temperature=1.0, min_p=0.5)  # keeps tokens with p >= p_max / 2: 0 and 1
    assert {sample(logits, [SampleRow(params, 0)], gen).to_host()[0][0] for _ in range(300)} == {0, 1}


def test_logprobs_stay_those_of_the_model():
    row = SampleRow(SamplingParams(logprobs=True, logit_bias=((3, 10.0),)), 0)
    token, lp = sample(LOGITS.clone(), [row], torch.Generator()).to_host()[0]
    assert token == 3 and lp.logprob == pytest.approx(float(LOGITS[0].log_softmax(-1)[3]))


@pytest.mark.parametrize(
    "params, message",
    [
        (SamplingParams(presence_penalty=2.5), "presence_penalty"),
        (SamplingParams(frequency_penalty=-3), "frequency_penalty"),
        (SamplingParams(repetition_penalty=0.0), "repetition_penalty"),
        (SamplingParams(min_p=1.5), "min_p"),
        (SamplingParams(logit_bias=((2, 1.0), (1, 1.0))), "ascending"),
        (SamplingParams(logit_bias=((2, 101.0),)), "logit_bias"),
    ],
)
def test_out_of_range_values_are_refused(params, message):
    with pytest.raises(InvalidRequestError, match=message):
        params.validate()


def test_an_engine_without_logits_names_what_it_cannot_honour(tiny_llama):
    from engines.base.types import KvLayout
    from engines.core.runner import RunnerInfo

    info = RunnerInfo(KvLayout(1, 1, 1, "float32", 16), 8, 64, 100, no_logits="sim")
    check_shaping(SamplingParams(temperature=1.0, top_k=5), info)  # randomness knobs are not refused
    with pytest.raises(InvalidRequestError, match="sim engine .* frequency_penalty, logit_bias"):
        check_shaping(SamplingParams(frequency_penalty=1.0, logit_bias=((1, 1.0),)), info)
    native = RunnerInfo(KvLayout(1, 1, 1, "float32", 16), 8, 64, 100)
    with pytest.raises(InvalidRequestError, match=r"\[0, 100\)"):
        check_shaping(SamplingParams(logit_bias=((100, 1.0),)), native)


def test_the_engine_message_carries_every_sampling_field():
    params = SamplingParams(
        max_tokens=9,
        temperature=0.7,
        top_k=5,
        seed=3,
        presence_penalty=0.5,
        frequency_penalty=-0.5,
        repetition_penalty=1.2,
        min_p=0.1,
        logit_bias=((1, 2.0), (7, -1.0)),
    )
    message = Add(EngineRequest("r", PROMPT, params))
    assert decode(encode(message)) == message


async def test_penalties_change_greedy_output_and_survive_a_handover(tiny_llama):
    params = greedy(16, repetition_penalty=1.5, frequency_penalty=1.0, presence_penalty=0.5, logit_bias=((7, 3.0),))
    first_engine, second_engine = await started(tiny_llama), await started(tiny_llama)
    try:
        plain, _ = await collect(first_engine, EngineRequest("plain", PROMPT, greedy(16)))
        whole, _ = await collect(first_engine, EngineRequest("whole", PROMPT, params))
        first, _ = await collect(first_engine, EngineRequest("pre", PROMPT, params, hold_kv=True))
        kv = await first_engine.export_kv("pre")
        await first_engine.release_kv("pre")
        rest, _ = await collect(
            second_engine, EngineRequest("rest", PROMPT, params, kv=kv, output_token_ids=tuple(first))
        )
    finally:
        await first_engine.shutdown()
        await second_engine.shutdown()
    assert whole != plain
    assert first + rest == whole
    # a frequency penalty of 1 on a tiny random model: far fewer repeats than plain greedy decoding
    assert len(set(whole)) > len(set(plain))
