"""Trace loaders on hand-written Mooncake and Azure files: parsing, format detection, time scale, clipping."""

import json

import pytest

from tandem.bench.traces import TraceError, TraceRow, clip_all, clip_to_context, detect_format, load_trace

MOONCAKE_ROWS = [
    {"timestamp": 0, "input_length": 700, "output_length": 10, "hash_ids": [0, 1]},
    {"timestamp": 0, "input_length": 300, "output_length": 20, "hash_ids": [0]},
    {"timestamp": 3001, "input_length": 1100, "output_length": 30, "hash_ids": [0, 1, 5]},
]
AZURE_CSV = (
    "TIMESTAMP,ContextTokens,GeneratedTokens\n"
    "2023-11-16 18:15:46.6805900,374,44\n"
    "2023-11-16 18:15:50.9951690,396,109\n"
    "2023-11-16 18:16:01,5,7\n"
)


@pytest.fixture
def mooncake(tmp_path):
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in MOONCAKE_ROWS) + "\n")  # a trailing blank line
    return path


@pytest.fixture
def azure(tmp_path):
    path = tmp_path / "trace.csv"
    path.write_text(AZURE_CSV)
    return path


def test_mooncake_rows_keep_lengths_hashes_and_seconds(mooncake):
    rows = load_trace(mooncake)
    assert rows == [TraceRow(0.0, 700, 10, (0, 1)), TraceRow(0.0, 300, 20, (0,)), TraceRow(3.001, 1100, 30, (0, 1, 5))]


def test_azure_times_are_relative_to_the_first_row_with_seven_digit_fractions(azure):
    rows = load_trace(azure)
    assert [r.arrival_s for r in rows] == pytest.approx([0.0, 4.314579, 14.31941])
    assert [(r.isl, r.osl, r.hash_ids) for r in rows] == [(374, 44, ()), (396, 109, ()), (5, 7, ())]


def test_time_scale_multiplies_every_arrival_and_max_requests_cuts(mooncake, azure):
    assert [r.arrival_s for r in load_trace(mooncake, time_scale=0.5)] == pytest.approx([0.0, 0.0, 1.5005])
    assert [r.arrival_s for r in load_trace(azure, max_requests=2, time_scale=2.0)] == pytest.approx([0.0, 8.629158])
    with pytest.raises(TraceError, match="time_scale"):
        load_trace(azure, time_scale=0.0)


def test_format_is_detected_by_extension_then_by_content(tmp_path, mooncake, azure):
    assert (detect_format(mooncake), detect_format(azure)) == ("mooncake", "azure")
    no_ext_jsonl, no_ext_csv, junk = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    no_ext_jsonl.write_text(mooncake.read_text())
    no_ext_csv.write_text(AZURE_CSV)
    junk.write_text("hello\n")
    assert (detect_format(no_ext_jsonl), detect_format(no_ext_csv)) == ("mooncake", "azure")
    assert load_trace(no_ext_csv)[1].isl == 396
    with pytest.raises(TraceError, match="neither"):
        detect_format(junk)


def test_a_bad_row_names_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 1, "output_length": 1}\n{"timestamp": 5}\n')
    with pytest.raises(TraceError, match=r"bad.jsonl:2"):
        load_trace(path)


def test_clip_keeps_fitting_rows_and_scales_long_ones_in_proportion():
    fits = TraceRow(1.0, 400, 112, (3,))
    assert clip_to_context(fits, 512) is fits
    long = clip_to_context(TraceRow(1.0, 12035, 343, (0, 1)), 8192)
    assert (long.isl, long.osl) == (7964, 228)  # floor(12035 * 8192 / 12378), the rest of the context
    assert long.arrival_s == 1.0 and long.hash_ids == (0, 1)
    tiny_output = clip_to_context(TraceRow(0.0, 10_000, 1, ()), 512)
    assert (tiny_output.isl, tiny_output.osl) == (511, 1)  # each side keeps at least one token


def test_clip_all_counts_the_rows_it_changed():
    rows = [TraceRow(0.0, 100, 10), TraceRow(0.0, 600, 100), TraceRow(0.0, 512, 1)]
    clipped, num_clipped = clip_all(rows, 512)
    assert num_clipped == 2
    assert all(r.isl + r.osl <= 512 and r.isl >= 1 and r.osl >= 1 for r in clipped)
