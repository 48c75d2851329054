"""`tandem bench engine --speculative`: its rows compare alternated runs of the two engines (median speedup and its
spread) and their outputs exactly, sampled workloads are seeded, and the copy-heavy workload has its texts."""

import argparse

import pytest

from tandem.bench.commands import add_bench_commands
from tandem.bench.spec_bench import WORKLOADS, params_for, passages
from tandem.bench.spec_report import Run, format_table, row


def test_a_row_takes_the_median_of_alternated_pairs_and_compares_outputs():
    plain = [Run([[1, 2, 3], [4, 5]], seconds=s) for s in (1.0, 1.0, 2.0)]
    spec = [Run([[1, 2, 3], [4, 5]], seconds=s, proposed=8, accepted=6, verify_steps=3) for s in (0.5, 1.0, 1.0)]
    r = row(WORKLOADS["copy"], plain, spec)
    assert (r["plain_tok_s"], r["spec_tok_s"]) == (5.0, 5.0)
    assert (r["speedup"], r["speedup_min"], r["speedup_max"]) == (2.0, 1.0, 2.0)
    assert r["identical"] is True
    assert (r["acceptance_rate"], r["mean_accepted_len"]) == (0.75, 2.0)
    other = [Run([[1, 2, 3], [4, 6]], 0.5)] * 3
    assert row(WORKLOADS["copy"], plain, other)["identical"] is False
    table = format_table({"model": "m", "speculative": "ngram", "threads": 1, "repeats": 3, "workloads": [r]})
    assert "2.00x" in table and "1.00-2.00" in table and "True" in table


def test_sampled_workloads_are_seeded_per_request_and_not_compared_token_for_token():
    w = WORKLOADS["sampled"]
    first, second = params_for(w, 0), params_for(w, 1)
    assert (first.seed, second.seed, first.temperature, first.ignore_eos) == (0, 1, 0.8, True)
    assert params_for(WORKLOADS["chat"], 3).is_greedy
    plain, spec = [Run([[1, 2]], 1.0)], [Run([[3, 4]], 1.0)]
    assert row(w, plain, spec)["identical"] is None


def test_the_copy_heavy_texts_exist_and_the_flags_parse():
    texts = passages(4)
    assert len(texts) == 4 and all(90 <= len(t.split()) <= 150 for t in texts)
    parser = argparse.ArgumentParser()
    add_bench_commands(parser.add_subparsers(dest="command"))
    args = parser.parse_args(
        ["bench", "engine", "--speculative", "draft:/m", "--repeats", "1", "--spec-workloads", "sampled,sampled32"]
    )
    assert (args.speculative, args.repeats, args.spec_workloads) == ("draft:/m", 1, "sampled,sampled32")


def test_a_bad_speculative_value_or_workload_fails_before_loading(tmp_path):
    from tandem.bench.spec_bench import cmd_bench_spec

    args = argparse.Namespace(speculative="eagle", spec_workloads="copy")
    with pytest.raises(ValueError, match="speculative method"):
        cmd_bench_spec(args)
    with pytest.raises(SystemExit, match="unknown --spec-workloads"):
        cmd_bench_spec(argparse.Namespace(speculative="ngram", spec_workloads="copy,nope"))
