"""Two sizing options of the seventh pass: the base rate's last rise carried ahead (a fleet asked now serves a start
delay later, on a day still climbing), and a decode pool carrying a smaller share of the burst headroom than prefill."""

from dataclasses import replace

import pytest

from services.planner.state_machine import PlannerConfig, PlannerCore
from services.planner.types import PlannerConfigError, WorkerRole
from tests.unit.services.planner.test_state_machine import CONFIG, MODEL, obs, run

P, D = WorkerRole.PREFILL, WorkerRole.DECODE


def _predicted(rise_lead: float, rates: list[float]) -> list[float]:
    """Each adjustment's predicted rate (adjustments every 10 s, two 5-second ticks each) for one rate per interval."""
    ticks = [obs(rate=r) for r in rates for _ in range(2)]
    results = run(PlannerCore(replace(CONFIG, rise_lead=rise_lead), MODEL), ticks)
    return [r.predicted.request_rate for r in results if r.predicted is not None]


def test_a_rise_is_carried_ahead_and_a_fall_is_not():
    rates = [4.0, 4.0, 6.0, 8.0, 5.0, 5.0]
    plain, led = _predicted(0.0, rates), _predicted(1.5, rates)
    assert len(plain) == len(led) >= 4
    rises = [0.0] + [max(b - a, 0.0) for a, b in zip(plain, plain[1:])]
    assert led == pytest.approx([p + 1.5 * r for p, r in zip(plain, rises)])
    assert max(rises) > 0 and any(b < a for a, b in zip(plain, plain[1:]))  # both a rise and a fall were seen


def _targets(**options) -> dict:
    bounds = {"prefill": replace(CONFIG.prefill, max_replicas=12), "decode": replace(CONFIG.decode, max_replicas=12)}
    config = replace(CONFIG, **bounds, **options)
    return run(PlannerCore(config, MODEL), [obs(rate=10.0, isl=900.0, osl=800.0)] * 6)[-1].targets


def test_the_decode_pool_can_carry_less_of_the_burst_headroom_than_prefill():
    full, decode_less, small = (
        _targets(burst_headroom=2.5),
        _targets(burst_headroom=2.5, decode_burst_headroom=1.5),
        _targets(burst_headroom=1.5),
    )
    assert full[D] > small[D] and full[P] > small[P]  # the headroom matters to both pools at this load
    assert decode_less == {P: full[P], D: small[D]}


@pytest.mark.parametrize(
    "options",
    [{"rise_lead": -1.0}, {"decode_burst_headroom": 3.0, "burst_headroom": 2.5}, {"decode_burst_headroom": 0.5}],
)
def test_the_options_are_checked(options):
    with pytest.raises(PlannerConfigError):
        PlannerConfig(**options)
