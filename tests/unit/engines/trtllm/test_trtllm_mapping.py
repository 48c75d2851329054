"""tandem's request -> TensorRT-LLM's: the prompt it is given, SamplingParams one to one (built here with the
fake of the pinned release's class, so every keyword is a real field), the disaggregation mode, kv_params."""

import dataclasses

import pytest

from engines.base import EngineRequest, InvalidRequestError, KvExport, KvLayout, SamplingParams
from engines.trtllm import mapping
from engines.trtllm.mapping import decode_kv_params, encode_kv_params, plan_request
from tests.unit.engines.trtllm.fake_trtllm import DisaggregatedParams
from tests.unit.engines.trtllm.fake_trtllm import SamplingParams as TrtSamplingParams

PROMPT = (5, 6, 7, 8)
EOS = (2, 9)  # the model's EOS ids: the first is TensorRT-LLM's end id, the second a stop token


def plan(params=SamplingParams(max_tokens=8), eos=EOS, **kw):
    return plan_request(EngineRequest("r", PROMPT, params, **kw), eos, seed=1234)


def test_every_sampling_parameter_maps_one_to_one():
    p = SamplingParams(
        max_tokens=7,
        temperature=0.7,
        top_k=40,
        top_p=0.9,
        seed=11,
        stop_token_ids=(3, 4),
        logprobs=True,
        top_logprobs=5,
    )
    got = plan(p)
    assert got.inputs == PROMPT and got.disaggregated is None and not got.holds_kv and got.skip_tokens == ()
    assert got.sampling == {
        "max_tokens": 7,
        "temperature": 0.7,
        "top_k": 40,
        "top_p": 0.9,
        "seed": 11,
        "stop_token_ids": [3, 4, 9],
        "ignore_eos": False,
        "end_id": 2,
        "logprobs": 5,
        "detokenize": False,
        "return_perf_metrics": True,
    }
    built = TrtSamplingParams(**got.sampling)  # every keyword is a field of the release's SamplingParams
    assert (built.end_id, built.pad_id, built.stop_token_ids) == (2, 2, [3, 4, 9])


def test_greedy_ignore_eos_min_tokens_and_the_default_seed():
    got = plan(SamplingParams(max_tokens=8, ignore_eos=True, min_tokens=3)).sampling
    assert got["temperature"] == 0.0 and got["stop_token_ids"] == [] and got["ignore_eos"] is True
    assert got["min_tokens"] == 3 and got["seed"] == 1234  # unseeded: the caller's fresh seed, never TRT's 0
    assert "logprobs" not in got
    assert plan(SamplingParams(max_tokens=8, top_logprobs=0, logprobs=True)).sampling["logprobs"] == 1
    assert plan(SamplingParams(max_tokens=8, top_logprobs=3)).sampling["logprobs"] == 3


def test_min_tokens_with_stop_ids_is_refused_as_tensorrt_llm_would_stop_early():
    with pytest.raises(InvalidRequestError, match="min_tokens"):
        plan(SamplingParams(max_tokens=8, min_tokens=2, stop_token_ids=(4,)))
    with pytest.raises(InvalidRequestError, match="min_tokens"):  # the model's second EOS id is a stop token
        plan(SamplingParams(max_tokens=8, min_tokens=2))
    only_end_id = plan_request(EngineRequest("r", PROMPT, SamplingParams(max_tokens=8, min_tokens=2)), (2,), 1)
    assert only_end_id.sampling["min_tokens"] == 2 and only_end_id.sampling["stop_token_ids"] == []


def test_a_field_without_a_mapping_is_refused_when_set(monkeypatch):
    monkeypatch.setattr(mapping, "MAPPED", mapping.MAPPED - {"top_k"})
    assert plan(SamplingParams(max_tokens=8)).sampling["top_k"] == 0  # at its default: nothing to refuse
    with pytest.raises(InvalidRequestError, match="no equivalent of sampling parameter top_k"):
        plan(SamplingParams(max_tokens=8, top_k=5))


def test_every_tandem_sampling_field_is_mapped():
    assert {f.name for f in dataclasses.fields(SamplingParams)} <= mapping.MAPPED


def test_hold_kv_is_a_context_only_request_for_one_token():
    got = plan(SamplingParams(max_tokens=8, min_tokens=4), eos=(2,), hold_kv=True)
    assert got.holds_kv and got.disaggregated == {"request_type": "context_only"}
    assert got.sampling["max_tokens"] == 1 and got.sampling["min_tokens"] == 1  # the first token is not EOS
    DisaggregatedParams(**got.disaggregated)


def test_hold_kv_whose_only_token_is_its_last_holds_nothing():
    got = plan(SamplingParams(max_tokens=1), hold_kv=True)
    assert not got.holds_kv and got.disaggregated is None and got.sampling["max_tokens"] == 1


