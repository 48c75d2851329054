"""The native engine at GPU speed, in one run: card ceilings (copy bandwidth, bf16/fp8 matmul rate),
kernel checks at model shapes, the kernels alone (paged decode bytes/s, prefill attention FLOP/s, FP8
and NVFP4 linear layers against bf16 at every m), batch-1 decode for bf16/FP8/NVFP4 weights x bf16/FP8
KV, prefill and offline throughput; each figure against its ceiling, then the issue's targets, met or
not. Prints tables, writes JSON.

    python bench/gpu_engine.py --json bench/out/gpu-engine.json      # CUDA, Llama-3.1-8B shape, random weights
    python bench/gpu_engine.py --dry-run                              # CPU, tiny shapes, seconds (CI)
    python bench/gpu_engine.py --sections offline --overlap both      # the engine loop, overlap off vs on

Ceilings (bench/gpu_ceilings.py): decode tok/s <= copy bandwidth / bytes read per token (weights + KV);
prefill and offline tok/s <= the matmul rate over the FLOPs they need (linear layers, lm_head for the
rows that sample, causal attention).
"""

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from engines.base.engine_configs import CacheConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from bench import gpu_ceilings, gpu_kernels, gpu_report  # noqa: E402
from bench.gpu_kernels import AttnShape  # noqa: E402


@dataclass(frozen=True, slots=True)
class Plan:
    device: str
    dtype: str
    shape: str | None  # None: tiny
    matmul_size: int
    copy_bytes: int
    check_scale: int  # multiplies the kernel checks' shapes
    decode_prompt: int
    decode_tokens: int
    prefill_lens: tuple[int, ...]
    offline: tuple[tuple[int, int, int], ...]  # (num_requests, input_len, output_len)
    max_num_seqs: int
    max_model_len: int
    attn: AttnShape
    decode_kernel: tuple[tuple[int, int], ...]  # (num_seqs, context)
    linears: tuple[tuple[str, int, int], ...]  # (name, out, in)
    linear_ms: tuple[int, ...]
    target_kernels: tuple[str, ...]  # paged decode kernel configs held to the bytes/s target
    offline_goals: tuple[float, ...]  # output tok/s goal of each `offline` entry (FP8 weights and KV)


GPU_PLAN = Plan(
    "cuda",
    "bfloat16",
    "llama-3.1-8b",
    8192,
    1 << 30,
    8,
    128,
    128,
    (2048, 8192),
    ((512, 128, 128), (128, 1000, 1000)),
    512,
    10240,
    AttnShape(32, 8, 128, 16),
    ((1, 1024), (1, 8192), (32, 1024), (128, 1024), (128, 2000)),
    (("qkv_proj", 6144, 4096), ("o_proj", 4096, 4096), ("gate_up_proj", 28672, 4096), ("down_proj", 4096, 14336)),
    (1, 4, 16, 64, 256, 1024, 4096),
    ("128 x 1024", "1 x 8192"),
    (14000.0, 7600.0),
)  # half of TensorRT-LLM's FP8 figures
DRY_PLAN = Plan(
    "cpu",
    "float32",
    None,
    256,
    1 << 22,
    1,
    16,
    4,
    (32, 64),
    ((4, 8, 8), (2, 16, 16)),
    4,
    128,
    AttnShape(4, 2, 16, 16),
    ((1, 64), (2, 32)),
    (("qkv_proj", 128, 64), ("down_proj", 64, 128)),
    (1, 32),
    ("2 x 32", "1 x 64"),
    (14000.0, 7600.0),
)


@dataclass(slots=True)
class Report:
    ceilings: dict = field(default_factory=dict)
    checks: list = field(default_factory=list)
    rows: list = field(default_factory=list)  # (section, config, value, unit, ceiling, fraction)
    linears: list = field(default_factory=list)  # gpu_kernels.linear_layers rows
    save: Callable = field(default=lambda report: None, repr=False)  # after each row: a timed-out run keeps them

    def add(self, section: str, config: str, value: float, unit: str, ceiling: float | None, **extra) -> None:
        frac = value / ceiling if ceiling else None
        self.rows.append(
            {
                "section": section,
                "config": config,
                "value": value,
                "unit": unit,
                "ceiling": ceiling,
                "fraction": frac,
                **extra,
            }
        )
        self.save(self)


