"""Graceful drain of a worker: its token streams are counted while they run; at SIGTERM the worker waits for them
to finish (up to TANDEM_WORKER_DRAIN_S), then hands back the rest: each ends with UNAVAILABLE, which the gateway
answers by migrating the request (prompt + tokens so far) to another worker.

Knows asyncio tasks and gRPC status codes; nothing of engines or requests.
"""

import asyncio
import functools
import logging
import time
from collections.abc import Callable

import grpc

log = logging.getLogger(__name__)
HAND_BACK_MESSAGE = "the worker is draining: continue this request on another worker"


class Drain:
    def __init__(self) -> None:
        self._live: dict[asyncio.Task, bool] = {}  # the task serving each stream -> is it at a yield (sending)
        self.is_handing_back = False

    @property
    def num_live(self) -> int:
        return len(self._live)

    async def wait_idle(
        self, timeout_s: float, is_engine_idle: Callable[[], bool] = lambda: True, poll_s: float = 0.05
    ) -> bool:
        """Until no stream is live and the engine holds nothing; False when `timeout_s` ran out first."""
        deadline = time.monotonic() + timeout_s
        while self._live or not is_engine_idle():
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(poll_s)
        return True

    def hand_back(self) -> int:
        """End every live stream now (UNAVAILABLE); how many there were. A stream waiting for its next token is
        cancelled there; one at a yield (grpc is sending) stops as soon as the send is done."""
        self.is_handing_back = True
        for task, is_at_yield in list(self._live.items()):
            if not is_at_yield:  # NOTE: never cancel grpc's own send: the call could end without a status
                task.cancel()
        return len(self._live)


def drainable(method):
    """For a response-streaming servicer method of a service with a `drain`: count the stream while it runs, and
    at the hand-back end it with UNAVAILABLE (closing the method's stream, which aborts the request there)."""

    @functools.wraps(method)
    async def stream(self, request, context):
        drain: Drain = self.drain
        task = asyncio.current_task()
        drain._live[task] = False
        replies = method(self, request, context)
        try:
            try:
                async for reply in replies:
                    drain._live[task] = True
                    yield reply
                    drain._live[task] = False
                    if drain.is_handing_back:
                        break
                else:
                    return
            except asyncio.CancelledError:
                if not drain.is_handing_back:
                    raise
                task.uncancel()
            await replies.aclose()
            log.info("handed back %s", request.req_id)
            await context.abort(grpc.StatusCode.UNAVAILABLE, HAND_BACK_MESSAGE)
        finally:
            drain._live.pop(task, None)

    return stream
