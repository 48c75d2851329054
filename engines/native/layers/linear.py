"""Linear layers, including merged ones (q/k/v, gate/up) that run one matmul where the
checkpoint stores several projections; `load_shard` places each checkpoint tensor."""

import torch
from torch import nn

# oneDNN's path beats MKL's dense GEMM at decode-sized batches and loses at prefill sizes (2-core AVX2
# machine: M=32 ~1.4x faster, M=4096 ~1.3x slower). Below a few rows it only adds a fixed cost per call
# (~50 us: the wrapper converts x and the output and sets up the primitive; measured at 64 x 64, where
# neither path does real work), while the dense GEMV streams the weight at memory speed on any ISA.
PACKED_MIN_ROWS = 8
PACKED_MAX_ROWS = 256


class Linear(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None
        self.packed: torch.Tensor | None = None  # oneDNN-blocked copy of weight (CPU only)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is not None and PACKED_MIN_ROWS <= x.shape[0] <= PACKED_MAX_ROWS:
            return torch._C._nn.mkldnn_linear(x.to_mkldnn(), self.packed, self.bias).to_dense()
        return nn.functional.linear(x, self.weight, self.bias)

    def input_quant(self, num_rows: int) -> None:
        """What this layer wants its input quantized as (quant/act.py): nothing, it multiplies in its dtype."""
        return None

    def pack_for_cpu(self) -> None:
        """Also keep the weight in oneDNN's layout, used for batches of PACKED_MIN_ROWS..PACKED_MAX_ROWS."""
        self.packed = self.weight.detach().to_mkldnn()


class MergedLinear(Linear):
    """Checkpoint projections stacked along the output dim, in the order of `shard_sizes`."""

    def __init__(self, in_features: int, shard_sizes: dict[str, int], bias: bool = False):
        super().__init__(in_features, sum(shard_sizes.values()), bias)
        self.offsets: dict[str, tuple[int, int]] = {}
        start = 0
        for name, size in shard_sizes.items():
            self.offsets[name] = (start, size)
            start += size

    def load_shard(self, param_name: str, loaded: torch.Tensor, shard: str) -> None:
        start, size = self.offsets[shard]
        param = getattr(self, param_name)
        if loaded.shape[0] != size or loaded.shape[1:] != param.shape[1:]:
            raise ValueError(f"{shard}.{param_name}: checkpoint shape {tuple(loaded.shape)} does not fit")
        param.data[start : start + size].copy_(loaded)
