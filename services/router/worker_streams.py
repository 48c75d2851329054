"""One asyncio task per worker following one of its server streams (KV events, load). This module owns only the
tasks' lifecycle (start, restart on a new address, cancel, close); a subclass says how one stream is followed.
"""

import asyncio
from collections.abc import Callable

import grpc

from services.common.grpc_server import make_channel


class WorkerStreams:
    task_name = "stream"  # each task is named "<task_name>-<worker_id>"

    def __init__(self, retry_s: float = 1.0, connect: Callable[[str], grpc.aio.Channel] = make_channel):
        self.retry_s = retry_s
        self._connect = connect
        self._tasks: dict[str, tuple[str, asyncio.Task]] = {}  # worker_id -> (address, task)

    def follow(self, worker_id: str, address: str) -> None:
        """Subscribe to a worker (again if its address changed); a live subscription is kept."""
        current = self._tasks.get(worker_id)
        if current is not None and current[0] == address and not current[1].done():
            return
        self._cancel(worker_id)
        task = asyncio.create_task(self._follow(worker_id, address), name=f"{self.task_name}-{worker_id}")
        self._tasks[worker_id] = (address, task)

    def is_following(self, worker_id: str) -> bool:
        current = self._tasks.get(worker_id)
        return current is not None and not current[1].done()

    async def close(self) -> None:
        tasks = [task for _, task in self._tasks.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()

    def _cancel(self, worker_id: str) -> None:
        current = self._tasks.pop(worker_id, None)
        if current is not None:
            current[1].cancel()

    async def _follow(self, worker_id: str, address: str) -> None:
        raise NotImplementedError
