"""An in-process stand-in for grpc.aio channels, for bench/gateway_seam_cost.py: every call serializes its request
and parses a canned answer from bytes, as gRPC does, with no socket and no other process, so what the gateway
pipeline's own code costs per request and per token is measured apart from the transport. Not for tests."""

import grpc

from services.common.protos import common_pb2, router_pb2, worker_pb2

WORKER = "fake:1"


def _answers(num_tokens: int, is_disaggregated: bool) -> dict[str, bytes]:
    route = router_pb2.RouteResponse(decode=router_pb2.WorkerRef(worker_id="d0", address=WORKER))
    if is_disaggregated:
        route.prefill.CopyFrom(router_pb2.WorkerRef(worker_id="p0", address=WORKER))
    info = router_pb2.WorkerInfo(worker_id="d0", role=common_pb2.WORKER_ROLE_DECODE, model="m", max_model_len=4096)
    listing = router_pb2.ListWorkersResponse(workers=[router_pb2.WorkerStatus(worker=info, lease_expires_in_s=5)])
    kv = common_pb2.KvHandle(worker_id="p0", address=WORKER, req_id="r", num_tokens=128, num_blocks=8)
    return {
        "Route": route.SerializeToString(),
        "ListWorkers": listing.SerializeToString(),
        "Prefill": worker_pb2.PrefillResponse(first_token_id=100, kv=kv).SerializeToString(),
    }


def _tokens(num_tokens: int) -> list[bytes]:
    """Generate's messages after the prefill worker's first token: one token each, the last one LENGTH."""
    out = [worker_pb2.GenerateResponse(token_ids=[100 + i]).SerializeToString() for i in range(1, num_tokens - 1)]
    last = worker_pb2.GenerateResponse(token_ids=[100 + num_tokens - 1], finish_reason=common_pb2.FINISH_REASON_LENGTH)
    return out + [last.SerializeToString()]


class _Unary:
    def __init__(self, answer: bytes, serialize, deserialize):
        self._answer, self._serialize, self._deserialize = answer, serialize, deserialize

    def __call__(self, request, timeout=None, wait_for_ready=None, **_):
        return self._reply(request)

    async def _reply(self, request):
        self._serialize(request)
        return self._deserialize(self._answer)


class _StreamCall:
    def __init__(self, messages: list[bytes], deserialize):
        self._messages, self._deserialize = messages, deserialize

    def __aiter__(self):
        return self._read()

    async def _read(self):
        for message in self._messages:
            yield self._deserialize(message)

    def cancel(self) -> bool:
        return True


class _Stream:
    def __init__(self, messages: list[bytes], serialize, deserialize):
        self._messages, self._serialize, self._deserialize = messages, serialize, deserialize

    def __call__(self, request, timeout=None, **_):
        self._serialize(request)
        done = len(request.output_token_ids)  # the first token came from the prefill worker, if any
        return _StreamCall(self._messages if done else self._messages[:1] + self._messages, self._deserialize)


class FakeChannel:
    """`real` (a grpc.aio channel that is never called, so never connects) builds each method's multicallable as a
    stub does, so that making a stub costs here what it costs with gRPC; the calls themselves are canned."""

    def __init__(self, num_tokens: int, is_disaggregated: bool, real):
        self._answers, self._tokens = _answers(num_tokens, is_disaggregated), _tokens(num_tokens)
        self._real = real

    def unary_unary(self, method, request_serializer=None, response_deserializer=None, **kw):
        self._real.unary_unary(method, request_serializer, response_deserializer, **kw)
        answer = self._answers.get(method.rsplit("/", 1)[1], b"")  # the calls the pipeline never makes: empty
        return _Unary(answer, request_serializer, response_deserializer)

    def unary_stream(self, method, request_serializer=None, response_deserializer=None, **kw):
        self._real.unary_stream(method, request_serializer, response_deserializer, **kw)
        return _Stream(self._tokens, request_serializer, response_deserializer)

    async def close(self) -> None:
        await self._real.close()


def install(num_tokens: int, is_disaggregated: bool) -> None:
    """Every channel the gateway opens from now on is a FakeChannel (make_channel calls grpc.aio.insecure_channel)."""
    real = grpc.aio.insecure_channel
    grpc.aio.insecure_channel = lambda address, *a, **kw: FakeChannel(num_tokens, is_disaggregated, real("127.0.0.1:9"))
