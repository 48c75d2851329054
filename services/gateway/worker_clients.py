"""The gateway's calls to workers, by address: Prefill, Generate (read as token deltas), Abort and ReleaseKv, over one
channel per worker. It speaks domain types; the protobuf stays inside (convert.py builds and reads it). No decisions:
the pipeline makes them, and it handles the calls' errors (grpc.aio.AioRpcError) itself."""

from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

import grpc

from engines.base.types import SamplingParams
from services.common import convert
from services.common.domain import Prefilled
from services.common.grpc_server import make_channel
from services.common.protos import worker_pb2_grpc


class TokenStream:
    """One Generate call: `messages` are its replies, opaque to the reader, and `read(message)` makes each a
    `TokenDelta`. `cancel()` ends the call (the worker aborts on cancellation); `aclose()` ends the reading now, not at
    garbage collection (it ends the call's client span).

    NOTE: read per message by the caller's own loop, not through a generator of deltas here: a layer per token costs
    ~60 ns (bench/RESULTS.md, "Gateway seams")."""

    __slots__ = ("_call", "messages")
    read = staticmethod(convert.delta_from_pb)

    def __init__(self, call: grpc.aio.UnaryStreamCall):
        self._call = call
        self.messages: AsyncIterator[object] = aiter(call)

    def cancel(self) -> None:
        self._call.cancel()

    async def aclose(self) -> None:
        if hasattr(self.messages, "aclose"):
            await self.messages.aclose()


@dataclass(frozen=True, slots=True)
class _Worker:
    """One worker's channel and the stubs over it, made once (a stub per call would rebuild its methods)."""

    channel: grpc.aio.Channel
    prefill: worker_pb2_grpc.PrefillWorkerStub
    decode: worker_pb2_grpc.DecodeWorkerStub
    control: worker_pb2_grpc.WorkerControlStub


class WorkerClients:
    """`connect` opens a channel to an address (the gateway's TLS settings live in it)."""

    def __init__(self, connect: Callable[[str], grpc.aio.Channel] = make_channel):
        self._connect = connect
        self._workers: dict[str, _Worker] = {}

    async def prefill(
        self, address: str, req_id: str, prompt: list[int], params: SamplingParams, timeout_s: float
    ) -> Prefilled:
        request = convert.prefill_request_to_pb(req_id, prompt, params)
        return convert.prefilled_from_pb(await self._at(address).prefill.Prefill(request, timeout=timeout_s))

    def generate(
        self,
        address: str,
        req_id: str,
        prompt: list[int],
        params: SamplingParams,
        timeout_s: float,
        kv: object | None = None,
        output_token_ids: Sequence[int] = (),
    ) -> TokenStream:
        """Starts the call now (a KV pull overlaps whatever the caller does next); read it as it streams."""
        request = convert.generate_request_to_pb(req_id, prompt, params, kv, output_token_ids)
        return TokenStream(self._at(address).decode.Generate(request, timeout=timeout_s))

    async def abort(self, address: str, req_id: str, timeout_s: float) -> None:
        await self._at(address).control.Abort(convert.abort_request_to_pb(req_id), timeout=timeout_s)

    async def release_kv(self, address: str, req_id: str, timeout_s: float) -> None:
        await self._at(address).prefill.ReleaseKv(convert.release_kv_request_to_pb(req_id), timeout=timeout_s)

    async def close(self) -> None:
        for worker in self._workers.values():
            await worker.channel.close()
        self._workers.clear()

    def _at(self, address: str) -> _Worker:
        worker = self._workers.get(address)
        if worker is None:
            channel = self._connect(address)
            worker = _Worker(
                channel,
                worker_pb2_grpc.PrefillWorkerStub(channel),
                worker_pb2_grpc.DecodeWorkerStub(channel),
                worker_pb2_grpc.WorkerControlStub(channel),
            )
            self._workers[address] = worker
        return worker
