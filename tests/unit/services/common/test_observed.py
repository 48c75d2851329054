"""`observed` counts an RPC by its final status and tags its log records with the request id, also for a
response stream that a cancelled call closes from another task (as grpc.aio does)."""

import asyncio
from types import SimpleNamespace

import grpc

from services.common.logs import request_id
from services.common.worker_base import observed


class Service:
    def __init__(self):
        self.done = []
        self.metrics = SimpleNamespace(rpc_done=lambda rpc, code: self.done.append((rpc, code)))

    @observed("Generate")
    async def Generate(self, request, context):
        for i in range(100):
            assert request_id.get() == request.req_id
            yield i


class Context:
    def code(self):
        return grpc.StatusCode.CANCELLED


async def test_a_stream_closed_from_another_task_is_counted_and_leaves_no_error(caplog):
    service = Service()
    stream = service.Generate(SimpleNamespace(req_id="r1"), Context())
    assert await anext(stream) == 0
    await asyncio.create_task(stream.aclose())  # the cancelled call's clean-up, in another task's context
    assert service.done == [("Generate", "CANCELLED")]
    assert not [r for r in caplog.records if r.levelname == "ERROR"]
