"""A timing profile with round numbers, so the planner's arithmetic can be checked exactly."""

from engines.timing.profile import TimingProfile


def round_profile(**overrides) -> TimingProfile:
    """Prefill: 100 ms per 1,000 tokens (linear through 0). Decode at any context <= 1,000: 10 ms for one
    sequence, +1 ms per extra 10 (20 ms at 101); at 2,000 tokens twice that. KV for 200,000 tokens."""
    fields = dict(
        name="round",
        block_size=10,
        num_blocks=20_000,
        max_num_seqs=256,
        max_num_batched_tokens=4000,
        prefill_ms_coeffs=(0.0, 0.1, 0.0),
        decode_ms_coeffs=(0.0, 0.0, 10.0),
        min_step_ms=0.0,
        prefill_ms_points=((1000.0, 100.0), (2000.0, 200.0)),
        decode_ms_points=((1.0, 1000.0, 10.0), (101.0, 1000.0, 20.0), (1.0, 2000.0, 20.0), (101.0, 2000.0, 40.0)),
    )
    return TimingProfile(**{**fields, **overrides})