# -- card ceilings ---------------------------------------------------------------------------
def timed(fn, device: str, min_s: float = 0.2) -> float:
    """Seconds per call, after a warm-up, over enough calls to last min_s."""
    fn()
    sync(device)
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < min_s or calls < 3:
        fn()
        calls += 1
        if calls % 8 == 0:
            sync(device)
    sync(device)
    return (time.perf_counter() - start) / calls


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def copy_bandwidth(plan: Plan) -> float:
    src = torch.empty(plan.copy_bytes, dtype=torch.uint8, device=plan.device)
    dst = torch.empty_like(src)
    return 2 * plan.copy_bytes / timed(lambda: dst.copy_(src), plan.device)  # read + write, bytes/s


def matmul_rate(plan: Plan, fp8: bool = False) -> float | None:
    n = plan.matmul_size
    a = torch.randn(n, n, device=plan.device).to(getattr(torch, plan.dtype))
    b = torch.randn(n, n, device=plan.device).to(getattr(torch, plan.dtype))
    if not fp8:
        return 2 * n**3 / timed(lambda: a @ b, plan.device)
    if not plan.device.startswith("cuda") or torch.cuda.get_device_capability() < (8, 9):
        return None
    a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn).t()
    one = torch.ones((), device=plan.device)
    return (
        2
        * n**3
        / timed(lambda: torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16), plan.device)
    )


# -- the kernels alone -------------------------------------------------------------------------
def bench_kernels(plan: Plan, report: Report) -> None:
    dtype, copy_bw = getattr(torch, plan.dtype), report.ceilings["copy_bytes_per_s"]
    for num_seqs, ctx in plan.decode_kernel:
        r = gpu_kernels.decode_attention(num_seqs, ctx, plan.attn, dtype, plan.device)
        # NOTE: the copy ceiling counts read + write; a kernel that only reads could beat it a little
        report.add(
            "paged decode kernel",
            r["config"],
            r["bytes_per_s"],
            "bytes/s",
            copy_bw,
            seconds=r["seconds"],
            sdpa_seconds=r["sdpa_seconds"],
        )
    r = gpu_kernels.prefill_attention(max(plan.prefill_lens), plan.attn, dtype, plan.device)
    report.add(
        "prefill attention kernel",
        r["config"],
        r["flops_per_s"],
        "FLOP/s",
        report.ceilings["matmul_flops_per_s"],
        sdpa_flops_per_s=r["sdpa_flops_per_s"],
    )
    report.linears = gpu_kernels.linear_layers(list(plan.linears), plan.linear_ms, dtype, plan.device)


# -- the engine ------------------------------------------------------------------------------
def make_checkpoints(plan: Plan, root: Path) -> dict[str, Path]:
    from engines.native.quant.transform import quantize_checkpoint
    from tandem.models.init import init_model

    quant_device = plan.device if plan.device.startswith("cuda") else "cpu"
    base = init_model(
        root / "bf16", "llama", tiny=plan.shape is None, shape=plan.shape, dtype=plan.dtype, device=quant_device
    )
    return {
        "base": base,
        "fp8": quantize_checkpoint(base, root / "fp8", "fp8", device=quant_device),
        "nvfp4": quantize_checkpoint(base, root / "nvfp4", "nvfp4", device=quant_device),
    }


def engine(plan: Plan, model_dir: Path, kv: str = "auto", max_num_seqs: int = 1, batched: int = 8192):
    from engines.base.engine_configs import BatchConfig
    from engines.native.config import EngineConfig
    from engines.native.runner import build_core

    return build_core(
        EngineConfig(
            model=str(model_dir),
            dtype=plan.dtype,
            device=plan.device,
            kv_cache_dtype=kv,
            batch=BatchConfig(max_num_seqs, batched, plan.max_model_len),
            cache=CacheConfig(gpu_memory_utilization=0.0, kv_cache_memory_fraction=0.85),
        )
    )


class _Sink:
    """The engine loop's channel with no client: messages are built and encoded as a worker's, then dropped;
    notes when the first outputs left."""

    def __init__(self):
        self.first_s: float | None = None

    def recv(self, timeout):
        return []

    def send(self, message) -> None:
        from engines.core.messages import encode

        encode(message)
        if self.first_s is None and getattr(message, "outputs", None):
            self.first_s = time.perf_counter()


