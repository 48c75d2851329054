"""A clairvoyant schedule replayed through the planner's virtual connector: one step is the static replay to the
digit, an added replica is billed from a start delay before it serves, a removal drains, a removal followed by an
addition within a start delay keeps the replica, and a bad schedule raises ScheduleError."""

from dataclasses import replace

import pytest

from engines.timing.profile import load_profile
from services.planner.perf_model import Slo
from services.planner.state_machine import PlannerConfig, RoleBounds
from services.planner.types import WorkerRole
from tandem.bench.traces import TraceRow
from tandem.cluster import planner_oracle as po
from tandem.cluster.planner_sim import PlannerSimConfig, run_static

PROFILE = load_profile("h100-native-llama3.1-8b-bf16")
CFG = PlannerSimConfig(
    PlannerConfig(prefill=RoleBounds(1, 4), decode=RoleBounds(1, 4), predictor="constant"),
    Slo(0.5, 0.05),
    tick_s=1.0,
    start_delay_s=2.0,
    keep_requests=True,
)


def trace(rate: float = 20.0, seconds: float = 30.0) -> list[TraceRow]:
    return [TraceRow(round(i / rate, 6), 1000, 40) for i in range(int(rate * seconds))]


ROWS = trace()


def test_one_step_is_the_static_replay():
    static = run_static(PROFILE, ROWS, CFG, {WorkerRole.PREFILL: 1, WorkerRole.DECODE: 2})
    run = po.run_scheduled(PROFILE, ROWS, CFG, [(0, 1, 2)])
    assert not static["attainment_is_upper_bound"]
    for key in ("sla_attainment", "gpu_hours_own_end", "end_s", "ttft_p99_s", "itl_mean_s"):
        assert run[key] == static[key]
    assert run["gpu_hours_own_end"] == pytest.approx(3 * run["end_s"] / 3600) and run["decisions"] == []


def test_an_added_replica_is_billed_from_a_start_delay_before_it_serves():
    run = po.run_scheduled(PROFILE, ROWS, CFG, [(0, 1, 1), (20, 1, 2)])
    assert run["requests"]["worker_added_s"]["decode-001"] == 20.0  # serves from the step's time
    assert run["decisions"] == [{"t_s": 18.0, "role": "decode", "from": 1, "to": 2}]  # asked 2 s before
    end = run["end_s"]
    assert run["gpu_hours_own_end"] == pytest.approx((2 * end + (end - 18.0)) / 3600)


def test_a_removal_drains_and_is_billed_until_drained():
    run = po.run_scheduled(PROFILE, ROWS, CFG, [(0, 2, 2), (10, 1, 2)])
    assert run["decisions"] == [{"t_s": 10.0, "role": "prefill", "from": 2, "to": 1}]
    end = run["end_s"]
    assert (3 * end + 10.0) / 3600 <= run["gpu_hours_own_end"] < 4 * end / 3600


def test_a_replica_removed_and_wanted_again_within_a_start_delay_is_kept():
    steps = po.parse_schedule([(0, 1, 2), (10, 1, 1), (11, 1, 2), (20, 1, 1), (30, 1, 3)], CFG)
    assert po.wanted(steps, 10.0, CFG) == (1, 2)  # (11, 1, 2) is asked for at 9: keep the one serving
    assert po.wanted(steps, 20.0, CFG) == (1, 1) and po.wanted(steps, 28.0, CFG) == (1, 3)
    assert po.wanted(po.parse_schedule([(0, 1, 1), (1, 2, 1)], CFG), 0.0, CFG) == (2, 1)  # due before a delay
    held = po.planned_seconds([(0, 1, 2), (10, 1, 1), (11, 1, 2), (20, 1, 1), (30, 1, 3)], CFG, 40.0)
    assert held == {(1, 2): 20.0, (1, 1): 8.0, (1, 3): 12.0}


@pytest.mark.parametrize(
    "schedule,message",
    [
        ([], "starts at t_s = 0"),
        ([(5, 1, 1)], "starts at t_s = 0"),
        ([(0, 1, 1), (10, 1, 2), (10, 1, 3)], "ascend strictly"),
        ([(0, 1, 1), (10, 1, 2), (5, 1, 3)], "ascend strictly"),
        ([(0, 1, -1)], "decode -1 at 0.0 s is outside \\[1, 4\\]"),
        ([(0, -1, 1)], "prefill -1"),
        ([(0, 0, 1)], "prefill 0 at 0.0 s is outside \\[1, 4\\]"),
        ([(0, 1, 5)], "decode 5"),
        ([(0, 1, 1), (2.5, 1, 2)], "not a multiple of the tick"),
    ],
)
def test_a_bad_schedule_raises_a_typed_error(schedule, message):
    with pytest.raises(po.ScheduleError, match=message):
        po.run_scheduled(PROFILE, ROWS, CFG, schedule)


def test_the_share_a_cheaper_fleet_must_be_held():
    assert po.needed_hold_share(2, 3) == pytest.approx(0.45)  # Mooncake: 1 + 1 against 1 + 2
    assert po.needed_hold_share(2, 5) == pytest.approx(0.25) and po.needed_hold_share(4, 5) == pytest.approx(0.75)
    with pytest.raises(ValueError):
        po.needed_hold_share(3, 3)
    assert po.cheaper_fleets((1, 2), CFG) == [(1, 1)]
    assert po.cheaper_fleets((2, 3), CFG) == [(1, 1), (1, 2), (2, 1), (1, 3), (2, 2), (3, 1)]


