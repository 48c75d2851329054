"""The overhead benchmark's in-process side on a real ZeroCostEngine, and its report arithmetic."""
import numpy as np
import pytest

from engines.zero import ZeroCostEngine
from tandem.bench.loadgen import PromptMaker, RequestSpec, run_schedule, synthetic_specs
from tandem.bench.overhead import InProcessSender, OverheadConfig, build_report, format_overhead
from tandem.bench.serve_stats import RequestRecord, summarize_serve


async def test_in_process_sender_stamps_every_token_of_the_zero_engine(tmp_path):
    engine = ZeroCostEngine(str(tmp_path))  # no config.json: the default vocabulary
    await engine.start()
    sender = InProcessSender(engine, PromptMaker(np.arange(100, 200)))
    records = await run_schedule(synthetic_specs(6, isl=16, osl=5), sender.send, max_concurrency=3)
    await engine.shutdown()
    assert all(r.is_ok and r.num_output_tokens == 5 and len(r.chunk_times_s) == 5 for r in records)
    assert engine.stats().num_generated_tokens == 30 and engine.stats().num_prompt_tokens_computed == 96


async def test_in_process_sender_records_engine_refusals(tmp_path):
    engine = ZeroCostEngine(str(tmp_path), max_model_len=8)
    await engine.start()
    record = await InProcessSender(engine, PromptMaker(np.arange(100, 200))).send(RequestSpec(0, None, 16, 2))
    await engine.shutdown()
    assert "InvalidRequestError" in record.error and not record.is_ok


def summary(ttft_s: float, num_tokens: int, duration_s: float):
    """One request: first token after `ttft_s`, `num_tokens` chunks evenly to `duration_s`."""
    times = list(np.linspace(ttft_s, duration_s, num_tokens))
    return summarize_serve([RequestRecord(0.0, times, end_s=duration_s, num_output_tokens=num_tokens)])


def test_report_subtracts_p50_ttft_and_checks_both_targets():
    cfg = OverheadConfig()
    report = build_report(cfg, summary(0.001, 100, 0.01), summary(0.003, 100, 0.004))
    assert report["added_ttft_p50_s"] == pytest.approx(0.002) and report["is_added_ttft_met"]
    assert report["relay_tokens_per_s"] == pytest.approx(25_000) and report["is_relay_met"]
    slow = build_report(cfg, summary(0.001, 100, 0.01), summary(0.0045, 100, 0.01))
    assert not slow["is_added_ttft_met"] and not slow["is_relay_met"]  # 3.5 ms added; 10,000 tokens/s
    table = format_overhead(slow)
    assert "TTFT p50 (ms)" in table and "3.50" in table and "NO" in table and "<= 3.00" in table
