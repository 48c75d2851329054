"""The paged KV cache: one allocation [layers, 2, blocks, block_size, kv_heads, head_dim],
per-layer views for attention, and block export/import as raw bytes.

An FP8 (E4M3) cache stores k / k_scale and v / v_scale with one (k, v) scale pair per layer; exports
carry the scales and an import with other scales is requantized to this cache's."""

import os

import torch

from engines.base.requests import FP8_KV_DTYPE, check_importable
from engines.base.types import KvExport, KvLayout

__all__ = ["FP8_KV_DTYPE", "FP8_MAX", "KvCache", "available_memory", "bytes_per_block", "check_importable"]
FP8_MAX = 448.0  # largest finite E4M3 value


class KvCache:
    def __init__(self, layout: KvLayout, num_blocks: int, device: str, scales: tuple[float, ...] = ()):
        self.layout = layout
        self.num_blocks = num_blocks
        self.dtype = getattr(torch, layout.dtype)
        self.is_quantized = layout.dtype == FP8_KV_DTYPE
        # [num_layers, 2] float32 (k, v) per layer; None for an unquantized cache
        self.scales = _layer_scales(layout, scales, device) if self.is_quantized else None
        # NOTE: zeros, not empty: padded gathers read unused slots, and NaN * 0 is NaN.
        self.tensor = torch.zeros(
            layout.num_layers,
            2,
            num_blocks,
            layout.block_size,
            layout.num_kv_heads,
            layout.head_dim,
            dtype=self.dtype,
            device=device,
        )

    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.tensor[index, 0], self.tensor[index, 1]  # [num_blocks, block_size, kv_heads, head_dim]

    def export(self, block_ids: list[int], token_ids: tuple[int, ...]) -> KvExport:
        ids = torch.tensor(block_ids, dtype=torch.long, device=self.tensor.device)
        if self.is_quantized:  # NOTE: CPU index ops do not take float8 tensors; bytes are the same
            blocks = self.tensor.view(torch.uint8).index_select(2, ids).contiguous().cpu()
            return KvExport(
                layout=self.layout,
                token_ids=token_ids,
                num_blocks=len(block_ids),
                data=blocks.numpy().tobytes(),
                scales=tuple(self.scales.flatten().tolist()),
            )
        blocks = self.tensor.index_select(2, ids).contiguous().cpu()  # [layers, 2, n, bs, kv_heads, head_dim]
        data = blocks.view(torch.uint8).numpy().tobytes()
        return KvExport(layout=self.layout, token_ids=token_ids, num_blocks=len(block_ids), data=data)

    def import_(self, block_ids: list[int], kv: KvExport) -> None:
        check_importable(self.layout, kv)
        raw = torch.frombuffer(bytearray(kv.data), dtype=torch.uint8)
        shape = (
            self.layout.num_layers,
            2,
            kv.num_blocks,
            self.layout.block_size,
            self.layout.num_kv_heads,
            self.layout.head_dim,
        )
        blocks = raw.view(self.dtype).view(shape).to(self.tensor.device)
        ids = torch.tensor(block_ids, dtype=torch.long, device=self.tensor.device)
        if self.is_quantized:
            blocks = self._requantized(blocks, kv.scales).view(torch.uint8)
            self.tensor.view(torch.uint8).index_copy_(2, ids, blocks)
            return
        self.tensor.index_copy_(2, ids, blocks)

    def _requantized(self, blocks: torch.Tensor, scales: tuple[float, ...]) -> torch.Tensor:
        theirs = torch.tensor(scales, dtype=torch.float32, device=blocks.device).view(-1, 2)
        if torch.equal(theirs, self.scales.to(blocks.device)):
            return blocks
        ratio = (theirs / self.scales.to(blocks.device)).view(-1, 2, 1, 1, 1, 1)
        return (blocks.float() * ratio).clamp(-FP8_MAX, FP8_MAX).to(self.dtype)


def _layer_scales(layout: KvLayout, scales: tuple[float, ...], device: str) -> torch.Tensor:
    if scales and len(scales) != 2 * layout.num_layers:
        raise ValueError(f"an FP8 KV cache needs 2 scales per layer ({2 * layout.num_layers}), got {len(scales)}")
    values = torch.tensor(scales or (1.0,) * (2 * layout.num_layers), dtype=torch.float32, device=device)
    if not bool((values > 0).all()):
        raise ValueError("FP8 KV cache scales must be > 0")
    return values.view(layout.num_layers, 2)


def bytes_per_block(layout: KvLayout) -> int:
    itemsize = torch.empty(0, dtype=getattr(torch, layout.dtype)).element_size()
    return layout.num_layers * 2 * layout.block_size * layout.num_kv_heads * layout.head_dim * itemsize


def gpu_share_left(device: str, utilization: float) -> int:
    """vLLM's gpu_memory_utilization: bytes left for KV when this worker may fill `utilization` of the card and
    what is in use already (its weights, and any other worker's share on the same card) counts against it."""
    free, total = torch.cuda.mem_get_info(torch.device(device))
    return max(0, int(total * utilization) - (total - free))


def available_memory(device: str) -> int:
    if device.startswith("cuda"):
        free, _ = torch.cuda.mem_get_info(torch.device(device))
        return free
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
