"""The paged KV cache: one allocation [layers, 2, blocks, block_size, kv_heads, head_dim],
per-layer views for attention, and block export/import as raw bytes."""
import os

import torch

from engines.base.errors import KvLayoutMismatchError
from engines.base.types import KvExport, KvLayout


class KvCache:
    def __init__(self, layout: KvLayout, num_blocks: int, device: str):
        self.layout = layout
        self.num_blocks = num_blocks
        self.dtype = getattr(torch, layout.dtype)
        # NOTE: zeros, not empty: padded gathers read unused slots, and NaN * 0 is NaN.
        self.tensor = torch.zeros(
            layout.num_layers, 2, num_blocks, layout.block_size, layout.num_kv_heads, layout.head_dim,
            dtype=self.dtype, device=device,
        )

    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.tensor[index, 0], self.tensor[index, 1]  # [num_blocks, block_size, kv_heads, head_dim]

    def export(self, block_ids: list[int], token_ids: tuple[int, ...]) -> KvExport:
        ids = torch.tensor(block_ids, dtype=torch.long, device=self.tensor.device)
        blocks = self.tensor.index_select(2, ids).contiguous().cpu()  # [layers, 2, n, bs, kv_heads, head_dim]
        data = blocks.view(torch.uint8).numpy().tobytes()
        return KvExport(layout=self.layout, token_ids=token_ids, num_blocks=len(block_ids), data=data)

    def import_(self, block_ids: list[int], kv: KvExport) -> None:
        check_importable(self.layout, kv)
        raw = torch.frombuffer(bytearray(kv.data), dtype=torch.uint8)
        shape = (self.layout.num_layers, 2, kv.num_blocks, self.layout.block_size,
                 self.layout.num_kv_heads, self.layout.head_dim)
        blocks = raw.view(self.dtype).view(shape).to(self.tensor.device)
        ids = torch.tensor(block_ids, dtype=torch.long, device=self.tensor.device)
        self.tensor.index_copy_(2, ids, blocks)


def check_importable(layout: KvLayout, kv: KvExport) -> None:
    if kv.layout != layout:
        raise KvLayoutMismatchError(f"KV layout {kv.layout} does not match this engine's {layout}")
    num_blocks = -(-kv.num_tokens // layout.block_size)
    itemsize = torch.empty(0, dtype=getattr(torch, layout.dtype)).element_size()
    expected = layout.num_layers * 2 * num_blocks * layout.block_size * layout.num_kv_heads * layout.head_dim
    if kv.num_blocks != num_blocks or len(kv.data) != expected * itemsize:
        raise KvLayoutMismatchError(
            f"KV export holds {kv.num_blocks} blocks / {len(kv.data)} bytes; "
            f"{kv.num_tokens} tokens need {num_blocks} blocks / {expected * itemsize} bytes")


def bytes_per_block(layout: KvLayout) -> int:
    itemsize = torch.empty(0, dtype=getattr(torch, layout.dtype)).element_size()
    return layout.num_layers * 2 * layout.block_size * layout.num_kv_heads * layout.head_dim * itemsize


def available_memory(device: str) -> int:
    if device.startswith("cuda"):
        free, _ = torch.cuda.mem_get_info(torch.device(device))
        return free
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
