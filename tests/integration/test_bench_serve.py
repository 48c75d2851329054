"""`tandem bench serve` as a user runs it: the CLI against a real zero-engine stack (gateway, router, decode
worker on loopback), synthetic closed-loop load and a Mooncake trace, checked through the JSON it writes."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.conftest import running_stack

REPO = Path(__file__).resolve().parents[2]
SUMMARY_FIELDS = {
    "num_requests",
    "num_completed",
    "num_errors",
    "duration_s",
    "num_output_tokens",
    "requests_per_s",
    "output_tokens_per_s",
    "goodput_requests_per_s",
    "num_good",
    "ttft_s",
    "itl_s",
    "mean_itl_s",
    "e2e_s",
    "first_errors",
}


@pytest.fixture(scope="module")
def zero_stack(tiny_stack_model, tmp_path_factory):
    with running_stack(tiny_stack_model, tmp_path_factory.mktemp("bench-serve"), engine="zero", num_prefill=0) as stack:
        yield stack


def bench_serve(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tandem.cli", "bench", "serve", *argv],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_closed_loop_run_reports_every_request(zero_stack, tiny_stack_model, tmp_path):
    out = tmp_path / "serve.json"
    run = bench_serve(
        "--url",
        zero_stack.url,
        "--tokenizer",
        str(tiny_stack_model),
        "--concurrency",
        "4",
        "--num-requests",
        "20",
        "--isl",
        "32",
        "--osl",
        "16",
        "--slo-ttft",
        "60000",
        "--slo-itl",
        "60000",
        "--json",
        str(out),
    )
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads(out.read_text())
    s = report["summary"]
    assert set(s) == SUMMARY_FIELDS
    assert (s["num_requests"], s["num_completed"], s["num_errors"], s["num_good"]) == (20, 20, 0, 20)
    assert s["num_output_tokens"] == 20 * 16  # the zero engine never stops early
    assert 0 < s["ttft_s"]["p50"] <= s["ttft_s"]["p90"] <= s["ttft_s"]["p99"] <= s["e2e_s"]["p99"]
    assert s["output_tokens_per_s"] > 0 and s["goodput_requests_per_s"] == pytest.approx(s["requests_per_s"])
    assert (report["model"], report["max_model_len"]) == (tiny_stack_model.name, 512)
    assert "TTFT" in run.stdout and "goodput" in run.stdout


def test_mooncake_trace_is_replayed_clipped_to_the_context(zero_stack, tiny_stack_model, tmp_path):
    trace, out = tmp_path / "trace.jsonl", tmp_path / "trace-run.json"
    rows = [
        {
            "timestamp": 1000 * i,
            "input_length": 700 if i % 2 else 40,
            "output_length": 8,
            "hash_ids": [0, i + 1] if i % 2 else [0],
        }
        for i in range(6)
    ]
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = bench_serve(
        "--url",
        zero_stack.url,
        "--tokenizer",
        str(tiny_stack_model),
        "--trace",
        str(trace),
        "--time-scale",
        "0.01",
        "--max-requests",
        "5",
        "--json",
        str(out),
    )
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads(out.read_text())
    assert (report["summary"]["num_requests"], report["summary"]["num_errors"]) == (5, 0)
    assert report["notes"] == ["2 of 5 trace rows scaled down in proportion to fit the context of 512 tokens"]
    # Arrivals span 4 s x 0.01 = 40 ms, measured from the first submit (which may itself start a little late).
    assert 0.03 <= report["summary"]["duration_s"] < 2.0


def test_overhead_runs_every_phase_with_the_same_load(tmp_path):
    out = tmp_path / "overhead.json"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "tandem.cli",
            "bench",
            "overhead",
            "--num-requests",
            "8",
            "--concurrency",
            "1",
            "2",
            "--gateway-workers",
            "1",
            "2",
            "--isl",
            "16",
            "--osl",
            "8",
            "--warmup",
            "1",
            "--json",
            str(out),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads(out.read_text())
    phases = {(p["concurrency"], p["gateway_workers"]): p for p in report["phases"]}
    assert sorted(phases) == [(1, 0), (1, 1), (2, 0), (2, 1), (2, 2)]
    for (concurrency, workers), p in phases.items():
        s = p["summary"]
        n = 8 if concurrency > 1 else 2
        assert (s["num_completed"], s["num_errors"], s["num_output_tokens"]) == (n, 0, 8 * n)
        if workers:  # every process of the stack and the client were measured
            assert set(p["cpu_s"]) == {"router", "decode-0", "gateway", "client"}
    assert sum(p["cpu_s"]["gateway"] for p in phases.values() if p["gateway_workers"]) > 0  # in 10 ms ticks
    names = [t["name"] for t in report["targets"]]
    assert names == [
        "added TTFT p50, concurrency 1",
        "relay, concurrency 2, 1 gateway",
        "relay 2 gateways / 1, concurrency 2",
    ]
    added = report["targets"][0]["value"]
    ttft_p50 = {key: p["summary"]["ttft_s"]["p50"] for key, p in phases.items()}
    assert added == pytest.approx(ttft_p50[(1, 1)] - ttft_p50[(1, 0)])
    assert report["host"]["cores"] >= 1 and "target" in run.stdout and "load avg" in run.stdout


def test_structured_runs_plain_and_json_schema_and_reads_the_mask_time(tiny_stack_model, tmp_path):
    """A native stack (random weights: a grammar holds whatever the model prefers): both modes at two
    concurrencies in two rounds that alternate which goes first, every constrained token masked once, the plain rows
    never."""
    out = tmp_path / "structured.json"
    with running_stack(tiny_stack_model, tmp_path, num_prefill=0) as stack:
        run = bench_serve(
            "--url",
            stack.url,
            "--tokenizer",
            str(tiny_stack_model),
            "--structured",
            "--structured-concurrency",
            "1,3",
            "--num-requests",
            "3",
            "--isl",
            "16",
            "--osl",
            "12",
            "--structured-rounds",
            "2",
            "--metrics-url",
            stack.metrics_urls["decode-0"],
            "--json",
            str(out),
        )
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads(out.read_text())
    rows = [
        (r["concurrency"], r["round"], r["json_schema"], r["num_completed"], r["num_errors"]) for r in report["rows"]
    ]
    assert rows == [
        (c, i, js, 3, 0) for c in (1, 3) for i, order in enumerate(((False, True), (True, False))) for js in order
    ]
    for row in report["rows"]:
        assert row["num_output_tokens"] == 3 * 12  # ignore_eos: every request makes --osl tokens
        assert row["num_masks"] == (row["num_output_tokens"] if row["json_schema"] else 0)
        if row["json_schema"]:
            assert row["mask_s_per_token"] > 0 and row["wait_s_per_token"] >= 0
        else:
            assert row["mask_s_per_token"] is None  # no mask made: no cost per token (NaN, written as null)
    assert set(report["ratios"]) == {"1", "3"} and all(v > 0 for v in report["ratios"].values())
    assert [len(report["round_ratios"][c]) for c in ("1", "3")] == [2, 2]
    assert report["schema"]["properties"]["story"]["minLength"] == 16 * 12
    assert "mask µs/token" in run.stdout and "ITL p50 ratio" in run.stdout
