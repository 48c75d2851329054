"""`tandem bench profile` on a tiny checkpoint: the measurement file has the shape of the shipped H100 file, and
`tandem sim --profile-from-measured` turns it into a profile whose tables are those measurements."""

import json

from engines.timing.profile import load_profile
from tandem.cli import main


def test_bench_profile_measures_the_grid_and_feeds_a_sim_profile(tmp_path, capsys):
    from tandem.models.init import init_model

    model = init_model(tmp_path / "tiny", "llama", tiny=True, seed=0)
    out = tmp_path / "measured.json"
    assert (
        main(
            [
                "bench",
                "profile",
                "--model",
                str(model),
                "--isls",
                "16,48",
                "--batches",
                "1,3",
                "--contexts",
                "16,32",
                "--steps",
                "3",
                "--repeats",
                "1",
                "--threads",
                "1",
                "--max-num-batched-tokens",
                "64",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "prefill 48" in printed and "decode 3 x 32" in printed
    doc = json.loads(out.read_text())
    assert set(doc["prefill_ms"]) == {"16", "48"} and all(ms > 0 for ms in doc["prefill_ms"].values())
    assert [(b, c) for b, c, _ in doc["decode_step_ms"]] == [(1, 16), (3, 16), (1, 32), (3, 32)]
    assert doc["engine"]["max_num_batched_tokens"] == 64 and doc["engine"]["threads"] == 1
    saved = tmp_path / "tiny-profile.json"
    assert main(["sim", "--profile-from-measured", str(out), "--save-profile", str(saved)]) == 0
    profile = load_profile(str(saved))
    assert profile.max_num_batched_tokens == 64 and profile.max_measured_isl == 48
    floor = profile.min_step_ms  # a step never costs less (a fast machine may measure less on a tiny model)
    assert profile.prefill_s(48) * 1e3 == max(doc["prefill_ms"]["48"], floor)
    batch, context, ms = doc["decode_step_ms"][-1]
    assert abs(profile.decode_step_s(batch, batch * context) * 1e3 - max(ms, floor)) < 1e-9
