"""The native engine at GPU speed, in one run: card ceilings (copy bandwidth, bf16/fp8 matmul rate),
kernel checks at model shapes, batch-1 decode for bf16/FP8/NVFP4 weights x bf16/FP8 KV, prefill
throughput, offline throughput; each figure as a fraction of its ceiling. Prints a table, writes JSON.

    python bench/gpu_engine.py --json bench/out/gpu-engine.json      # CUDA, Llama-3.1-8B shape, random weights
    python bench/gpu_engine.py --dry-run                              # CPU, tiny shapes, seconds (CI)
    python bench/gpu_engine.py --sections offline --overlap both      # the engine loop, overlap off vs on

Ceilings: decode tok/s <= copy bandwidth / bytes read per token (weights + KV); prefill and offline
tok/s <= matmul rate / (2 x linear parameters) FLOPs per token (attention FLOPs not counted).
"""
import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere


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


GPU_PLAN = Plan("cuda", "bfloat16", "llama-3.1-8b", 8192, 1 << 30, 8, 128, 128, (2048, 8192),
                ((512, 128, 128), (128, 1000, 1000)), 256, 10240)
DRY_PLAN = Plan("cpu", "float32", None, 256, 1 << 22, 1, 16, 4, (32, 64), ((4, 8, 8), (2, 16, 16)), 4, 128)


@dataclass(slots=True)
class Report:
    ceilings: dict = field(default_factory=dict)
    checks: list = field(default_factory=list)
    rows: list = field(default_factory=list)  # (section, config, value, unit, ceiling, fraction)

    def add(self, section: str, config: str, value: float, unit: str, ceiling: float | None) -> None:
        frac = value / ceiling if ceiling else None
        self.rows.append({"section": section, "config": config, "value": value, "unit": unit,
                          "ceiling": ceiling, "fraction": frac})


# -- card ceilings ---------------------------------------------------------------------------
def timed(fn, device: str, min_s: float = 0.2) -> float:
    """Seconds per call, after a warm-up, over enough calls to last min_s."""
    fn()
    sync(device)
    calls, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < min_s or calls < 3:
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
    return 2 * n**3 / timed(lambda: torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16),
                            plan.device)


# -- kernel checks ---------------------------------------------------------------------------
def kernel_checks(plan: Plan) -> list:
    from engines.native.kernels import checks

    dtype, s, dev = getattr(torch, plan.dtype), plan.check_scale, plan.device
    fp8 = torch.float8_e4m3fn
    big = {} if s == 1 else {"num_heads": 32, "num_kv_heads": 8, "head_dim": 128, "block_size": 16}
    results = [checks.check_write_kv(dev, dtype, kv, **({} if s == 1 else {"num_tokens": 4096, "num_kv_heads": 8,
                                                                           "head_dim": 128, "block_size": 16}))
               for kv in (None, fp8)]
    for kv in (None, fp8):
        results.append(checks.check_decode(dev, dtype, kv, seq_lens=(1, 7, 33) if s == 1 else (1, 129, 1000, 4097),
                                           **big))
        results.append(checks.check_prefill(dev, dtype, kv, **({} if s == 1 else {
            "spans": ((2048, 2048), (100, 1124), (1, 513)), **big})))
    shapes = [(3, 40, 96)] if s == 1 else [(1, 14336, 4096), (256, 4096, 14336)]
    results += [checks.check_nvfp4_matmul(dev, dtype, m, n, k) for m, n, k in shapes]
    return results


# -- the engine ------------------------------------------------------------------------------
def make_checkpoints(plan: Plan, root: Path) -> dict[str, Path]:
    from engines.native.quant.transform import quantize_checkpoint
    from tandem.models.init import init_model

    base = init_model(root / "bf16", "llama", tiny=plan.shape is None, shape=plan.shape, dtype=plan.dtype)
    quant_device = plan.device if plan.device.startswith("cuda") else "cpu"
    return {"base": base, "fp8": quantize_checkpoint(base, root / "fp8", "fp8", device=quant_device),
            "nvfp4": quantize_checkpoint(base, root / "nvfp4", "nvfp4", device=quant_device)}


def engine(plan: Plan, model_dir: Path, kv: str = "auto", max_num_seqs: int = 1, batched: int = 8192):
    from engines.native.config import EngineConfig
    from engines.native.runner import build_core

    return build_core(EngineConfig(model=str(model_dir), dtype=plan.dtype, device=plan.device, kv_cache_dtype=kv,
                                   max_num_seqs=max_num_seqs, max_num_batched_tokens=batched,
                                   max_model_len=plan.max_model_len, kv_cache_memory_fraction=0.85))


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


