"""Prefill sized by the TTFT tail: the recent prompts replayed through c first-come-first-served workers, and the
fewest c whose missed share is within the target; the utilization cap decides until enough prompts were seen."""

from dataclasses import replace

import numpy as np
import pytest

from services.planner.prefill_queue import PrefillQueue, PrefillQueueConfig, missed_share
from services.planner.state_machine import PlannerCore
from services.planner.types import Load, PlannerConfigError, RequestOutcome, WorkerRole
from tests.unit.services.planner.test_state_machine import CONFIG, MODEL, obs, run

P, D = WorkerRole.PREFILL, WorkerRole.DECODE


def test_missed_share_counts_waits_behind_a_busy_worker_and_leaves_out_what_no_worker_serves_in_time():
    arrivals, prompts = np.array([0.0, 0.1, 0.2]), np.array([4000, 4000, 6000])
    # one worker: the second prompt (400 ms) starts at 0.4 (first token 0.7 s after it arrived: missed); the third
    # needs 600 ms alone, past the 500 ms SLO on any fleet, so it is not judged
    assert missed_share(arrivals, prompts, 1, MODEL) == 0.5
    assert missed_share(arrivals, prompts, 2, MODEL) == 0.0  # the second goes to the idle worker


def test_a_prompt_chunked_over_two_steps_waits_for_what_joins_its_last_step():
    """4,800 tokens take 480 ms alone: a 4,000-token step, then 800 tokens batched with a 3,000-token prompt that
    arrived meanwhile (380 ms): both first tokens come at 0.78 s. First come, first served alone would have
    given the first prompt its token at 0.48 s."""
    assert missed_share(np.array([0.0, 0.1]), np.array([4800, 3000]), 1, MODEL) == 1.0


def queue_after(tokens: int, num: int, **config) -> PrefillQueue:
    queue = PrefillQueue(PrefillQueueConfig(**config))
    queue.record((RequestOutcome(tokens, 0.1, 0.02),) * num)
    return queue


def test_long_prompts_at_a_load_the_utilization_cap_gives_one_worker_need_more():
    # 3,000-token prompts: 300 ms each by the model; 1.5 req/s keeps 0.45 of a worker busy (under the cap of one
    # worker at 0.5) yet one worker queues most prompts past the 500 ms SLO
    queue = queue_after(3000, 60)
    assert MODEL.replicas(Load(1.5, 3000.0, 20.0), True)[P] == 1
    assert queue.workers(1.5, MODEL, 8) >= 2
    assert queue_after(500, 60).workers(1.5, MODEL, 8) == 1  # 50 ms prompts at the same rate: one is plenty


def test_it_decides_nothing_until_enough_prompts_were_seen_or_when_off():
    assert queue_after(3000, 49).workers(1.5, MODEL, 8) is None  # fewer than min_prompts (50)
    assert queue_after(3000, 60, miss_share=0.0).workers(1.5, MODEL, 8) is None
    assert queue_after(3000, 60).workers(1.5, MODEL, 1) == 1  # never past the bound


def test_the_same_prompts_give_the_same_count():
    assert queue_after(2500, 80).workers(2.0, MODEL, 8) == queue_after(2500, 80).workers(2.0, MODEL, 8)


@pytest.mark.parametrize("config", [dict(miss_share=1.0), dict(miss_share=-0.1), dict(num_arrivals=0)])
def test_bad_settings_are_refused(config):
    with pytest.raises(PlannerConfigError):
        PrefillQueueConfig(**config)


def test_the_core_sizes_prefill_by_the_tail_once_it_has_seen_the_prompt_mix():
    """1.5 req/s of 3,000-token prompts: the cap's count is one prefill worker; the queue's is more."""
    finished = (RequestOutcome(3000, 0.2, 0.02, P),) * 20
    ticks = [obs(rate=1.5, isl=3000.0, finished=finished)] * 5
    tail = run(PlannerCore(CONFIG, MODEL), ticks)[-1].targets
    capped = run(PlannerCore(replace(CONFIG, prefill_queue=PrefillQueueConfig(0.0)), MODEL), ticks)[-1].targets
    assert capped[P] == 1 and tail[P] >= 2
