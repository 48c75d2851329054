"""Each kernel against a plain-PyTorch reference on random data. CI runs these on CPU under
TRITON_INTERPRET=1 with tiny shapes; bench/gpu_engine.py runs them on the GPU at model shapes
before it times anything. A check passes when rel_error <= bound and the output has no NaN.

rel_error = max |out - ref| / max |ref|, the reference computed in fp32 from the same stored values.
"""

import math
from dataclasses import asdict, dataclass

import torch

from engines.base.block_hash import num_blocks_for

# NOTE: bounds per compute dtype. float32 allows for TF32 in the prefill tl.dot on GPUs (10-bit
# mantissa); bf16 (8-bit mantissa) and fp16 (11-bit) for rounding of inputs, P and the output.
REL_BOUNDS = {torch.float32: 2e-3, torch.bfloat16: 3e-2, torch.float16: 5e-3}
FP8_MAX = 448.0


@dataclass(frozen=True, slots=True)
class CheckResult:
    name: str
    rel_error: float
    bound: float

    @property
    def ok(self) -> bool:
        return math.isfinite(self.rel_error) and self.rel_error <= self.bound

    def to_dict(self) -> dict:
        return {**asdict(self), "ok": self.ok}


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.float(), ref.float()
    if torch.isnan(out).any():
        return float("nan")
    return ((out - ref).abs().max() / ref.abs().max().clamp(min=1e-30)).item()


# -- references ------------------------------------------------------------------------------
def gather_keys(cache: torch.Tensor, table_row: torch.Tensor, length: int, scale: float) -> torch.Tensor:
    """[length, num_kv_heads, head_dim] fp32: positions 0..length-1 read through one block table row."""
    block_size = cache.shape[1]
    pos = torch.arange(length, device=cache.device)
    slots = table_row.long()[pos // block_size] * block_size + pos % block_size
    flat = (
        cache.view(torch.uint8).view(-1, *cache.shape[2:])
        if cache.dtype == torch.float8_e4m3fn
        else cache.view(-1, *cache.shape[2:])
    )
    rows = flat.index_select(0, slots)
    return (rows.view(cache.dtype) if cache.dtype == torch.float8_e4m3fn else rows).float() * scale


def attention_reference(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, q_pos: torch.Tensor, scale: float
) -> torch.Tensor:
    """q [n, heads, d] at absolute positions q_pos; keys/values [ctx, kv_heads, d]: causal, GQA, fp32."""
    group = q.shape[1] // keys.shape[1]
    k, v = keys.repeat_interleave(group, 1), values.repeat_interleave(group, 1)
    s = torch.einsum("nhd,chd->hnc", q.float(), k) * scale
    visible = torch.arange(keys.shape[0], device=q.device)[None, :] <= q_pos[:, None]
    p = s.masked_fill(~visible[None], float("-inf")).softmax(-1)
    return torch.einsum("hnc,chd->nhd", p, v)


# -- random problems -------------------------------------------------------------------------
def _cache(num_blocks, block_size, kv_heads, head_dim, dtype, device, gen, scale=1.0):
    x = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=gen, device=device)
    if dtype == torch.float8_e4m3fn:
        return (x / scale).clamp(-FP8_MAX, FP8_MAX).to(dtype)
    return x.to(dtype)


def _tables(seq_lens: list[int], block_size: int, num_blocks: int, gen, device) -> torch.Tensor:
    """Distinct random blocks per sequence, padded with block 0: [num_seqs, max_blocks] int32."""
    need = [num_blocks_for(n, block_size) for n in seq_lens]
    perm = torch.randperm(num_blocks, generator=gen, device=device)[: sum(need)]
    width = max(need)
    rows, at = [], 0
    for n in need:
        rows.append(torch.cat([perm[at : at + n], perm.new_zeros(width - n)]))
        at += n
    return torch.stack(rows).to(torch.int32)


def check_decode(
    device: str,
    dtype: torch.dtype,
    kv_dtype: torch.dtype | None = None,
    seq_lens=(1, 7, 33),
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    block_size=4,
    seed=0,
    **launch,
) -> CheckResult:
    """launch: paged_decode's tiling options (block_n, num_splits)."""
    from engines.native.kernels.paged_decode import paged_decode

    gen = torch.Generator(device).manual_seed(seed)
    kv_dtype = kv_dtype or dtype
    k_scale, v_scale = (0.5, 0.25) if kv_dtype == torch.float8_e4m3fn else (1.0, 1.0)
    num_blocks = sum(num_blocks_for(n, block_size) for n in seq_lens) + 2
    k_cache = _cache(num_blocks, block_size, num_kv_heads, head_dim, kv_dtype, device, gen, k_scale)
    v_cache = _cache(num_blocks, block_size, num_kv_heads, head_dim, kv_dtype, device, gen, v_scale)
    tables = _tables(list(seq_lens), block_size, num_blocks, gen, device)
    q = torch.randn(len(seq_lens), num_heads, head_dim, generator=gen, device=device).to(dtype)
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=device)
    scale = head_dim**-0.5
    out = paged_decode(q, k_cache, v_cache, tables, lens, scale, k_scale, v_scale, **launch)
    ref = torch.cat(
        [
            attention_reference(
                q[i : i + 1],
                gather_keys(k_cache, tables[i], n, k_scale),
                gather_keys(v_cache, tables[i], n, v_scale),
                torch.tensor([n - 1], device=device),
                scale,
            )
            for i, n in enumerate(seq_lens)
        ]
    )
    return CheckResult(f"paged_decode {_name(dtype, kv_dtype)}", rel_error(out, ref), REL_BOUNDS[dtype])


