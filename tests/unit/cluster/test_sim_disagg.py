"""The simulator agrees with the live check: 1 prefill and 2 decode workers, heartbeats every 2 s, long prompts at
3x the heartbeat-limited rate (4 waiting per 2 s). With the prefill worker's load streamed, >= 90% are disaggregated;
on heartbeats alone the router guesses a queue from every route still in flight and prefills many on decode workers.
The run itself is bench/disagg_check_sim.py's, which writes the figures RESULTS.md cites."""

import pytest

from bench.disagg_check_sim import MAX_WAITING, share_disaggregated


@pytest.mark.parametrize("stream", [True, False])
def test_the_load_stream_keeps_long_prompts_disaggregated(stream):
    share, peak_waiting = share_disaggregated(stream)
    assert peak_waiting < MAX_WAITING  # the prefill worker never queued enough to count as saturated
    if stream:
        assert share >= 0.9
    else:
        assert share < 0.75  # 2/3 here: a third of each heartbeat interval is spent believing the worker full
