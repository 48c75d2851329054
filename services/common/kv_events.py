"""A worker's KV events as a stream of KvEventBatch protos: the replay (or a snapshot when the engine's ring
no longer reaches back), then each new batch as the engine records it; and its load each time it changes.
No decision logic, no gRPC context."""

import asyncio
from collections.abc import AsyncIterator, Callable

from engines.base.engine import Engine
from services.common.convert import kv_events_to_pb, kv_snapshot_to_pb
from services.common.protos import common_pb2, worker_pb2


async def kv_event_batches(
    engine: Engine, worker_id: str, after_seq: int, stopped: asyncio.Event
) -> AsyncIterator[worker_pb2.KvEventBatch]:
    """Batches of events after `after_seq` until `stopped` is set (the worker is shutting down)."""
    while not stopped.is_set():
        events = await engine.kv_events_since(after_seq)
        if events is None:
            snapshot = await engine.kv_snapshot()
            yield kv_snapshot_to_pb(worker_id, snapshot)
            after_seq = snapshot.seq
        elif events:
            yield kv_events_to_pb(worker_id, events)
            after_seq = events[-1].seq
        await _first_of(engine.wait_kv_events(after_seq), stopped.wait())


async def load_changes(
    sample: Callable[[], tuple[common_pb2.WorkerLoad, int]], interval_s: float, stopped: asyncio.Event
) -> AsyncIterator[common_pb2.WorkerLoad]:
    """The load now, then each time its queue, batch or held requests differ from the last one sent, or the engine
    admitted work since (`sample` gives the load and a running count of what was admitted): a request that arrived
    and finished between two samples leaves the queue as it was, yet the router must learn that its route landed."""
    last = None
    while not stopped.is_set():
        now, admitted = sample()
        key = (now.num_waiting, now.num_running, now.num_held, admitted)
        if key != last:
            last = key
            yield now
        await _first_of(asyncio.sleep(interval_s), stopped.wait())


async def _first_of(*coros) -> None:
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
