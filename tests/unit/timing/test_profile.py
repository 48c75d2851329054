"""TimingProfile: the shipped default loads with the mocker's numbers; bench files fit exact coefficients."""

import json

import pytest

from engines.sim.config import SimOptions
from engines.timing.profile import ProfileError, TimingProfile, load_profile, profile_from_bench


def test_default_profile_has_the_mocker_defaults():
    p = load_profile()
    assert (p.block_size, p.num_blocks, p.max_num_seqs, p.max_num_batched_tokens) == (64, 16384, 256, 8192)
    assert p.prefill_ms_coeffs == (4.21e-7, 0.01518, 16.5)
    assert p.decode_ms_coeffs == (-25.74, 54.01, 5.74)
    assert any("mocker" in s for s in p.sources)
    assert p.prefill_s(1000) == pytest.approx((4.21e-7 * 1e6 + 15.18 + 16.5) / 1e3)
    assert p.decode_s(0.5) == pytest.approx((-25.74 * 0.25 + 27.005 + 5.74) / 1e3)
    assert p.transfer_s(1000) == pytest.approx(1000 * 131072 / 64e9)


def test_decode_step_has_a_floor_and_mixed_steps_add():
    p = TimingProfile("t", 4, 8, 4, 16, (0.0, 1.0, 10.0), (0.0, -100.0, 0.0), min_step_ms=1.0)
    assert p.decode_s(1.0) == 0.001
    assert p.step_s(8, 2, 1.0) == pytest.approx(0.018 + 0.001)
    assert p.step_s(0, 0, 0.0) == 0.0


def test_unknown_profile_names_the_shipped_ones():
    with pytest.raises(ProfileError, match="h100-llama3.1-8b"):
        load_profile("nope")


def test_profile_from_bench_fits_the_points(tmp_path):
    def entry(n, isl, ttft_ms, itl_ms):
        return {
            "num_requests": n,
            "isl": isl,
            "osl": 128,
            "engines": {"native": {"ttft_s_p50": ttft_ms / 1e3, "itl_s_p50": itl_ms / 1e3}},
        }

    # prefill ms = 0.01 t + 5 ; decode ms = 2 + 40 u (u = n * blocks / num_blocks)
    report = {
        "model": "org/m",
        "workloads": {
            "batch1": entry(1, 1024, 15.24, 2.0 + 40 * 17 / 16384),
            "concurrent": entry(8, 512, 45.96, 2.0 + 40 * 8 * 9 / 16384),
        },
    }
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(report))
    p = profile_from_bench(path)
    assert p.prefill_ms_coeffs == pytest.approx((0.0, 0.01, 5.0), abs=1e-9)
    assert p.decode_ms_coeffs == pytest.approx((0.0, 40.0, 2.0), abs=1e-9)
    assert p.name == "bench-org_m" and p.num_blocks == 16384


def test_tandem_sim_saves_a_fitted_profile_that_a_sim_worker_runs(tmp_path, capsys):
    from services.common.engine_factory import engine_spec
    from services.common.worker_settings import WorkerSettings
    from tandem.cli import main

    entry = {"num_requests": 1, "isl": 1024, "osl": 128, "engines": {"native": {"ttft_s_p50": 0.5, "itl_s_p50": 0.02}}}
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"model": "org/m", "workloads": {"batch1": entry}}))
    saved = tmp_path / "profiles" / "mine.json"
    assert main(["sim", "--profile-from-bench", str(bench), "--save-profile", str(saved)]) == 0
    assert f"wrote {saved}" in capsys.readouterr().out
    assert load_profile(str(saved)) == profile_from_bench(bench)
    spec = engine_spec(
        WorkerSettings(
            role="decode", model="m", engine="sim", sim=SimOptions(str(saved), time_factor=0.5), worker_id="decode-3"
        )
    )
    runner = spec.build().runner  # what the worker's engine process builds
    assert (runner.profile.name, runner.time_factor) == ("bench-org_m", 0.5)


def test_tandem_sim_without_a_trace_or_a_profile_to_save_is_an_error(capsys):
    from tandem.cli import main

    with pytest.raises(SystemExit, match="--trace is required"):
        main(["sim"])


def test_a_negative_sim_time_factor_stops_the_worker_at_start_up():
    from services.common.roles import WorkerRole
    from services.common.settings import SettingsError
    from services.common.worker_settings import parse_worker_settings

    with pytest.raises(SettingsError, match="sim_time_factor must be >= 0"):
        parse_worker_settings(WorkerRole.DECODE, ["--model", "m", "--engine", "sim", "--sim-time-factor", "-1"])


def test_speculation_scales_the_decode_part_by_its_cost_over_its_tokens():
    base = load_profile().to_dict()
    plain = TimingProfile.from_dict(base)
    spec = TimingProfile.from_dict({**base, "spec_num_tokens": 4, "spec_acceptance_rate": 0.5, "spec_verify_cost": 0.1})
    factor = 1.4 / (1 + 0.5 + 0.25 + 0.125 + 0.0625)  # 1.4 plain steps' cost for 1.9375 tokens
    assert spec.spec_decode_factor == pytest.approx(factor)
    assert spec.step_s(0, 8, 0.5) == pytest.approx(plain.step_s(0, 8, 0.5) * factor)
    assert spec.step_s(100, 0, 0.5) == plain.step_s(100, 0, 0.5)  # prefill alone: unchanged
    never = TimingProfile.from_dict({**base, "spec_num_tokens": 4, "spec_acceptance_rate": 0.0})
    assert never.spec_decode_factor > 1  # proposals that never land only cost
    assert plain.spec_decode_factor == 1.0
    with pytest.raises(ProfileError, match="spec_acceptance_rate"):
        TimingProfile.from_dict({**base, "spec_acceptance_rate": 1.0})
