"""Every Triton launch the engine makes at Llama-3.1-8B shapes on an H100, recorded without a GPU: the
real launch wrappers run on `meta` tensors that claim to be CUDA, with the H100's SM count, and each
`kernel[grid](...)` is captured instead of run. Allocates nothing real and compiles nothing (aot.py does).
"""

import contextlib
from dataclasses import dataclass, field

import torch

from engines.native.cuda_graphs import graph_buckets

H100_SMS = 132
BF16, FP8 = torch.bfloat16, torch.float8_e4m3fn


@dataclass(frozen=True, slots=True)
class Llama8B:
    hidden: int = 4096
    num_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    intermediate: int = 14336
    block_size: int = 16
    max_num_seqs: int = 256  # decode batches: the CUDA-graph buckets up to this
    prefill_tokens: tuple = (512, 2048, 8192)  # token counts of prefill steps
    max_context: int = 8192

    def gemms(self) -> dict[str, tuple[int, int]]:
        """(out_features, in_features) of each linear layer of a decoder layer."""
        qkv = (self.num_heads + 2 * self.num_kv_heads) * self.head_dim
        return {
            "qkv_proj": (qkv, self.hidden),
            "o_proj": (self.hidden, self.hidden),
            "gate_up_proj": (2 * self.intermediate, self.hidden),
            "down_proj": (self.hidden, self.intermediate),
        }

    def row_counts(self) -> list[int]:
        return graph_buckets(self.max_num_seqs) + list(self.prefill_tokens)


@dataclass(slots=True)
class Launch:
    """One captured launch: the JIT function, its arguments by name, its launch options, and what it was for."""

    kernel: object
    args: dict
    options: dict
    label: str


@dataclass(slots=True)
class Recorder:
    label: str = ""
    launches: list[Launch] = field(default_factory=list)

    def launcher(self, kernel, grid):
        def launch(*args, **kwargs):
            names = [p.name for p in kernel.params]
            bound = dict(zip(names, args)) | {k: v for k, v in kwargs.items() if k in names}
            options = {k: v for k, v in kwargs.items() if k not in names}
            self.launches.append(Launch(kernel, bound, options, self.label))

        return launch


class _OnCuda(torch.Tensor):
    """A meta tensor the wrappers take for a CUDA one (they pick GPU tiles and warps on `is_cuda`)."""

    @property
    def is_cuda(self) -> bool:
        return True


def meta(*shape, dtype=BF16) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device="meta").as_subclass(_OnCuda)


@contextlib.contextmanager
def recording():
    """Capture launches instead of running them; the wrappers see an H100 and the GPU's dot precision."""
    import triton

    from engines.native.kernels import fp8_gemm, nvfp4_gemm, paged_decode

    recorder = Recorder()
    saved = triton.KernelInterface.__getitem__
    patched = [
        (m, name, getattr(m, name))
        for m in (fp8_gemm, nvfp4_gemm, paged_decode)
        for name in ("num_sms", "upcast_dots")
        if hasattr(m, name)
    ]
    triton.KernelInterface.__getitem__ = lambda kernel, grid: recorder.launcher(kernel, grid)
    for module, name, _ in patched:
        setattr(module, name, (lambda device: H100_SMS) if name == "num_sms" else (lambda: False))
    try:
        yield recorder
    finally:
        triton.KernelInterface.__getitem__ = saved
        for module, name, fn in patched:
            setattr(module, name, fn)


def record_all(shape: Llama8B = Llama8B()) -> list[Launch]:
    """Every launch of every kernel at `shape`, both KV-cache dtypes, every quant mode the engine uses."""
    with recording() as rec:
        for step in (_attention, _small_ops, _fp8_gemms, _nvfp4_gemms):
            step(shape, rec)
    return rec.launches


