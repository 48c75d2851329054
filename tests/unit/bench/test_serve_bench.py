"""`tandem bench serve` wiring without a server: flags to config, specs from a trace, notes, the table."""

import json

import pytest

from tandem.bench.http_client import Endpoint, ModelCard
from tandem.bench.serve_bench import ServeConfig, build_specs, config_from_args
from tandem.bench.serve_report import format_summary
from tandem.bench.serve_stats import RequestRecord, Slo, summarize_serve
from tandem.cli import build_parser


def parse(*argv):
    return build_parser().parse_args(["bench", "serve", "--url", "http://h:1", *argv])


def test_flags_become_a_config_with_slos_in_seconds():
    args = parse(
        "--concurrency",
        "8",
        "--num-requests",
        "20",
        "--isl",
        "64",
        "--osl",
        "32",
        "--slo-ttft",
        "250",
        "--slo-itl",
        "40",
        "--extra-body",
        '{"ignore_eos": true}',
    )
    cfg = config_from_args(args)
    assert (cfg.concurrency, cfg.num_requests, cfg.isl, cfg.osl) == (8, 20, 64, 32)
    assert cfg.slo == Slo(ttft_s=0.25, itl_s=0.04)
    assert cfg.endpoint.extra_body == {"ignore_eos": True} and cfg.endpoint.base_url == "http://h:1"
    assert args.func.__name__ == "cmd_bench_serve"


def test_overhead_is_registered_next_to_serve():
    args = build_parser().parse_args(["bench", "overhead", "--num-requests", "64", "--prefill"])
    assert (args.num_requests, args.prefill, args.concurrency, args.gateway_workers) == (64, True, [1, 16], [1, 2])
    assert args.client == "raw"


@pytest.mark.parametrize(
    "argv, message",
    [
        ((), "--concurrency N, --request-rate R or --trace"),
        (("--concurrency", "0"), "--concurrency must be >= 1"),
        (("--request-rate", "-1"), "--request-rate must be > 0"),
        (("--request-rate", "2", "--trace", "t.jsonl"), "exclude each other"),
    ],
)
def test_bad_load_flags_are_refused(argv, message):
    with pytest.raises(ValueError, match=message):
        config_from_args(parse(*argv))


def test_trace_specs_are_scaled_cut_and_clipped_with_a_note(tmp_path):
    trace = tmp_path / "t.jsonl"
    rows = [
        {"timestamp": 1000 * i, "input_length": 600 if i == 1 else 100, "output_length": 10, "hash_ids": [0, i + 1]}
        for i in range(4)
    ]
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = ServeConfig(Endpoint("http://h:1"), trace=trace, time_scale=0.1, max_requests=3)
    specs, notes = build_specs(cfg, ModelCard("m", max_model_len=512))
    assert [s.arrival_s for s in specs] == pytest.approx([0.0, 0.1, 0.2])
    assert [s.isl + s.osl <= 512 for s in specs] == [True] * 3 and specs[1].isl < 600
    assert any("1 of 3 trace rows" in n for n in notes) and any("no --tokenizer" in n for n in notes)


def test_synthetic_specs_note_a_context_overflow():
    cfg = ServeConfig(Endpoint("http://h:1"), concurrency=2, num_requests=3, isl=500, osl=100)
    specs, notes = build_specs(cfg, ModelCard("m", max_model_len=512))
    assert [s.arrival_s for s in specs] == [None] * 3
    assert any("exceeds the context" in n for n in notes)


def test_table_shows_counts_rates_and_slos():
    records = [
        RequestRecord(0.0, [0.1, 0.2], end_s=0.2, num_output_tokens=2),
        RequestRecord(0.0, [], end_s=0.1, error="HTTP 500: oops"),
    ]
    text = format_summary(summarize_serve(records, Slo(ttft_s=0.2)), Slo(ttft_s=0.2))
    assert "2 sent, 1 completed, 1 errors" in text and "TTFT <= 200 ms" in text
    assert "error: HTTP 500: oops" in text and "100.00" in text  # TTFT 100 ms