def run_requests(
    core, requests: list[tuple[int, int]], device: str, overlap: bool | None = None
) -> tuple[float, float]:
    """(input_len, output_len) each, greedy, ignore EOS; returns (seconds, seconds to the first output).
    overlap None: the bare core, step by step; else the engine loop as a worker runs it, overlap on or off."""
    from engines.base import EngineRequest, SamplingParams
    from engines.core.loop import EngineLoop

    gen = torch.Generator().manual_seed(0)
    vocab = core.info.vocab_size
    for i, (n_in, n_out) in enumerate(requests):
        ids = tuple(torch.randint(0, vocab, (n_in,), generator=gen).tolist())
        core.add(EngineRequest(f"r{i}-{time.monotonic_ns()}", ids, SamplingParams(max_tokens=n_out, ignore_eos=True)))
    sync(device)
    start, first, sink = time.perf_counter(), None, _Sink()
    loop = EngineLoop(core, sink, overlap) if overlap is not None else None
    while core.has_work or (loop is not None and loop.unsent):
        if loop is not None:
            loop.iterate()
        elif core.step() and first is None:
            first = time.perf_counter() - start
    sync(device)
    if loop is not None and sink.first_s is not None:
        first = sink.first_s - start
    return time.perf_counter() - start, first or 0.0


def weight_bytes(core) -> int:
    model = core.runner.model
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    embed = model.model.embed_tokens.weight
    return total - (0 if model.config.tie_word_embeddings else embed.numel() * embed.element_size())


def model_flops(core) -> gpu_ceilings.ModelFlops:
    """Matmul weights counted from the config (quantized layers pack theirs), lm_head apart."""
    cfg = core.runner.model.config
    q, kv = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
    per_layer = cfg.hidden_size * (q + 2 * kv) + q * cfg.hidden_size + 3 * cfg.hidden_size * cfg.intermediate_size
    return gpu_ceilings.ModelFlops(
        cfg.num_hidden_layers * per_layer,
        cfg.vocab_size * cfg.hidden_size,
        cfg.num_hidden_layers,
        cfg.num_attention_heads,
        cfg.head_dim,
    )


def bench_decode(plan: Plan, ckpts: dict[str, Path], report: Report) -> None:
    from engines.native.kv_cache import bytes_per_block

    for weights, path in ckpts.items():
        for kv in ("auto", "fp8"):
            core = engine(plan, path, kv)
            run_requests(core, [(plan.decode_prompt, 2)], plan.device)  # warm-up (kernels compile, GEMMs picked)
            prefill_s, _ = run_requests(core, [(plan.decode_prompt, 1)], plan.device)
            total_s, _ = run_requests(core, [(plan.decode_prompt, plan.decode_tokens + 1)], plan.device)
            tok_s = plan.decode_tokens / max(total_s - prefill_s, 1e-9)
            ctx = plan.decode_prompt + plan.decode_tokens // 2
            kv_bytes = bytes_per_block(core.info.kv_layout) * ctx / core.info.kv_layout.block_size
            ceiling = report.ceilings["copy_bytes_per_s"] / (weight_bytes(core) + kv_bytes)
            label = plan.dtype if weights == "base" else weights
            report.add(
                "decode batch 1", f"weights={label} kv={'fp8' if kv == 'fp8' else plan.dtype}", tok_s, "tok/s", ceiling
            )
            del core
            free_memory(plan.device)


def bench_prefill(plan: Plan, ckpts: dict[str, Path], report: Report) -> None:
    core = engine(plan, ckpts["base"], batched=max(plan.prefill_lens))
    run_requests(core, [(plan.prefill_lens[0], 1)], plan.device)  # warm-up
    rate = report.ceilings["matmul_flops_per_s"]
    for n in plan.prefill_lens:
        secs, _ = run_requests(core, [(n, 1)], plan.device)
        report.add(
            "prefill",
            f"{n} tokens {plan.dtype}",
            n / secs,
            "tok/s",
            gpu_ceilings.prefill_ceiling(model_flops(core), n, rate),
        )
    del core
    free_memory(plan.device)


def bench_offline(plan: Plan, ckpts: dict[str, Path], report: Report, overlaps: tuple = (None,)) -> None:
    bf16_rate = report.ceilings["matmul_flops_per_s"]
    for weights, overlap in [(w, o) for w in ("base", "fp8") for o in overlaps]:
        core = engine(plan, ckpts[weights], "fp8" if weights == "fp8" else "auto", plan.max_num_seqs)
        run_requests(core, [(8, 4)] * min(4, plan.max_num_seqs), plan.device)  # warm-up
        rate = (report.ceilings["fp8_matmul_flops_per_s"] if weights == "fp8" else None) or bf16_rate
        for num, n_in, n_out in plan.offline:
            secs, _ = run_requests(core, [(n_in, n_out)] * num, plan.device, overlap)
            ceiling = gpu_ceilings.offline_ceiling(model_flops(core), n_in, n_out, rate, bf16_rate)
            label = f"weights={plan.dtype} kv={plan.dtype}" if weights == "base" else "weights=fp8 kv=fp8"
            report.add(
                "offline", offline_config(num, n_in, n_out, label, overlap), num * n_out / secs, "output tok/s", ceiling
            )
        del core
        free_memory(plan.device)


