"""Tiny fakes for router tests: a clock tests move by hand, and workers built in one line."""

from services.router.types import WorkerInfo, WorkerLoad, WorkerRole, WorkerView

DECODE, PREFILL = WorkerRole.DECODE, WorkerRole.PREFILL


class FakeClock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, dt: float) -> None:
        self.now += dt


def info(worker_id: str, role: WorkerRole = DECODE, model: str = "m", max_num_seqs: int = 4) -> WorkerInfo:
    return WorkerInfo(worker_id, role, f"{worker_id}.local:9000", model, max_num_seqs=max_num_seqs)


def view(
    worker_id: str,
    running: int = 0,
    waiting: int = 0,
    blocks: int = 0,
    unreflected: int = 0,
    max_num_seqs: int = 4,
    role: WorkerRole = DECODE,
    inflight_tokens: int = 0,
    queued_tokens: int = 0,
) -> WorkerView:
    load = WorkerLoad(num_waiting=waiting, num_running=running, num_blocks_used=blocks)
    return WorkerView(
        info(worker_id, role, max_num_seqs=max_num_seqs),
        load,
        unreflected,
        unreflected,
        num_inflight_tokens=inflight_tokens,
        num_queued_prefill_tokens=queued_tokens,
    )
