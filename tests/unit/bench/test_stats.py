"""Percentiles, delta spreading and run summaries on hand-made timings."""

import math

import pytest

from tandem.bench.stats import RequestTrace, percentile, summarize


def test_percentile_interpolates_linearly():
    assert percentile([4.0, 1.0, 3.0, 2.0], 50) == pytest.approx(2.5)
    assert percentile([1.0, 2.0, 3.0, 4.0], 90) == pytest.approx(3.7)
    assert percentile([5.0], 99) == 5.0
    assert math.isnan(percentile([], 50))


def test_multi_token_delta_is_spread_over_the_gap():
    trace = RequestTrace(submit_s=0.0)
    trace.add_arrival(1.0, 1)
    trace.add_arrival(2.0, 2)
    trace.add_arrival(2.5, 1)
    trace.add_arrival(3.0, 0)  # a finish-only delta carries no token
    assert trace.token_times_s == pytest.approx([1.0, 1.5, 2.0, 2.5])
    assert trace.ttft_s == 1.0
    assert trace.itls_s == pytest.approx([0.5, 0.5, 0.5])


def test_first_delta_tokens_arrive_together():
    trace = RequestTrace(submit_s=0.5)
    trace.add_arrival(1.0, 3)
    assert trace.token_times_s == [1.0, 1.0, 1.0]
    assert trace.ttft_s == 0.5


def test_summarize_exact():
    a = RequestTrace(0.0, [1.0, 2.0, 3.0])  # ttft 1, gaps 1, 1
    b = RequestTrace(1.0, [1.5, 3.5, 5.0])  # ttft 0.5, gaps 2, 1.5
    s = summarize([a, b])
    assert (s.num_requests, s.num_output_tokens, s.wall_s) == (2, 6, 5.0)
    assert s.output_tokens_per_s == pytest.approx(6 / 5.0)
    assert s.ttft_s_p50 == pytest.approx(0.75)
    assert s.itl_s_p50 == pytest.approx(1.25)  # pooled gaps 1, 1, 1.5, 2
    assert s.decode_tokens_per_s == pytest.approx((2 / 2.0 + 2 / 3.5) / 2)


def test_summarize_rejects_a_request_without_tokens():
    with pytest.raises(ValueError):
        summarize([RequestTrace(0.0, [1.0]), RequestTrace(0.0)])
