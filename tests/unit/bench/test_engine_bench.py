"""`tandem bench engine` end to end on a tiny model: CLI wiring, the JSON document, the table."""

import argparse
import json

import pytest

from tandem.bench import commands, engine_bench, native_runner
from tests.unit.bench.conftest import FakeEngine

ENGINE_KEYS = {"output_tokens_per_s", "ttft_s_p50", "itl_s_p50", "roofline_fraction"}


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="tandem")
    commands.add_bench_commands(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)


def test_cli_defaults():
    args = parse(["bench", "engine", "--model", "/m"])
    assert args.func is commands.run_bench_engine
    assert (args.num_requests, args.isl, args.osl, args.dtype) == (32, 128, 128, "float32")
    assert args.threads >= 1 and args.json is None


def test_cli_rejects_unknown_engines(bench_llama):
    with pytest.raises(SystemExit):
        engine_bench.cmd_bench_engine(parse(["bench", "engine", "--model", str(bench_llama), "--engines", "vllm"]))


def test_bench_writes_the_json_document(bench_llama, tmp_path, monkeypatch, fast_roofline, capsys):
    fakes: list[FakeEngine] = []
    monkeypatch.setattr(native_runner, "make_engine", lambda *a, **k: fakes.append(FakeEngine()) or fakes[-1])
    # in this process, so the fake is the engine that runs (the real runs use a fresh process each)
    monkeypatch.setattr(engine_bench, "_in_fresh_process", lambda fn, *args: fn(*args))
    out = tmp_path / "out" / "engine.json"
    argv = [
        "bench",
        "engine",
        "--model",
        str(bench_llama),
        "--num-requests",
        "3",
        "--isl",
        "8",
        "--osl",
        "5",
        "--threads",
        "1",
        "--dtype",
        "bfloat16",
        "--json",
        str(out),
    ]
    assert engine_bench.cmd_bench_engine(parse(argv)) == 0

    report = json.loads(out.read_text())
    assert (report["dtype"], report["threads"]) == ("bfloat16", 1)
    assert "model.generate" in report["transformers_mode"]
    assert set(report["workloads"]) == {"concurrent", "batch1"}
    for name, num_requests in (("concurrent", 3), ("batch1", 1)):
        entry = report["workloads"][name]
        assert (entry["num_requests"], entry["isl"], entry["osl"]) == (num_requests, 8, 5)
        assert entry["roofline"]["m"] == num_requests and entry["roofline"]["gemm_flops_per_s"] > 0
        for engine in ("native", "transformers"):
            assert ENGINE_KEYS <= set(entry["engines"][engine])
            assert entry["engines"][engine]["num_output_tokens"] == num_requests * 5
        ratio = entry["ratio_native_over_transformers"]
        native, hf = entry["engines"]["native"], entry["engines"]["transformers"]
        assert ratio["output_tokens_per_s"] == pytest.approx(native["output_tokens_per_s"] / hf["output_tokens_per_s"])
    # warm-up plus the two timed workloads, all on one engine
    assert [r.req_id for r in fakes[0].requests][-4:] == ["concurrent0", "concurrent1", "concurrent2", "batch10"]
    table = capsys.readouterr().out
    assert "dtype: bfloat16 (both engines)" in table and "roofline fraction" in table


def test_bench_with_one_engine_has_no_ratio(bench_llama, fast_roofline):
    cfg = engine_bench.BenchConfig(bench_llama, threads=1, num_requests=2, isl=4, osl=3, engines=("transformers",))
    report = engine_bench.run_bench(cfg)
    entry = report["workloads"]["concurrent"]
    assert set(entry["engines"]) == {"transformers"}
    assert set(entry["ratio_native_over_transformers"].values()) == {None}


def test_bench_runs_the_real_native_engine(bench_llama, fast_roofline):
    pytest.importorskip("engines.native.runner")
    cfg = engine_bench.BenchConfig(bench_llama, threads=1, num_requests=4, isl=16, osl=16, engines=("native",))
    entry = engine_bench.run_bench(cfg)["workloads"]["concurrent"]
    assert entry["engines"]["native"]["num_output_tokens"] == 4 * 16
