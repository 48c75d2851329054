"""`tandem bench engine --speculative`: its rows compare the two engines' throughput and outputs exactly, and the
copy-heavy workload has its texts."""
from tandem.bench.commands import add_bench_commands
from tandem.bench.spec_bench import WORKLOADS, Run, _row, format_table, passages


def test_a_row_compares_throughput_and_outputs():
    plain = Run([[1, 2, 3], [4, 5]], seconds=1.0)
    spec = Run([[1, 2, 3], [4, 5]], seconds=0.5, proposed=8, accepted=6, verify_steps=3)
    row = _row(WORKLOADS[0], plain, spec)
    assert (row["plain_tok_s"], row["spec_tok_s"], row["speedup"]) == (5.0, 10.0, 2.0)
    assert row["identical"] is True
    assert (row["acceptance_rate"], row["mean_accepted_len"]) == (0.75, 2.0)
    assert _row(WORKLOADS[0], plain, Run([[1, 2, 3], [4, 6]], 0.5))["identical"] is False
    table = format_table({"model": "m", "speculative": "ngram", "threads": 1, "repeats": 2, "workloads": [row]})
    assert "2.00x" in table and "True" in table


def test_the_copy_heavy_texts_exist_and_the_flag_parses():
    texts = passages(4)
    assert len(texts) == 4 and all(90 <= len(t.split()) <= 150 for t in texts)
    import argparse

    parser = argparse.ArgumentParser()
    add_bench_commands(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["bench", "engine", "--speculative", "ngram", "--repeats", "1"])
    assert (args.speculative, args.repeats) == ("ngram", 1)
