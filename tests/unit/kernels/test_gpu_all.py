"""bench/gpu_all.sh end to end on CPU (its dry run: every section's code path at tiny sizes, real processes,
one JSON and the target table), and its report's verdicts when a section fails or runs out of time."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import gpu_all_report

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.timeout(1600)  # five sections of real processes; minutes on a shared 2-core machine
def test_dry_run_runs_every_section_and_writes_one_json_and_the_table(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # each section sets up its own
    env |= {"OUT": str(tmp_path), "PYTHON": sys.executable, "TANDEM_GPU_DRY_RUN": "1"}
    proc = subprocess.run(
        ["bash", str(ROOT / "bench" / "gpu_all.sh")], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((tmp_path / "gpu-all.json").read_text())
    assert data["dry_run"] and data["device"] == "cpu"
    assert {n: (s["rc"], s["timed_out"]) for n, s in data["sections"].items()} == {
        n: (0, False) for n in gpu_all_report.SECTIONS
    }, (tmp_path / "gpu-all.log").read_text()[-3000:]
    names = [t["target"] for t in data["targets"]]
    assert len(names) == 8 + 8 and len(set(names)) == len(names)  # gpu_engine's 8, then serving, P/D, tiers, tests
    assert all(t["measured"] is not None for t in data["targets"]), data["targets"]
    assert data["sections"]["pytest_gpu"]["data"]["tests"] > 0  # collected (and skipped: no CUDA here)
    table = (tmp_path / "gpu-all.md").read_text()
    assert table.startswith("DRY RUN") and "| P/D KV import GB/s |" in table
    assert set(os.listdir(tmp_path)) == {"gpu-all.json", "gpu-all.md", "gpu-all.log"}  # $OUT takes 8 files at most


def test_a_failed_or_timed_out_section_is_reported_not_measured(tmp_path):
    rows = [
        {"section": "serve", "rc": 124, "seconds": 75, "limit_s": 75},
        {"section": "kv_tiers", "rc": 0, "seconds": 3, "limit_s": 25},
        {"section": "pd", "rc": 1, "seconds": 9, "limit_s": 75},
    ]
    (tmp_path / "sections.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "kv_tiers.json").write_text(
        json.dumps({"copy": {"g1_to_g2_gb_per_s": 41.0, "g2_to_g1_gb_per_s": 12.5}})
    )
    by_name = {t["target"]: t for t in gpu_all_report.targets(gpu_all_report.load_sections(tmp_path))}
    assert by_name["serving / in-process engine, output tok/s"]["note"] == "section timed out (75 s)"
    assert by_name["P/D KV import GB/s"]["note"] == "section failed (exit 1)"
    assert by_name["pytest -m gpu: failures"]["note"] == "section did not run"
    assert by_name["host tier G1 -> G2 GB/s"]["met"] is True and by_name["host tier G2 -> G1 GB/s"]["met"] is False
    table = gpu_all_report.render(gpu_all_report.load_sections(tmp_path), list(by_name.values()))
    assert "| serve | 124 (timeout) | 75 | 75 |" in table and "not measured: section failed (exit 1)" in table


def test_sections_named_in_the_skip_list_do_not_run(tmp_path):
    """A rerun on a lent GPU leaves out what it has already measured (TANDEM_GPU_SKIP): those read 'did not run'."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    skip = " ".join(gpu_all_report.SECTIONS)
    env |= {"OUT": str(tmp_path), "PYTHON": sys.executable, "TANDEM_GPU_DRY_RUN": "1", "TANDEM_GPU_SKIP": skip}
    proc = subprocess.run(
        ["bash", str(ROOT / "bench" / "gpu_all.sh")], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert "skipped (TANDEM_GPU_SKIP)" in proc.stderr, proc.stderr[-3000:]
    data = json.loads((tmp_path / "gpu-all.json").read_text())
    assert all(s["rc"] is None for s in data["sections"].values()), data["sections"]
    assert all(t["met"] is None and "did not run" in t["note"] for t in data["targets"]), data["targets"]


def test_the_engine_bench_saves_its_report_after_each_row():
    """A section stopped at its time limit keeps the rows it measured (gpu_engine.Report calls save on each add)."""
    from bench.gpu_engine import Report

    saved = []
    report = Report(save=lambda r: saved.append(len(r.rows)))
    report.add("decode batch 1", "weights=bfloat16", 190.0, "tok/s", 280.0)
    report.add("prefill", "2048 tokens", 9.7e4, "tok/s", 4.8e4)
    assert saved == [1, 2]
