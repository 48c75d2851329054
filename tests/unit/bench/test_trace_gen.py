"""The synthetic traces: a seed fixes every row; the diurnal load swings and bursts, the constant one does not;
llm-d's precise-prefix shape shares each tenant's whole context and repeats each user's question, nothing else;
`tandem bench traces` writes rows `tandem sim` reads back."""

import json
import statistics

import pytest

from tandem.bench.trace_gen import PrefixShape, constant_load, diurnal_bursty, precise_prefix
from tandem.bench.traces import MOONCAKE_BLOCK_SIZE, load_trace
from tandem.cli import main


def per_minute(rows, seconds: float) -> list[int]:
    counts = [0] * int(seconds // 60)
    for r in rows:
        counts[min(int(r.arrival_s // 60), len(counts) - 1)] += 1
    return counts


def test_a_seed_fixes_every_row_and_another_seed_changes_them():
    assert diurnal_bursty(3, seconds=600) == diurnal_bursty(3, seconds=600)
    assert diurnal_bursty(3, seconds=600) != diurnal_bursty(4, seconds=600)


def test_the_diurnal_load_swings_from_trough_to_peak_and_the_constant_one_holds():
    day = per_minute(diurnal_bursty(1, seconds=1800, mean_rate=4.0, period_s=1800, bursts_per_hour=0), 1800)
    assert day[len(day) // 2] > 3 * day[0]  # the trough at the start, the peak half a period later
    flat = per_minute(constant_load(1, seconds=1800, rate=4.0), 1800)
    assert statistics.mean(flat) == pytest.approx(240, rel=0.05) and max(flat) < 1.5 * min(flat)


def test_bursts_raise_the_rate_where_they_fall():
    calm = diurnal_bursty(5, seconds=3600, mean_rate=4.0, amplitude=0.0, bursts_per_hour=0)
    bursty = diurnal_bursty(5, seconds=3600, mean_rate=4.0, amplitude=0.0, bursts_per_hour=6, burst_factor=3.0)
    assert max(per_minute(bursty, 3600)) > 2 * max(per_minute(calm, 3600))


def test_every_prompt_has_its_own_blocks_unless_the_shape_shares_them():
    rows = diurnal_bursty(2, seconds=300)
    ids = [i for r in rows for i in r.hash_ids]
    assert len(ids) == len(set(ids)) and all(len(r.hash_ids) == -(-r.isl // MOONCAKE_BLOCK_SIZE) for r in rows)


def test_the_precise_prefix_shape_shares_each_tenants_context_and_repeats_each_users_question():
    shape = PrefixShape.uniform((5.0, 20.0), 30.0, num_tenants=10)
    rows = precise_prefix(7, shape)
    ctx = shape.context_tokens // MOONCAKE_BLOCK_SIZE
    contexts = {r.hash_ids[:ctx] for r in rows}
    assert len(contexts) == 10 and all(r.isl == 6144 + 1200 and r.osl == 245 for r in rows)
    prompts = {r.hash_ids for r in rows}
    assert len(prompts) == 10 * 5  # 750 requests over 50 (tenant, user) prompts: every one is sent again
    questions = {r.hash_ids[ctx:] for r in rows}
    assert len(questions) == 50 and not {i for q in questions for i in q} & {i for c in contexts for i in c}
    first = sum(1 for r in rows if r.arrival_s < 30.0)
    assert first == pytest.approx(150, rel=0.25) and len(rows) - first == pytest.approx(600, rel=0.15)


def test_the_default_shape_is_llm_ds_published_load():
    shape = PrefixShape()
    assert shape.stages[0] == (15.0, 50.0) and shape.num_warmup_stages == 1  # the warm-up seats the residents
    assert shape.qps[1:] == (3, 10, 15, 20, 22, 25, 30, 35, 40, 43, 46, 49, 52, 55, 57, 60)
    assert shape.stage_starts()[-1] == 502.0
    assert shape.resident_tokens() == 150 * (6144 + 5 * 1200)  # llm-d: 150 x 12,000, 73% of 8 x 307,328
    rows = precise_prefix(0, shape)
    assert len(rows) == pytest.approx(17084, rel=0.03) and rows[-1].arrival_s < 502.0


def test_tandem_bench_traces_writes_what_tandem_sim_reads(tmp_path, capsys):
    out = tmp_path / "pp.jsonl"
    assert (
        main(["bench", "traces", "precise-prefix", "--seed", "1", "--qps", "2,4", "--stage-s", "10", "--out", str(out)])
        == 0
    )
    assert "wrote" in capsys.readouterr().out
    rows = load_trace(out)
    assert rows == precise_prefix(1, PrefixShape.uniform((2.0, 4.0), 10.0))  # ms timestamps round-trip
    assert json.loads(out.read_text().splitlines()[0]).keys() == {
        "timestamp",
        "input_length",
        "output_length",
        "hash_ids",
    }
    with pytest.raises(SystemExit, match="--qps"):
        main(["bench", "traces", "precise-prefix", "--qps", "2,x", "--out", str(out)])
    with pytest.raises(SystemExit, match="amplitude"):
        main(["bench", "traces", "diurnal", "--amplitude", "1.5", "--out", str(out)])
