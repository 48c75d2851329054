"""`tandem bench router` at a tiny size: the index it builds, the decision it times, the report and the CLI."""

import json

import pytest

from engines.base.block_hash import chain_block_hashes
from services.router.types import RouteInput
from tandem.bench.router_bench import RouterBenchConfig, build, format_router_report, run_router_bench
from tandem.bench.router_phases import PHASES
from tandem.cli import main

TINY = RouterBenchConfig(
    num_workers=4, num_indexed_blocks=1000, num_prompt_tokens=256, block_size=16, num_iterations=5, num_inflight=2
)


def test_build_fills_the_index_and_every_worker_holds_a_prefix_of_the_prompt():
    core, index, prompt = build(TINY)
    assert len(index) == 1000 and len(prompt) == 256
    overlap = index.overlap(chain_block_hashes(prompt, 16))
    views = core.registry.views()
    assert [v.worker_id for v in views] == ["decode-000", "decode-001", "decode-002", "decode-003"]
    assert all(0 <= n <= 16 for n in overlap.values())
    assert all(v.num_inflight == 2 for v in views)
    # the decision goes to the cheapest worker by the policy's own scores
    tokens = tuple(prompt)
    best = core.policy.scores(RouteInput("x", "m", tokens), views)[0]
    assert core.route(RouteInput("x", "m", tokens)).decode.worker_id == best.view.worker_id


def test_report_times_every_step_over_the_same_state_and_they_decide_alike():
    report = run_router_bench(TINY)
    assert list(report["steps"]) == ["today", "gateway_hashes", "arrays", "arrays_router_hashes", "arrays_phases"]
    for step in report["steps"].values():
        d = step["decision_us"]
        assert 0 < d["min"] <= d["p50"] <= d["p99"] and step["same_decisions"] is True
    d = report["steps"]["arrays"]["decision_us"]
    assert report["decision_us"] == d and report["final_step"] == "arrays"
    assert report["meets_target"] == (d["p50"] <= 50.0 and d["p99"] <= 100.0)
    assert report["steps"]["today"]["gateway_hash_us"] is None and report["steps"]["arrays"]["gateway_hash_us"]
    assert report["num_indexed_blocks"] == 1000 and report["cold_start"] is None
    phases = report["steps"]["arrays_phases"]["phases_us"]
    assert list(phases) == [name for name, _ in PHASES] and all(p["min"] > 0 for p in phases.values())
    assert report["steps"]["arrays"]["phases_us"] is None and report["steps"]["arrays"]["deferred_us"]
    text = format_router_report(report)
    assert "    compiled_decide" in text
    assert "256-token prompt (blocks of 16), 4 workers, 1,000 indexed blocks, 5 decisions per step" in text
    assert text.splitlines()[-1].endswith("met" if report["meets_target"] else "missed")


def test_the_array_build_holds_the_same_state():
    today, _, prompt = build(TINY)
    arrays, index, _ = build(TINY, arrays=True)
    hashes = chain_block_hashes(prompt, 16)
    depths = index.depths(hashes)
    worker_ids = [f"decode-{i:03d}" for i in range(4)]
    assert {
        w: int(d) for w, d in zip(worker_ids, depths[index.slots_for(worker_ids)]) if d
    } == today.policy.index.overlap(hashes)


def test_cli_writes_json(tmp_path, capsys):
    out = tmp_path / "router.json"
    assert (
        main(
            [
                "bench",
                "router",
                "--workers",
                "2",
                "--indexed-blocks",
                "100",
                "--prompt-tokens",
                "64",
                "--block-size",
                "16",
                "--iterations",
                "3",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    report = json.loads(out.read_text())
    assert report["config"]["num_workers"] == 2 and report["benchmark"] == "router"
    assert "gateway_hashes" in capsys.readouterr().out


def test_the_cold_start_is_reported():
    report = run_router_bench(TINY, ("arrays",))
    report["cold_start"] = {
        "import_s_compile": 1.0,
        "kernels_s_compile": 9.5,
        "cpu_s_compile": 10.0,
        "import_s_cached": 0.9,
        "kernels_s_cached": 0.4,
        "cpu_s_cached": 1.2,
    }
    assert format_router_report(report).splitlines()[-1] == (
        "cold start: kernels compiled in 9.50 s (empty numba cache), loaded from the cache in 0.40 s (import 0.90 s)"
    )


def test_bad_config_is_refused():
    with pytest.raises(ValueError):
        RouterBenchConfig(num_workers=0)
