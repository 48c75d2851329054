"""Decode under CUDA graphs: one graph per batch-size bucket, captured once over static buffers.

A decode-only step of n sequences copies its inputs into the buffers' first n rows, pads the rest
of its bucket (slot -1 writes nowhere, seq_len 0 attends to nothing), replays and reads n rows.
Only the kernel backend is capturable (the torch backend's masks change shape every step).
"""

import torch

from engines.native.attention.varlen import VarlenMetadata

MAX_SMALL_BUCKET = 8  # 1, 2, 4, 8, then steps of 16


def graph_buckets(max_num_seqs: int) -> list[int]:
    buckets = [b for b in (1, 2, 4, 8) if b < max_num_seqs]
    buckets += list(range(16, max_num_seqs, 16))
    return buckets + [max_num_seqs]


def bucket_for(num_seqs: int, buckets: list[int]) -> int:
    return next(b for b in buckets if b >= num_seqs)


class DecodeGraphs:
    def __init__(self, model, max_num_seqs: int, max_blocks_per_seq: int, device: str):
        self.model = model
        self.buckets = graph_buckets(max_num_seqs)
        size = self.buckets[-1]
        self.input_ids = torch.zeros(size, dtype=torch.long, device=device)
        self.positions = torch.zeros(size, dtype=torch.long, device=device)
        self.slot_mapping = torch.full((size,), -1, dtype=torch.long, device=device)
        self.seq_lens = torch.zeros(size, dtype=torch.int32, device=device)
        self.block_table = torch.zeros(size, max_blocks_per_seq, dtype=torch.int32, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}  # [bucket, hidden_size] views into the graphs' pool

    @property
    def max_num_seqs(self) -> int:
        return self.buckets[-1]

    @torch.inference_mode()
    def capture(self) -> None:
        pool = None
        for size in reversed(self.buckets):  # largest first: smaller graphs reuse its memory
            self._forward(size)  # warm-up: compiles the kernels outside the capture
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[size] = self._forward(size)
            pool = graph.pool()
            self.graphs[size] = graph
        torch.cuda.synchronize()

    def run(
        self,
        input_ids: list[int],
        positions: list[int],
        slots: list[int],
        block_tables: list[list[int]],
        seq_lens: list[int],
    ) -> torch.Tensor:
        """One decode step of len(input_ids) sequences; returns their hidden states [n, hidden_size]."""
        n = len(input_ids)
        size = bucket_for(n, self.buckets)
        width = max(len(t) for t in block_tables)
        table = [t + [0] * (width - len(t)) for t in block_tables]
        self._fill(self.input_ids, size, n, input_ids, 0)
        self._fill(self.positions, size, n, positions, 0)
        self._fill(self.slot_mapping, size, n, slots, -1)
        self._fill(self.seq_lens, size, n, seq_lens, 0)
        self.block_table[:n, :width].copy_(torch.tensor(table, dtype=torch.int32), non_blocking=True)
        self.graphs[size].replay()
        return self.outputs[size][:n]

    def _forward(self, size: int) -> torch.Tensor:
        meta = VarlenMetadata(
            slot_mapping=self.slot_mapping[:size],
            num_decode_tokens=size,
            decode_seq_lens=self.seq_lens[:size],
            decode_block_table=self.block_table[:size],
        )
        return self.model(self.input_ids[:size], self.positions[:size], meta)

    @staticmethod
    def _fill(buffer: torch.Tensor, size: int, n: int, values: list[int], pad: int) -> None:
        buffer[:size].copy_(torch.tensor(values + [pad] * (size - n), dtype=buffer.dtype), non_blocking=True)
