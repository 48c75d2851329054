"""The simulator agrees with the live check: 1 prefill and 2 decode workers, heartbeats every 2 s, long prompts at
3x the heartbeat-limited rate (4 waiting per 2 s). With the prefill worker's load streamed, >= 90% are disaggregated;
on heartbeats alone the router guesses a queue from every route still in flight and prefills many on decode workers."""

import pytest

from engines.timing.profile import load_profile
from tandem.bench.traces import TraceRow
from tandem.cluster.des import ClusterSim, SimConfig

PROFILE = load_profile()
RATE = 3 * 4 / 2.0


def long_prompts(n: int = 120) -> list[TraceRow]:
    return [TraceRow(i / RATE, 1024, 200, tuple(10_000 + 3 * i + k for k in range(2))) for i in range(n)]


def share_disaggregated(stream: bool) -> tuple[float, int]:
    sim = ClusterSim(
        PROFILE, SimConfig(2, num_prefill_workers=1, heartbeat_interval_s=2.0, prefill_load_stream=stream), "kv"
    )
    peak = [0]
    sim.every(0.01, lambda now: peak.__setitem__(0, max(peak[0], sim.workers["prefill-000"].core.stats().num_waiting)))
    records = sim.run(long_prompts())
    return sum(bool(r.prefill_worker_id) for r in records) / len(records), peak[0]


@pytest.mark.parametrize("stream", [True, False])
def test_the_load_stream_keeps_long_prompts_disaggregated(stream):
    share, peak_waiting = share_disaggregated(stream)
    assert peak_waiting < 4  # the prefill worker never queued enough to count as saturated
    if stream:
        assert share >= 0.9
    else:
        assert share < 0.75  # 2/3 here: a third of each heartbeat interval is spent believing the worker full
