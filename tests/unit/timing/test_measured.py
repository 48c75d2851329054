"""Measured step-time tables: exact at the measured points, linear between and past them; a profile built from a
measurement file runs them; the shipped H100 profile reproduces the H100 measurements."""

import json

import pytest

from engines.timing.measured import decode_table, interp
from engines.timing.profile import ProfileError, TimingProfile, load_profile, profile_from_measurements
from tandem.cli import main

MEASURED = {
    "device": "GPU X",
    "model": "m",
    "prefill_ms": {"100": 10.0, "200": 14.0, "400": 30.0},
    "decode_step_ms": [[1, 100, 5.0], [9, 100, 7.0], [1, 300, 9.0], [9, 300, 15.0]],
}


@pytest.fixture
def measured(tmp_path):
    path = tmp_path / "gpu-x.json"
    path.write_text(json.dumps(MEASURED))
    return path


def test_interp_is_exact_at_points_linear_between_and_extends_the_end_segments():
    points = ((100.0, 10.0), (200.0, 14.0), (400.0, 30.0))
    assert [interp(points, x) for x in (100, 150, 200, 300, 400)] == [10.0, 12.0, 14.0, 22.0, 30.0]
    assert interp(points, 500) == 38.0 and interp(points, 50) == 8.0


def test_decode_table_interpolates_batch_then_context():
    table = decode_table(tuple((float(b), float(c), ms) for b, c, ms in MEASURED["decode_step_ms"]))
    assert table.step_ms(9, 300) == 15.0
    assert table.step_ms(5, 100) == 6.0 and table.step_ms(5, 300) == 12.0
    assert table.step_ms(5, 200) == 9.0  # half-way in both
    assert table.step_ms(5, 50) == 6.0  # below the shortest context: that row
    assert table.step_ms(17, 300) == 21.0  # past the largest batch: the last segment's slope


def test_a_profile_from_measurements_runs_the_tables(measured):
    base = TimingProfile("base", 10, 1000, 16, 400, (0.0, 1.0, 0.0), (0.0, 1.0, 0.0), min_step_ms=2.0)
    p = profile_from_measurements(measured, base, "gpu-x")
    assert p.name == "gpu-x" and p.max_measured_isl == 400.0 and "GPU X" in p.sources[0]
    assert p.prefill_s(200) == pytest.approx(0.014)
    assert p.prefill_s(50) == pytest.approx(0.006)  # half-way from the 2 ms weights pass to 10 ms
    # 5 decodes holding 1,000 tokens (mean context 200): 9 ms; a 200-token chunk adds 14 ms less the weights pass
    assert p.step_s(0, 5, 1000 / p.kv_capacity_tokens) == pytest.approx(0.009)
    assert p.step_s(200, 5, 1000 / p.kv_capacity_tokens) == pytest.approx(0.009 + 0.012)
    assert p.step_s(200, 0, 0.0) == pytest.approx(0.014)
    assert TimingProfile.from_dict(json.loads(json.dumps(p.to_dict()))) == p


def test_bad_measurement_files_are_profile_errors(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"prefill_ms": {"100": 1.0}}))
    with pytest.raises(ProfileError, match="not an engine measurement file"):
        profile_from_measurements(bad, load_profile(), "x")


def test_the_shipped_h100_profile_is_the_measured_h100(capsys):
    p = load_profile("h100-native-llama3.1-8b-bf16")
    assert (p.block_size, p.max_num_seqs, p.max_num_batched_tokens) == (16, 256, 8192)
    assert p.prefill_s(2048) == pytest.approx(0.07036430899998436)  # measured 70.36 ms
    assert p.decode_step_s(128, 128 * 1024) == pytest.approx(0.04207)  # measured 42.07 ms at 128 x 1,024
    assert p.decode_step_s(1, 4096) == pytest.approx(0.033099)
    assert p.max_measured_isl == 8192.0


def test_tandem_sim_builds_and_saves_a_measured_profile(measured, tmp_path, capsys):
    out = tmp_path / "p.json"
    assert (
        main(
            [
                "sim",
                "--profile-from-measured",
                str(measured),
                "--set",
                "num_blocks=500",
                "--set",
                "min_step_ms=2",
                "--save-profile",
                str(out),
            ]
        )
        == 0
    )
    p = load_profile(str(out))
    assert p.name == "gpu-x" and p.num_blocks == 500 and p.min_step_ms == 2.0
    assert p.decode_step_s(9, 9 * 300) == pytest.approx(0.015)
    with pytest.raises(SystemExit, match="expected FIELD=VALUE"):
        main(["sim", "--set", "prefill_ms_points=1", "--save-profile", str(out)])