def test_kv_params_make_a_generation_only_request_that_repeats_the_first_token():
    blob = encode_kv_params(
        DisaggregatedParams(
            request_type="context_only", first_gen_tokens=[42], ctx_request_id=7, opaque_state=b"\x00\xffstate"
        )
    )
    got = plan(SamplingParams(max_tokens=8, min_tokens=3), eos=(2,), output_token_ids=(42,), kv=blob)
    assert got.inputs == PROMPT and got.imported and got.skip_tokens == (42,)
    assert got.sampling["max_tokens"] == 8 and got.sampling["min_tokens"] == 3  # both count the first token
    assert got.disaggregated == {
        "request_type": "generation_only",
        "first_gen_tokens": [42],
        "ctx_request_id": 7,
        "opaque_state": b"\x00\xffstate",
    }
    DisaggregatedParams(**got.disaggregated)


def test_kv_params_must_match_the_tokens_the_request_carries():
    blob = encode_kv_params(DisaggregatedParams(first_gen_tokens=[42], ctx_request_id=7))
    with pytest.raises(InvalidRequestError, match=r"first tokens \[42\], the request \[41\]"):
        plan(output_token_ids=(41,), kv=blob)


def test_output_tokens_without_kv_become_prompt_and_count_against_max_tokens():
    got = plan(SamplingParams(max_tokens=8, min_tokens=3, ignore_eos=True), output_token_ids=(11, 12))
    assert got.inputs == PROMPT + (11, 12) and not got.imported
    assert got.sampling["max_tokens"] == 6 and got.sampling["min_tokens"] == 1
    with pytest.raises(InvalidRequestError, match="already reach max_tokens=2"):
        plan(SamplingParams(max_tokens=2), output_token_ids=(11, 12))


@pytest.mark.parametrize(
    "kw,message",
    [
        ({"kv": KvExport(KvLayout(1, 1, 1, "float32", 16), (5,), 1, b"")}, "only as kv_params"),
        ({"hold_kv": True, "output_token_ids": (3,)}, "prompt alone"),
    ],
)
def test_requests_the_engine_cannot_serve_are_refused(kw, message):
    with pytest.raises(InvalidRequestError, match=message):
        plan(**kw)


def test_kv_params_round_trip_and_reject_what_is_not_theirs():
    params = DisaggregatedParams(
        request_type="context_only",
        first_gen_tokens=[1, 2],
        ctx_request_id=3,
        opaque_state=bytes(range(256)),
        draft_tokens=[4],
        disagg_request_id=5,
        ctx_dp_rank=0,
        ctx_info_endpoint="tcp://10.0.0.1:1",
        first_gen_log_probs=[[{}]],
    )
    back = decode_kv_params(encode_kv_params(params))
    assert back == {
        "first_gen_tokens": [1, 2],
        "ctx_request_id": 3,
        "opaque_state": bytes(range(256)),
        "draft_tokens": [4],
        "disagg_request_id": 5,
        "ctx_dp_rank": 0,
        "ctx_info_endpoint": "tcp://10.0.0.1:1",
    }
    for bad in (b"", b"not json", b'{"v": 2, "trtllm": {}}', b'{"v": 1}', b"[1]"):
        with pytest.raises(InvalidRequestError, match="not a trtllm prefill worker's"):
            decode_kv_params(bad)


def test_logit_shaping_is_passed_through_under_trtllm_names():
    import torch

    params = SamplingParams(
        max_tokens=8,
        presence_penalty=0.5,
        frequency_penalty=-0.25,
        repetition_penalty=1.1,
        min_p=0.05,
        logit_bias=((1, 2.0), (3, -1.0)),
    )
    sampling = plan(params).sampling
    assert (
        sampling["presence_penalty"],
        sampling["frequency_penalty"],
        sampling["repetition_penalty"],
        sampling["min_p"],
    ) == (0.5, -0.25, 1.1, 0.05)
    logits = torch.zeros(1, 5)
    sampling["logits_processor"]("r", logits, [[1, 2]], None, None)
    assert logits.tolist() == [[0.0, 2.0, 0.0, -1.0, 0.0]]
    untouched = plan(SamplingParams(max_tokens=8)).sampling
    assert not {"presence_penalty", "min_p", "logits_processor"} & set(untouched)


def test_structured_outputs_pass_through_to_guided_decoding():
    from engines.base.structured import StructuredSpec

    def guided(kind: str, value: str = "") -> dict:
        params = SamplingParams(max_tokens=8, structured=StructuredSpec(kind, value))
        return mapping.sampling_kwargs(params, 8, 0, (2,), 0)["guided_decoding"]

    assert guided("json_object") == {"json_object": True}
    assert guided("json_schema", '{"type": "object"}') == {"json": '{"type": "object"}'}
    assert guided("regex", "a+") == {"regex": "a+"}
    assert guided("choice", '["a.b", "c"]') == {"regex": "a\\.b|c"}
    assert guided("grammar", 'start: "x"') == {"grammar": 'start: "x"'}