def run_requests(core, requests: list[tuple[int, int]], device: str, overlap: bool | None = None
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


def linear_params(core) -> int:
    cfg = core.runner.model.config
    return sum(p.numel() for p in core.runner.model.parameters()) - cfg.vocab_size * cfg.hidden_size * (
        0 if cfg.tie_word_embeddings else 1)


def bench_decode(plan: Plan, ckpts: dict[str, Path], report: Report) -> None:
    from engines.native.kv_cache import bytes_per_block

    for weights, path in ckpts.items():
        for kv in ("auto", "fp8"):
            core = engine(plan, path, kv)
            run_requests(core, [(plan.decode_prompt, 2)], plan.device)  # warm-up (kernels compile)
            prefill_s, _ = run_requests(core, [(plan.decode_prompt, 1)], plan.device)
            total_s, _ = run_requests(core, [(plan.decode_prompt, plan.decode_tokens + 1)], plan.device)
            tok_s = plan.decode_tokens / max(total_s - prefill_s, 1e-9)
            ctx = plan.decode_prompt + plan.decode_tokens // 2
            kv_bytes = bytes_per_block(core.info.kv_layout) * ctx / core.info.kv_layout.block_size
            ceiling = report.ceilings["copy_bytes_per_s"] / (weight_bytes(core) + kv_bytes)
            label = plan.dtype if weights == "base" else weights
            report.add("decode batch 1", f"weights={label} kv={'fp8' if kv == 'fp8' else plan.dtype}", tok_s,
                       "tok/s", ceiling)
            del core
            free_memory(plan.device)


def bench_prefill(plan: Plan, ckpts: dict[str, Path], report: Report) -> None:
    core = engine(plan, ckpts["base"], batched=max(plan.prefill_lens))
    run_requests(core, [(plan.prefill_lens[0], 1)], plan.device)  # warm-up
    for n in plan.prefill_lens:
        secs, _ = run_requests(core, [(n, 1)], plan.device)
        ceiling = report.ceilings["matmul_flops_per_s"] / (2 * linear_params(core))
        report.add("prefill", f"{n} tokens {plan.dtype}", n / secs, "tok/s", ceiling)
    del core
    free_memory(plan.device)


def bench_offline(plan: Plan, ckpts: dict[str, Path], report: Report, overlaps: tuple = (None,)) -> None:
    for weights, overlap in [(w, o) for w in ("base", "fp8") for o in overlaps]:
        core = engine(plan, ckpts[weights], "fp8" if weights == "fp8" else "auto", plan.max_num_seqs)
        run_requests(core, [(8, 4)] * min(4, plan.max_num_seqs), plan.device)  # warm-up
        rate = report.ceilings["fp8_matmul_flops_per_s" if weights == "fp8" else "matmul_flops_per_s"] \
            or report.ceilings["matmul_flops_per_s"]
        for num, n_in, n_out in plan.offline:
            secs, _ = run_requests(core, [(n_in, n_out)] * num, plan.device, overlap)
            ceiling = rate / (2 * linear_params(core)) * n_out / (n_in + n_out)  # output tok/s at the FLOP ceiling
            label = plan.dtype if weights == "base" else "fp8 kv=fp8"
            loop = "" if overlap is None else f" loop overlap={'on' if overlap else 'off'}"
            report.add("offline", f"{num} x {n_in}/{n_out} weights={label}{loop}", num * n_out / secs,
                       "output tok/s", ceiling)
        del core
        free_memory(plan.device)


def free_memory(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


# -- output ----------------------------------------------------------------------------------
def render(report: Report) -> str:
    lines = ["ceilings: " + ", ".join(f"{k}={v:.3g}" if v else f"{k}=n/a" for k, v in report.ceilings.items()), "",
             "| kernel check | rel error | bound | ok |", "|---|---:|---:|---|"]
    lines += [f"| {c['name']} | {c['rel_error']:.2e} | {c['bound']:.0e} | {'yes' if c['ok'] else 'NO'} |"
              for c in report.checks]
    lines += ["", "| section | config | value | unit | ceiling | fraction |", "|---|---|---:|---|---:|---:|"]
    lines += [f"| {r['section']} | {r['config']} | {r['value']:.1f} | {r['unit']} | {r['ceiling']:.1f} | "
              f"{r['fraction']:.3f} |" for r in report.rows]
    return "\n".join(lines)


def run(plan: Plan, sections: list[str], overlaps: tuple = (None,)) -> Report:
    report = Report()
    report.ceilings["copy_bytes_per_s"] = copy_bandwidth(plan)
    report.ceilings["matmul_flops_per_s"] = matmul_rate(plan)
    report.ceilings["fp8_matmul_flops_per_s"] = matmul_rate(plan, fp8=True)
    report.checks = [c.to_dict() for c in kernel_checks(plan)]
    if not all(c["ok"] for c in report.checks):
        return report  # NOTE: no timings from kernels that compute the wrong thing
    with tempfile.TemporaryDirectory(dir=os.environ.get("TANDEM_BENCH_TMP")) as tmp:
        ckpts = make_checkpoints(plan, Path(tmp))
        for name, fn in (("decode", bench_decode), ("prefill", bench_prefill)):
            if name in sections:
                fn(plan, ckpts, report)
        if "offline" in sections:
            bench_offline(plan, ckpts, report, overlaps)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny shapes, kernels in Triton's interpreter")
    parser.add_argument("--sections", nargs="+", default=["decode", "prefill", "offline"],
                        choices=["decode", "prefill", "offline"])
    parser.add_argument("--overlap", choices=["core", "off", "on", "both"], default="core",
                        help="offline: the bare core stepping (core), or the engine loop as a worker runs it, with "
                             "overlap off, on, or both side by side")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--engine", choices=["native", "trtllm"], default="native",
                        help="trtllm: the TensorRT-LLM engine through tandem's adapter (bench/trtllm_engine.py)")
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
    report = run(plan, args.sections, overlaps)
    device = "cpu (dry run)" if args.dry_run else torch.cuda.get_device_name()
    print(f"device: {device}  dtype: {plan.dtype}  shape: {plan.shape or 'tiny'}")
    print(render(report))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"device": device, "plan": plan.__repr__(), "ceilings": report.ceilings,
                                         "checks": report.checks, "rows": report.rows}, indent=2) + "\n")
    return 0 if all(c["ok"] for c in report.checks) else 1


if __name__ == "__main__":
    sys.exit(main())