def check_prefill(
    device: str,
    dtype: torch.dtype,
    kv_dtype: torch.dtype | None = None,
    spans=((5, 5), (3, 11), (18, 18), (1, 9)),
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    block_size=4,
    seed=0,
    block_m: int = 16,
    block_n: int = 16,
) -> CheckResult:
    """spans: (q_len, ctx_len) each; ctx_len > q_len means a cached prefix of ctx_len - q_len tokens."""
    from engines.native.kernels.paged_prefill import paged_prefill

    gen = torch.Generator(device).manual_seed(seed)
    kv_dtype = kv_dtype or dtype
    k_scale, v_scale = (0.5, 0.25) if kv_dtype == torch.float8_e4m3fn else (1.0, 1.0)
    ctx_lens = [c for _, c in spans]
    num_blocks = sum(num_blocks_for(c, block_size) for c in ctx_lens) + 2
    k_cache = _cache(num_blocks, block_size, num_kv_heads, head_dim, kv_dtype, device, gen, k_scale)
    v_cache = _cache(num_blocks, block_size, num_kv_heads, head_dim, kv_dtype, device, gen, v_scale)
    tables = _tables(ctx_lens, block_size, num_blocks, gen, device)
    q_lens = [n for n, _ in spans]
    q_starts = [sum(q_lens[:i]) + 2 for i in range(len(spans))]  # 2 leading rows stand for decodes
    q = torch.randn(sum(q_lens) + 2, num_heads, head_dim, generator=gen, device=device).to(dtype)
    as_int = lambda xs: torch.tensor(xs, dtype=torch.int32, device=device)  # noqa: E731
    scale = head_dim**-0.5
    out = torch.zeros_like(q)
    paged_prefill(
        q,
        k_cache,
        v_cache,
        tables,
        as_int(q_starts),
        as_int(q_lens),
        as_int(ctx_lens),
        max(q_lens),
        scale,
        k_scale,
        v_scale,
        out=out,
        block_m=block_m,
        block_n=block_n,
    )
    ref = torch.zeros(q.shape, device=device)
    for i, (n, c) in enumerate(spans):
        rows = slice(q_starts[i], q_starts[i] + n)
        ref[rows] = attention_reference(
            q[rows],
            gather_keys(k_cache, tables[i], c, k_scale),
            gather_keys(v_cache, tables[i], c, v_scale),
            torch.arange(c - n, c, device=device),
            scale,
        )
    return CheckResult(f"paged_prefill {_name(dtype, kv_dtype)}", rel_error(out, ref), REL_BOUNDS[dtype])


def check_write_kv(
    device: str,
    dtype: torch.dtype,
    kv_dtype: torch.dtype | None = None,
    num_tokens=9,
    num_kv_heads=2,
    head_dim=16,
    block_size=4,
    seed=0,
) -> CheckResult:
    from engines.native.kernels.kv_write import write_kv, write_kv_reference

    gen = torch.Generator(device).manual_seed(seed)
    kv_dtype = kv_dtype or dtype
    scales = (0.5, 0.25) if kv_dtype == torch.float8_e4m3fn else (1.0, 1.0)
    num_blocks = num_blocks_for(num_tokens, block_size) + 3
    # k and v as strided views of one fused projection, as the model produces them
    kv = torch.randn(num_tokens, 3 * num_kv_heads * head_dim, generator=gen, device=device).to(dtype)
    k = kv[:, : num_kv_heads * head_dim].view(num_tokens, num_kv_heads, head_dim)
    v = kv[:, num_kv_heads * head_dim : 2 * num_kv_heads * head_dim].view(num_tokens, num_kv_heads, head_dim)
    slots = torch.randperm(num_blocks * block_size, generator=gen, device=device)[:num_tokens]
    slots[0] = -1  # a padding row writes nowhere
    caches = [torch.zeros(num_blocks, block_size, num_kv_heads, head_dim, device=device).to(kv_dtype) for _ in range(4)]
    write_kv(k, v, caches[0], caches[1], slots, *scales)
    write_kv_reference(k, v, caches[2], caches[3], slots, *scales)
    same = all(_same_values(a, b) for a, b in ((caches[0], caches[2]), (caches[1], caches[3])))
    return CheckResult(f"write_kv {_name(dtype, kv_dtype)}", 0.0 if same else float("inf"), 0.0)


def _same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    """The write is a copy (or one rounding to FP8): every stored value must be equal. Bytes, except
    that FP8 -0.0 and +0.0 are the same value (torch's cast keeps the sign of a negative that rounds
    to zero; the GPU's may not)."""
    if a.dtype != torch.float8_e4m3fn:
        return torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    a, b = a.view(torch.uint8), b.view(torch.uint8)
    a, b = torch.where(a == 0x80, 0, a), torch.where(b == 0x80, 0, b)  # NOTE: 0x80 is -0.0 in E4M3
    return torch.equal(a, b)


def _name(dtype: torch.dtype, kv_dtype: torch.dtype | None = None) -> str:
    short = lambda d: str(d).removeprefix("torch.")  # noqa: E731
    return short(dtype) if kv_dtype in (None, dtype) else f"{short(dtype)} kv={short(kv_dtype)}"