def _attention(s: Llama8B, rec: Recorder) -> None:
    from engines.native.kernels.kv_write import write_kv
    from engines.native.kernels.paged_decode import paged_decode
    from engines.native.kernels.paged_prefill import paged_prefill, tiles_for
    from engines.native.kernels.rope_kv import rope_and_write_kv

    max_blocks = s.max_context // s.block_size
    i32 = torch.int32
    for kv in (BF16, FP8):
        kv_name = "bf16" if kv == BF16 else "fp8"
        num_blocks = s.max_num_seqs * max_blocks
        cache = meta(num_blocks, s.block_size, s.num_kv_heads, s.head_dim, dtype=kv)
        for batch in graph_buckets(s.max_num_seqs):  # max_seq_len unknown under a graph: splits by batch
            rec.label = f"decode kv={kv_name} batch={batch}"
            q = meta(batch, s.num_heads, s.head_dim)
            paged_decode(q, cache, cache, meta(batch, max_blocks, dtype=i32), meta(batch, dtype=i32), 0.088)
        for tokens in s.prefill_tokens:
            rec.label = f"prefill kv={kv_name} tokens={tokens}"
            q = meta(tokens, s.num_heads, s.head_dim)
            spans = meta(4, dtype=i32)
            paged_prefill(
                q,
                cache,
                cache,
                meta(4, max_blocks, dtype=i32),
                spans,
                spans,
                spans,
                tokens,
                0.088,
                out=torch.empty_like(q),
                **tiles_for(s.head_dim, True),
            )
            qkv = meta(tokens, (s.num_heads + 2 * s.num_kv_heads) * s.head_dim)
            q_view, k_view, v_view = _split_qkv(qkv, s)
            rec.label = f"rope+kv write kv={kv_name} tokens={tokens}"
            rope_and_write_kv(
                q_view,
                k_view,
                v_view,
                meta(tokens, dtype=torch.int64),
                meta(s.max_context, s.head_dim, dtype=torch.float32),
                meta(s.max_context, s.head_dim, dtype=torch.float32),
                cache,
                cache,
                meta(tokens, dtype=torch.int64),
            )
            rec.label = f"kv write (no rotary) kv={kv_name} tokens={tokens}"
            write_kv(k_view, v_view, cache, cache, meta(tokens, dtype=torch.int64))


def _split_qkv(qkv: torch.Tensor, s: Llama8B):
    """q, k, v as the model's strided views of its fused projection."""
    tokens = qkv.shape[0]
    q_size, kv_size = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim
    q = qkv[:, :q_size].view(tokens, s.num_heads, s.head_dim)
    k = qkv[:, q_size : q_size + kv_size].view(tokens, s.num_kv_heads, s.head_dim)
    v = qkv[:, q_size + kv_size :].view(tokens, s.num_kv_heads, s.head_dim)
    return q, k, v


def _small_ops(s: Llama8B, rec: Recorder) -> None:
    from engines.native.kernels.fp8_gemm import quantize_fp8_act
    from engines.native.kernels.rms_norm import QUANT_DYNAMIC, QUANT_NONE, QUANT_STATIC, rms_norm
    from engines.native.kernels.silu_mul import silu_mul

    scale = meta(dtype=torch.float32)
    for rows in s.row_counts():
        for mode, name in ((QUANT_NONE, "bf16"), (QUANT_STATIC, "fp8 static"), (QUANT_DYNAMIC, "fp8 dynamic")):
            given = scale if mode == QUANT_STATIC else None
            for residual in (None, meta(rows, s.hidden)):
                rec.label = f"rms_norm {name}{' +residual' if residual is not None else ''}"
                rms_norm(meta(rows, s.hidden), meta(s.hidden), 1e-5, residual, mode, given)
            rec.label = f"silu_mul {name}"
            silu_mul(meta(rows, 2 * s.intermediate), mode, given)
        for k in (s.hidden, s.intermediate):
            for given, name in ((scale, "static"), (None, "dynamic")):
                rec.label = f"fp8 act quant {name} k={k}"
                quantize_fp8_act(meta(rows, k), given)


def _fp8_gemms(s: Llama8B, rec: Recorder) -> None:
    from engines.native.kernels.fp8_gemm import fp8_w8a16_matmul
    from engines.native.quant.gpu_modules import GEMV_MAX_ROWS

    for layer, (n, k) in s.gemms().items():
        w, ws = meta(n, k, dtype=FP8), meta(n, dtype=torch.float32)
        for rows in s.row_counts():
            # gpu_modules.Fp8LinearScaledMm._w8a16's tiles: the dispatcher may time W8A16 at any batch
            tiles = {} if rows <= GEMV_MAX_ROWS else {"block_m": 64, "split_k": 1}
            rec.label = f"fp8 w8a16 {layer} m={rows}"
            fp8_w8a16_matmul(meta(rows, k), w, ws, None, **tiles)


def _nvfp4_gemms(s: Llama8B, rec: Recorder) -> None:
    from engines.native.kernels.nvfp4_gemm import dequantize_nvfp4, nvfp4_matmul

    for layer, (n, k) in s.gemms().items():
        w, ws, g = meta(n, k // 2, dtype=torch.uint8), meta(n, k // 16, dtype=FP8), meta(dtype=torch.float32)
        for rows in s.row_counts():
            rec.label = f"nvfp4 in-registers {layer} m={rows}"
            nvfp4_matmul(meta(rows, k), w, ws, g)
        rec.label = f"nvfp4 dequant {layer}"
        dequantize_nvfp4(w, ws, g, BF16)
