"""TensorRT-LLM's streamed results (cumulative, the fake release objects) -> tandem's deltas."""

import datetime
from types import SimpleNamespace

from engines.base import FinishReason, TokenLogprob
from engines.trtllm.mapping import RequestPlan, decode_kv_params
from engines.trtllm.outputs import OutputStream
from tests.unit.engines.trtllm.fake_trtllm import CompletionOutput, DisaggregatedParams, Logprob

PLAIN = RequestPlan((1, 2, 3), {}, None)


def result(tokens, finish=None, finished=None, logprobs=None, metrics=None, **out_kw):
    out = CompletionOutput(
        0, token_ids=list(tokens), finish_reason=finish, logprobs=logprobs or [], request_perf_metrics=metrics, **out_kw
    )
    return SimpleNamespace(
        outputs=[out], finished=bool(finish) if finished is None else finished, disaggregated_params=None
    )


def deltas(stream, *results):
    return [o for o in (stream.feed(r) for r in results) if o is not None]


def test_cumulative_results_become_deltas_with_the_users_prompt_length():
    s = OutputStream("r", PLAIN, num_prompt_tokens=3, block_size=16)
    outs = deltas(s, result([10]), result([10]), result([10, 11, 12]), result([10, 11, 12, 13], "length"))
    assert [o.new_token_ids for o in outs] == [(10,), (11, 12), (13,)]
    assert [o.finish_reason for o in outs] == [None, None, FinishReason.LENGTH]
    assert all(o.num_prompt_tokens == 3 and o.req_id == "r" and o.kv_handle == b"" for o in outs) and s.finished


def test_finish_reasons_map_and_unknown_ones_are_errors():
    for reason, want in (
        ("stop", FinishReason.STOP),
        ("length", FinishReason.LENGTH),
        ("cancelled", FinishReason.ABORT),
        ("timeout", FinishReason.ERROR),
    ):
        out = OutputStream("r", PLAIN, 3, 16).feed(result([5], reason))
        assert out.finish_reason is want, reason
    out = OutputStream("r", PLAIN, 3, 16).feed(result([5], None, finished=True))
    assert out.finish_reason is FinishReason.ERROR and "finish reason None" in out.error


def test_generation_only_drops_the_prefill_workers_token_and_checks_it():
    plan = RequestPlan((1, 2, 3), {}, {"request_type": "generation_only"}, skip_tokens=(42,), imported=True)
    s = OutputStream("r", plan, 3, 16)
    outs = deltas(s, result([42]), result([42, 7]), result([42, 7, 8], "length"))
    assert [o.new_token_ids for o in outs] == [(7,), (8,)]
    assert all(o.num_cached_tokens == 3 for o in outs)  # the whole prompt's KV came from the prefill worker
    bad = OutputStream("r", plan, 3, 16).feed(result([41, 7]))
    assert bad.finish_reason is FinishReason.ERROR and "not the prefill's [42]" in bad.error


def test_a_context_only_request_ends_prefilled_with_its_params_as_kv_params():
    plan = RequestPlan((1, 2, 3), {}, {"request_type": "context_only"}, holds_kv=True)
    params = DisaggregatedParams(
        request_type="context_only", first_gen_tokens=[9], ctx_request_id=4, opaque_state=b"\x01"
    )
    out = OutputStream("r", plan, 3, 16).feed(result([9], "length", disaggregated_params=params))
    assert out.finish_reason is FinishReason.PREFILLED and out.new_token_ids == (9,)
    assert decode_kv_params(out.kv_handle) == {"first_gen_tokens": [9], "ctx_request_id": 4, "opaque_state": b"\x01"}
    at_result_level = result([9], "length")
    at_result_level.disaggregated_params = params  # where some releases keep them
    assert OutputStream("r", plan, 3, 16).feed(at_result_level).kv_handle == out.kv_handle
    eos_first = OutputStream("r", plan, 3, 16).feed(result([2], "stop", disaggregated_params=params))
    assert eos_first.finish_reason is FinishReason.STOP and eos_first.kv_handle == b""
    missing = OutputStream("r", plan, 3, 16).feed(result([9], "length"))
    assert missing.finish_reason is FinishReason.ERROR and "no disaggregated params" in missing.error


def test_logprobs_of_the_sampled_token_and_the_top_n_by_rank():
    lp = [
        {10: Logprob(-0.1, 1), 3: Logprob(-2.5, 2), 4: Logprob(-3.0, 3)},
        {5: Logprob(-4.0, 7), 11: Logprob(-0.2, 1), 6: Logprob(-1.9, 2)},
    ]
    out = OutputStream("r", PLAIN, 3, 16, top_logprobs=2).feed(result([10, 5], "length", logprobs=lp))
    assert out.logprobs == (
        TokenLogprob(10, -0.1, ((10, -0.1), (3, -2.5))),
        TokenLogprob(5, -4.0, ((11, -0.2), (6, -1.9))),
    )
    plain = OutputStream("r", PLAIN, 3, 16, want_logprobs=True).feed(result([10], logprobs=[-0.5]))
    assert plain.logprobs == (TokenLogprob(10, -0.5),)
    absent = OutputStream("r", PLAIN, 3, 16, want_logprobs=True).feed(result([10], logprobs=[{3: Logprob(-1.0, 1)}]))
    assert absent.finish_reason is FinishReason.ERROR and "no logprob" in absent.error


def test_logprobs_align_with_the_end_when_the_repeated_token_has_none():
    plan = RequestPlan((1,), {}, {"request_type": "generation_only"}, skip_tokens=(42,), imported=True)
    out = OutputStream("r", plan, 1, 16, want_logprobs=True).feed(result([42, 7], logprobs=[-0.7]))
    assert out.new_token_ids == (7,) and out.logprobs == (TokenLogprob(7, -0.7),)


def test_cached_tokens_and_queue_time_come_from_the_request_metrics():
    metrics = SimpleNamespace(
        kv_cache_metrics=SimpleNamespace(num_reused_blocks=2),
        timing_metrics=SimpleNamespace(
            arrival_time=datetime.timedelta(seconds=3), first_scheduled_time=datetime.timedelta(seconds=3.25)
        ),
    )
    out = OutputStream("r", PLAIN, 40, 16).feed(result([5], metrics=metrics))
    assert out.num_cached_tokens == 32 and out.queue_s == 0.25
    capped = OutputStream("r", PLAIN, 20, 16).feed(result([5], metrics=metrics))
    assert capped.num_cached_tokens == 20  # never more than the user's prompt
