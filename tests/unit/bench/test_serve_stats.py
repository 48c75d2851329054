"""Per-request timing and the serving summary on hand-made records: percentiles, rates, goodput, errors."""

import math

import pytest

from tandem.bench.serve_stats import Distribution, RequestRecord, Slo, summarize_serve


def record(submit, chunks, tokens=None, end=None, error=None) -> RequestRecord:
    return RequestRecord(
        submit_s=submit,
        chunk_times_s=list(chunks),
        end_s=chunks[-1] if end is None else end,
        num_output_tokens=len(chunks) if tokens is None else tokens,
        error=error,
    )


def test_record_ttft_chunk_gaps_and_mean_itl():
    r = record(1.0, [1.1, 1.3, 1.4], tokens=5, end=1.5)
    assert r.ttft_s == pytest.approx(0.1)
    assert r.itls_s == pytest.approx([0.2, 0.1])
    assert r.mean_itl_s == pytest.approx(0.3 / 4)  # first to last chunk over the 4 tokens after the first
    assert r.e2e_s == pytest.approx(0.5)
    assert record(0.0, [0.2]).mean_itl_s == 0.0  # one token: no gap


def test_a_record_without_chunks_or_with_an_error_is_not_ok():
    assert not RequestRecord(submit_s=0.0, end_s=1.0).is_ok
    assert not record(0.0, [0.1], error="HTTP 500").is_ok
    assert record(0.0, [0.1]).is_ok


def test_distribution_mean_and_percentiles():
    d = Distribution.of([1.0, 2.0, 3.0, 4.0])
    assert (d.mean, d.p50) == (2.5, 2.5)
    assert d.p90 == pytest.approx(3.7) and d.p99 == pytest.approx(3.97)
    assert math.isnan(Distribution.of([]).p50)


def test_summary_rates_over_first_submit_to_last_end():
    records = [
        record(0.0, [0.1, 0.2, 0.3]),
        record(0.5, [0.7, 0.8], end=2.0),
        RequestRecord(submit_s=1.0, end_s=1.2, error="HTTP 503: busy"),
    ]
    s = summarize_serve(records)
    assert (s.num_requests, s.num_completed, s.num_errors) == (3, 2, 1)
    assert s.duration_s == 2.0
    assert s.num_output_tokens == 5
    assert s.requests_per_s == 1.0 and s.output_tokens_per_s == 2.5
    assert s.ttft_s.p50 == pytest.approx(0.15)  # 0.1 and 0.2
    assert (s.itl_s.p50, s.itl_s.p99) == (pytest.approx(0.1), pytest.approx(0.1))  # gaps 0.1, 0.1 and 0.1
    assert s.e2e_s.mean == pytest.approx((0.3 + 1.5) / 2)
    assert s.first_errors == ("HTTP 503: busy",)
    assert s.num_good == 2 and s.goodput_requests_per_s == 1.0  # no SLO: every completed request counts


def test_goodput_counts_requests_within_both_slos():
    fast = record(0.0, [0.05, 0.06, 0.07])  # TTFT 50 ms, mean ITL 10 ms
    slow_start = record(0.0, [0.5, 0.51, 0.52])  # TTFT 500 ms
    slow_tokens = record(0.0, [0.05, 0.25, 0.45])  # mean ITL 200 ms
    failed = record(0.0, [0.01], error="boom")
    s = summarize_serve([fast, slow_start, slow_tokens, failed], Slo(ttft_s=0.1, itl_s=0.05))
    assert s.num_good == 1
    assert s.goodput_requests_per_s == pytest.approx(1 / 0.52)
    assert summarize_serve([fast, slow_start, slow_tokens], Slo(ttft_s=0.1)).num_good == 2
    assert summarize_serve([fast, slow_start, slow_tokens], Slo(itl_s=0.05)).num_good == 2


def test_an_empty_run_summarizes_to_nothing_without_dividing_by_zero():
    s = summarize_serve([])
    assert (s.num_requests, s.duration_s) == (0, 0.0)
    assert math.isnan(s.requests_per_s) and math.isnan(s.ttft_s.p50)
