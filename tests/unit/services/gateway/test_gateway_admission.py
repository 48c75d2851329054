"""The in-flight count: one process's, and the one several gateway processes share through shared memory."""

import multiprocessing

import pytest

from services.gateway.admission import Admission, LocalInflight, SharedInflight
from services.gateway.errors import RateLimitError


def _grab_all(slots, index: int, limit: int, start, out) -> None:
    inflight = SharedInflight(slots, index, limit)
    start.wait()
    out.put((index, sum(inflight.try_acquire() for _ in range(10))))


def test_processes_sharing_the_count_never_admit_more_than_the_limit():
    ctx = multiprocessing.get_context("spawn")
    slots, start, out = ctx.Array("i", 3), ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_grab_all, args=(slots, i, 5, start, out)) for i in range(3)]
    for p in procs:
        p.start()
    start.set()  # all three race for the 5 slots at once
    got = dict(out.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(timeout=30)
    assert sum(got.values()) == 5 and list(slots) == [got[0], got[1], got[2]]
    busiest = max(got, key=got.get)  # holds at least 2 of the 5
    mine = SharedInflight(slots, busiest, 5)
    assert mine.count() == 5 and not mine.try_acquire()
    mine.release()
    assert mine.count() == 4 and slots[busiest] == got[busiest] - 1 and mine.try_acquire()


def test_admission_slots_release_once():
    admission = Admission(max_inflight=2)
    first, second = admission.acquire(), admission.acquire()
    with pytest.raises(RateLimitError):
        admission.acquire()
    first.release()
    first.release()  # idempotent: frees one slot, not two
    assert admission.num_inflight == 1
    admission.acquire()
    with pytest.raises(RateLimitError):
        admission.acquire()
    second.release()
    assert isinstance(admission.inflight, LocalInflight) and admission.num_inflight == 1