def test_schedule_builders():
    assert po.contiguous((1, 1), (1, 2), 0.0, 30.0) == [(0.0, 1, 1), (30.0, 1, 2)]
    assert po.contiguous((1, 1), (1, 2), 10.0, 30.0) == [(0.0, 1, 2), (10.0, 1, 1), (40.0, 1, 2)]
    assert po.alternating((1, 1), (1, 2), 10.0, 5.0, 30.0, cheap_first=False) == [
        (0.0, 1, 2),
        (5.0, 1, 1),
        (15.0, 1, 2),
        (20.0, 1, 1),
    ]
    rows = [TraceRow(1.0, 100, 10), TraceRow(2.0, 100, 10), TraceRow(15.0, 5, 5), TraceRow(25.0, 1000, 1)]
    assert po.bin_loads(rows, 10.0, 30.0) == [220.0, 10.0, 1001.0]
    assert po.bin_loads(rows, 10.0, 30.0, "requests") == [2.0, 1.0, 1.0]
    assert po.lightest_bins([220.0, 10.0, 1001.0, 10.0], 2) == {1, 3}
    assert po.from_bins([(1, 2), (1, 2), (1, 1), (1, 2)], 60.0) == [(0.0, 1, 2), (120.0, 1, 1), (180.0, 1, 2)]
    assert po.look_ahead([(1, 1), (2, 1), (1, 3)]) == [(2, 1), (2, 3), (1, 3)]
    assert po.on_grid(12.0, 5.0) == 10.0 and po.on_grid(12.0, 5.0, up=True) == 15.0 and po.on_grid(15.0, 5.0) == 15.0
    assert po.fleet_seconds([(0.0, 1, 2), (10.0, 1, 1), (40.0, 1, 2)], 50.0) == {(1, 2): 20.0, (1, 1): 30.0}
    decisions = [
        {"t_s": 8.0, "role": "decode", "from": 2, "to": 1},
        {"t_s": 38.0, "role": "decode", "from": 1, "to": 2},
    ]
    assert po.held_seconds({"prefill": 1, "decode": 2}, decisions, 50.0) == {(1, 2): 20.0, (1, 1): 30.0}


def test_bins_and_the_cheap_fleet_sized_to_be_billed_the_needed_share():
    rows = [TraceRow(1.0, 100, 10), TraceRow(12.0, 5, 5), TraceRow(29.0, 7, 7)]
    assert po.bin_slices(rows, 10.0, 30.0) == [[TraceRow(1.0, 100, 10)], [TraceRow(2.0, 5, 5)], [TraceRow(9.0, 7, 7)]]
    # a cheap block followed by a larger fleet is billed a start delay (2 s) less than it serves: lengthened to fit
    block = po.held_block((1, 1), (1, 2), 0.0, 0.5, 40.0, CFG)
    assert block == [(0.0, 1, 1), (22.0, 1, 2)]
    assert po.planned_seconds(block, CFG, 40.0)[(1, 1)] == 20.0
    at_end = po.held_block((1, 1), (1, 2), 1.0, 0.5, 40.0, CFG)  # nothing follows it: billed as it serves
    assert at_end == [(0.0, 1, 2), (20.0, 1, 1)]
    loads = [5.0, 1.0, 9.0, 2.0]  # bins of 10 s: the two lightest, 1 and 3, are billed 8 + 10 s of 40
    assert po.lightest(loads, (1, 1), (1, 2), 10.0, 0.4, 40.0, CFG) == [
        (0.0, 1, 2),
        (10.0, 1, 1),
        (20.0, 1, 2),
        (30.0, 1, 1),
    ]
    assert po.lightest(loads, (1, 1), (1, 2), 10.0, 0.5, 40.0, CFG) == [(0.0, 1, 1), (20.0, 1, 2), (30.0, 1, 1)]


def test_day_fleets_carry_the_burst_factor_times_the_days_highest_base_in_each_bin():
    """mean 3, amplitude 0.6, period 900 s: the base is 1.2/s at 0 and 4.8/s at 450 s; x2.5 that is 3 and 12/s. At 8
    prefill and 4.5 decode requests/s per worker: 1 + 1 in the trough's bin, 2 + 3 in the peak's; bounds cap it."""
    day = po.DayShape(3.0, 0.6, 900.0, 2.5)
    assert day.rate(0.0) == pytest.approx(1.2) and day.rate(450.0) == pytest.approx(4.8)
    fleets = po.day_fleets(day, (8.0, 4.5), 30.0, 900.0, CFG)
    assert len(fleets) == 30 and fleets[0] == (1, 1)
    assert fleets[14] == fleets[15] == (2, 3)  # the bins either side of the peak both reach 4.8/s
    decode = [d for _, d in fleets]
    assert decode[:15] == sorted(decode[:15]) and decode[15:] == sorted(decode[15:], reverse=True)  # up, then down
    assert max(fleets) == (2, 3)
    tight = replace(CFG, planner=replace(CFG.planner, decode=RoleBounds(1, 2)))
    assert max(d for _, d in po.day_fleets(day, (8.0, 4.5), 30.0, 900.0, tight)) == 2
