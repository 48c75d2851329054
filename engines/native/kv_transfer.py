"""The native KV cache as a KvMover's paged cache: its one [layers, 2, blocks, ...] tensor seen as
[planes, blocks, block_bytes], so NIXL registers it where it lies (host or device memory) and a READ lands in
the blocks the step loop reads. Staging copies run on the mover's thread; on CUDA, on their own stream."""

import torch

from engines.base.types import KvLayout
from engines.native.kv_cache import KvCache
from engines.transfer import transports
from engines.transfer.mover import KvMover
from engines.transfer.paged import Geometry, HostCache, block_bytes


class DeviceCache:
    """A paged cache in GPU memory: copies to and from host arrays on a side stream, waited for by the caller
    (the mover's thread), so the step loop's stream never waits on them."""

    def __init__(self, tensor: torch.Tensor, layout: KvLayout, num_blocks: int):
        planes = layout.num_layers * 2
        self.blocks = tensor.view(torch.uint8).view(planes, num_blocks, block_bytes(layout))
        self.geometry = Geometry.of(layout, num_blocks, tensor.data_ptr(), "VRAM", tensor.device.index or 0)
        self.stream = torch.cuda.Stream(tensor.device)

    def write_blocks(self, block_ids, src) -> None:
        ids = torch.tensor(list(block_ids), dtype=torch.long)
        with torch.cuda.stream(self.stream):
            data = torch.from_numpy(src).to(self.blocks.device, non_blocking=False)
            self.blocks.index_copy_(1, ids.to(self.blocks.device), data)
        self.stream.synchronize()

    def read_blocks(self, block_ids, dst) -> None:
        ids = torch.tensor(list(block_ids), dtype=torch.long)
        self.stream.wait_stream(torch.cuda.default_stream(self.blocks.device))  # NOTE: the steps that wrote them
        with torch.cuda.stream(self.stream):
            data = self.blocks.index_select(1, ids.to(self.blocks.device)).cpu()
        dst[...] = data.numpy()


def paged_cache(kv_cache: KvCache) -> HostCache | DeviceCache:
    tensor, layout = kv_cache.tensor, kv_cache.layout
    if tensor.is_cuda:
        return DeviceCache(tensor, layout, kv_cache.num_blocks)
    return HostCache(tensor.view(torch.uint8).numpy(), layout, kv_cache.num_blocks)


def make_mover(kv_cache: KvCache, transport: str) -> KvMover | None:
    """The mover over `kv_cache` for a loading `transport`; None for transports.BYTES and for an FP8 cache, whose
    KV moves as KvExport bytes: those carry its scales, and an import requantizes to the local ones."""
    if transport not in transports.LOADING or kv_cache.is_quantized:
        return None
    return KvMover(paged_cache(kv_cache), kv_cache.layout, transport)
