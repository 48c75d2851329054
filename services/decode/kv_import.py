"""Pulling a request's KV from the prefill worker named in its KvHandle (gRPC stream), and
reassembling the chunks into one KvExport for the engine."""
import grpc

from engines.base import KvExport
from services.common.convert import layout_from_pb
from services.common.grpc_server import make_channel
from services.common.protos import common_pb2, worker_pb2, worker_pb2_grpc


class KvPuller:
    """One channel per prefill worker, reused across requests."""

    def __init__(self, timeout_s: float = 30.0):
        self.timeout_s = timeout_s
        self._channels: dict[str, grpc.aio.Channel] = {}

    async def pull(self, handle: common_pb2.KvHandle) -> KvExport:
        stub = worker_pb2_grpc.PrefillWorkerStub(self._channel(handle.address))
        call = stub.PullKv(worker_pb2.PullKvRequest(req_id=handle.req_id), timeout=self.timeout_s)
        chunks = [chunk async for chunk in call]
        return assemble(chunks)

    def _channel(self, address: str) -> grpc.aio.Channel:
        if address not in self._channels:
            self._channels[address] = make_channel(address)
        return self._channels[address]

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()


def assemble(chunks: list[worker_pb2.KvChunk]) -> KvExport:
    """Chunks hold [layers, 2, n, ...] slices of consecutive blocks; join them plane by plane."""
    if not chunks:
        raise ValueError("PullKv returned no chunks")
    layout = layout_from_pb(chunks[0].layout)
    total = chunks[0].total_blocks
    if sum(c.num_blocks for c in chunks) != total:
        raise ValueError(f"PullKv returned {sum(c.num_blocks for c in chunks)} of {total} blocks")
    planes = layout.num_layers * 2
    parts = []
    for p in range(planes):
        for c in chunks:
            size = len(c.data) // planes
            parts.append(memoryview(c.data)[p * size : (p + 1) * size])
    return KvExport(layout=layout, token_ids=tuple(chunks[0].token_ids), num_blocks=total, data=b"".join(parts))
