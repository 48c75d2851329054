"""The simulator drives the real planner: on a load step it adds replicas (after their start delay) and removes
them after, uses fewer GPU-hours than static peak provisioning, and `tandem sim --planner sla` writes the JSON
with planner / static_peak / static_mean and the PNG."""
import json

import pytest

from engines.sim.profile import load_profile
from services.planner.perf_model import Slo
from services.planner.state_machine import PlannerConfig, RoleBounds
from services.planner.types import WorkerRole
from tandem.bench.traces import TraceRow
from tandem.cli import main
from tandem.sim.planner_sim import PlannerSimConfig, run_all, static_counts
from services.planner.perf_model import PerfModel

PROFILE = load_profile("h100-native-llama3.1-8b-bf16")


def step_trace(low: float = 4.0, high: float = 100.0, phase_s: float = 30.0) -> list[TraceRow]:
    """`low` req/s, then `high` for `phase_s`, then `low` again; 1,000-token prompts, 40-token answers."""
    rows, t = [], 0.0
    for rate in (low, high, low):
        end = t + phase_s
        while t < end:
            rows.append(TraceRow(round(t, 6), 1000, 40))
            t += 1.0 / rate
    return rows


STEP = step_trace()
CONFIG = PlannerSimConfig(PlannerConfig(adjustment_interval_s=4.0, prefill=RoleBounds(1, 8),
                                        decode=RoleBounds(1, 8), predictor="constant", down_stabilization=1),
                          Slo(0.5, 0.05), tick_s=1.0, start_delay_s=2.0, peak_window_s=4.0)


def test_static_counts_size_the_busiest_window_and_the_mean():
    counts = static_counts(STEP, PerfModel(PROFILE, CONFIG.slo, CONFIG.sizing), CONFIG)
    peak, mean = counts["static_peak"], counts["static_mean"]
    assert peak[WorkerRole.PREFILL] > mean[WorkerRole.PREFILL] >= 1 and peak[WorkerRole.DECODE] >= mean[WorkerRole.DECODE]


@pytest.fixture(scope="module")
def runs():
    return run_all(PROFILE, STEP, CONFIG)


def test_the_planner_follows_a_load_step_up_and_down(runs):
    planner = runs["planner"]
    assert planner["num_finished"] == planner["num_requests"] == len(STEP)
    prefill = [(t["t_s"], t["replicas"]["prefill"]) for t in planner["timeline"]]
    during = max(n for t, n in prefill if 30 <= t <= 62)
    assert during > planner["replicas"]["prefill"]  # it added prefill workers for the step ...
    assert prefill[-1][1] < during  # ... and removed them after
    ups = [d for d in planner["decisions"] if d["to"] > d["from"]]
    downs = [d for d in planner["decisions"] if d["to"] < d["from"]]
    assert ups and downs and ups[0]["t_s"] < downs[-1]["t_s"]
    assert planner["peak_replicas"] >= during


def test_it_pays_for_less_than_static_peak_and_serves_better_than_static_mean(runs):
    planner, peak, mean = runs["planner"], runs["static_peak"], runs["static_mean"]
    assert planner["gpu_hours"] < peak["gpu_hours"]
    assert planner["sla_attainment"] > mean["sla_attainment"]
    assert peak["decisions"] == [] and mean["gpu_hours"] < peak["gpu_hours"]
    assert 0 < planner["perfect_foresight_share"] < 1  # the bound a planner without delay or error would reach
    window = max(run["end_s"] for run in runs.values())
    assert peak["window_s"] == planner["window_s"] == window  # every run paid for over the same span
    assert peak["gpu_hours"] == pytest.approx(sum(peak["replicas"].values()) * window / 3600)
    assert peak["gpu_hours_own_end"] == pytest.approx(sum(peak["replicas"].values()) * peak["end_s"] / 3600)


def test_tandem_sim_planner_writes_json_and_plot(tmp_path, capsys):
    trace = tmp_path / "step.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": int(r.arrival_s * 1000), "input_length": r.isl,
                                         "output_length": r.osl, "hash_ids": []}) + "\n" for r in step_trace(high=40.0, phase_s=8.0)))
    out = tmp_path / "planner.json"
    assert main(["sim", "--trace", str(trace), "--planner", "sla", "--slo-ttft-ms", "500", "--slo-itl-ms", "50",
                 "--profile", "h100-native-llama3.1-8b-bf16", "--adjustment-interval-s", "4", "--tick-s", "1",
                 "--start-delay-s", "2", "--predictor", "constant", "--down-stabilization", "1", "--max-prefill", "8",
                 "--max-decode", "8", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "SLA attainment" in printed and "targets:" in printed
    doc = json.loads(out.read_text())
    for name in ("planner", "static_peak", "static_mean"):
        assert {"sla_attainment", "gpu_hours", "peak_replicas", "decisions"} <= doc[name].keys()
    assert doc["planner_config"]["start_delay_s"] == 2.0 and doc["planner_config"]["slo_itl_s"] == 0.05
    assert doc["targets"]["gpu_share_of_static_peak"] == pytest.approx(
        doc["planner"]["gpu_hours"] / doc["static_peak"]["gpu_hours"])
    png = tmp_path / "planner_planner.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