def offline_config(num: int, n_in: int, n_out: int, label: str, overlap: bool | None) -> str:
    loop = "" if overlap is None else f" loop overlap={'on' if overlap else 'off'}"
    return f"{num} x {n_in}/{n_out} {label}{loop}"


def free_memory(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


# -- the run ---------------------------------------------------------------------------------
SECTIONS = ("kernels", "decode", "prefill", "offline")


def run(plan: Plan, sections: list[str], overlaps: tuple = (None,), save=lambda report: None) -> Report:
    """`save(report)` after the checks and each row, so a run stopped at its time limit keeps what it measured."""
    report = Report(save=save)
    report.ceilings["copy_bytes_per_s"] = copy_bandwidth(plan)
    report.ceilings["matmul_flops_per_s"] = matmul_rate(plan)
    report.ceilings["fp8_matmul_flops_per_s"] = matmul_rate(plan, fp8=True)
    report.checks = [c.to_dict() for c in gpu_kernels.kernel_checks(plan)]
    report.save(report)
    # NOTE: timed even when a check fails (a lent GPU is rare); the JSON and the table name the failed checks
    if "kernels" in sections:
        bench_kernels(plan, report)
    with tempfile.TemporaryDirectory(dir=os.environ.get("TANDEM_BENCH_TMP")) as tmp:
        ckpts = make_checkpoints(plan, Path(tmp)) if set(sections) - {"kernels"} else {}
        for name, fn in (("decode", bench_decode), ("prefill", bench_prefill)):
            if name in sections:
                fn(plan, ckpts, report)
        if "offline" in sections:
            bench_offline(plan, ckpts, report, overlaps)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny shapes, kernels in Triton's interpreter")
    parser.add_argument("--sections", nargs="+", default=list(SECTIONS), choices=SECTIONS)
    parser.add_argument(
        "--overlap",
        choices=["core", "off", "on", "both"],
        default="core",
        help="offline: the bare core stepping (core), or the engine loop as a worker runs it, with "
        "overlap off, on, or both side by side",
    )
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--engine",
        choices=["native", "trtllm"],
        default="native",
        help="trtllm: the TensorRT-LLM engine through tandem's adapter (bench/trtllm_engine.py)",
    )
    parser.add_argument("--model", type=Path, default=None, help="--engine trtllm: a checkpoint (default: random 8B)")
    parser.add_argument("--kv-cache-dtype", choices=["auto", "fp8"], default="auto", help="--engine trtllm")
    args = parser.parse_args(argv)
    if args.engine == "trtllm":
        from bench import trtllm_engine

        return trtllm_engine.main(args.model, args.dry_run, args.json, args.kv_cache_dtype)
    if args.dry_run:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # NOTE: before any kernel module is imported
        torch.set_num_threads(1)
    elif not torch.cuda.is_available():
        parser.error("no CUDA device; use --dry-run on CPU")
    plan = DRY_PLAN if args.dry_run else GPU_PLAN
    overlaps = {"core": (None,), "off": (False,), "on": (True,), "both": (False, True)}[args.overlap]
    device = "cpu (dry run)" if args.dry_run else torch.cuda.get_device_name()
    offline = tuple(
        (offline_config(num, n_in, n_out, "weights=fp8 kv=fp8", overlaps[-1]), goal)
        for (num, n_in, n_out), goal in zip(plan.offline, plan.offline_goals)
    )

    def targets(report: Report) -> list:
        return gpu_ceilings.targets(report.rows, plan.dtype, plan.target_kernels, max(plan.prefill_lens), offline)

    def save(report: Report) -> None:
        if args.json:
            write_json(args.json, device, plan, report, targets(report))

    report = run(plan, args.sections, overlaps, save)
    save(report)
    failed = [c["name"] for c in report.checks if not c["ok"]]
    print(f"device: {device}  dtype: {plan.dtype}  shape: {plan.shape or 'tiny'}")
    print(gpu_report.render(report.ceilings, report.checks, report.rows, report.linears, targets(report)))
    if failed:
        print(f"FAILED kernel checks (the timings above include these kernels): {', '.join(failed)}")
    return 1 if failed else 0


def write_json(path: Path, device: str, plan: Plan, report: Report, goals: list) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    checks_failed = [c["name"] for c in report.checks if not c["ok"]]
    body = {
        "device": device,
        "plan": repr(plan),
        "ceilings": report.ceilings,
        "checks": report.checks,
        "checks_failed": checks_failed,
        "rows": report.rows,
        "linears": report.linears,
        "targets": goals,
    }
    path.write_text(json.dumps(body, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
