"""KV tiers on a GPU, each figure next to its anchor in the same run. Prints a table, writes JSON.

    python bench/kv_tiers_gpu.py --json bench/out/kv_tiers_gpu.json                 # CUDA, Llama-3.1-8B shape
    python bench/kv_tiers_gpu.py --sections copy --dry-run                          # CPU, tiny shapes (CI)

copy: G1 -> G2 (write-through of device blocks to pinned host slots) and G2 -> G1 (an onboarding load through
the runner's copy stream), each in GB/s against one contiguous pinned-host <-> device copy of the same bytes (the
link's ceiling in this process). Target: >= 40 GB/s each way on an H100.
multiturn: bench/kv_tiers_live.py's multi-turn workload on a random-weight Llama-3.1-8B-shape checkpoint in bf16,
the device pool a third of what the conversations need, without and with a host tier. Target: >= 40% lower mean
TTFT of rounds 2-4 (Dynamo's published figure), later rounds flat.
"""

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from engines.base.events import KvTier  # noqa: E402
from engines.base.types import KvLayout  # noqa: E402
from engines.core.loads import KvLoad  # noqa: E402
from engines.core.tiers.kv_tiers import Onboard, OnboardBlock, TierSpec  # noqa: E402
from engines.native.kv_cache import KvCache, bytes_per_block  # noqa: E402
from engines.native.tiers.native_tiers import NativeTiers  # noqa: E402

LLAMA_8B = KvLayout(32, 8, 128, "bfloat16", 16)  # 2 MiB a block of 16 tokens, every layer
TINY = KvLayout(2, 2, 16, "float32", 16)


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def ceiling(num_bytes: int, device: str) -> tuple[float, float]:
    """GB/s of one contiguous copy each way between pinned host memory and the device."""
    host = torch.empty(num_bytes, dtype=torch.uint8, pin_memory=device.startswith("cuda"))
    dev = torch.empty(num_bytes, dtype=torch.uint8, device=device)
    out = []
    for dst, src in ((host, dev), (dev, host)):
        dst.copy_(src, non_blocking=True)
        sync(device)
        start = time.perf_counter()
        for _ in range(3):
            dst.copy_(src, non_blocking=True)
        sync(device)
        out.append(3 * num_bytes / (time.perf_counter() - start) / 1e9)
    return out[0], out[1]


def tier_copies(layout: KvLayout, num_blocks: int, device: str) -> tuple[float, float]:
    """GB/s of the runner's own paths: offload (device blocks -> host slots) and an onboarding load back."""
    kv = KvCache(layout, num_blocks, device)
    block_bytes = bytes_per_block(layout)
    tiers = NativeTiers(kv, TierSpec(num_blocks, 0, block_bytes), "", "bench")
    pairs = [(b, b) for b in range(num_blocks)]
    try:
        tiers.offload(pairs[:8])
        sync(device)
        start = time.perf_counter()
        tiers.offload(pairs)
        sync(device)
        down = num_blocks * block_bytes / (time.perf_counter() - start) / 1e9
        source = Onboard(tuple(OnboardBlock(KvTier.HOST, b, b + 1, b, ()) for b in range(num_blocks)))
        start = time.perf_counter()
        tiers.start_load(KvLoad("bench", tuple(range(num_blocks)), num_blocks * layout.block_size, source))
        while not (done := tiers.poll_loads()):
            time.sleep(1e-4)
        up = num_blocks * block_bytes / (time.perf_counter() - start) / 1e9
        assert done[0].ok, done[0].error
        return down, up
    finally:
        tiers.close()


def bench_copy(layout: KvLayout, num_blocks: int, device: str) -> dict:
    down, up = tier_copies(layout, num_blocks, device)
    ceil_down, ceil_up = ceiling(num_blocks * bytes_per_block(layout), device)
    return {
        "num_blocks": num_blocks,
        "block_bytes": bytes_per_block(layout),
        "g1_to_g2_gb_per_s": down,
        "g2_to_g1_gb_per_s": up,
        "ceiling_d2h_gb_per_s": ceil_down,
        "ceiling_h2d_gb_per_s": ceil_up,
    }


def bench_multiturn(args) -> dict:
    """The live multi-turn comparison on an 8B-shape checkpoint (a stack on this GPU)."""
    import kv_tiers_live as live  # noqa: PLC0415  (bench/ is on sys.path when run as a script)

    from tandem.bench.multiturn import Multiturn
    from tandem.models.init import init_model

    model = init_model(Path(tempfile.mkdtemp(prefix="llama8b_")), "llama", shape="llama-3.1-8b", dtype="bfloat16")
    mt = Multiturn(args.users, args.rounds, 1000, 1000, 32, round_barrier=True)
    needed = live.distinct_tokens(mt)
    num_blocks = live.pool_blocks(mt, args.pool_fraction_inverse)
    base = ("--device", "cuda", "--dtype", "bfloat16", "--num-blocks", str(num_blocks))
    logs = Path(tempfile.mkdtemp(prefix="kv_tiers_gpu_"))
    runs = {
        name: live.serve(model, logs / name, wargs, live.multiturn_cfg(model, mt))
        for name, wargs in (("device", base), ("host", (*base, "--kv-host-gb", str(args.kv_host_gb))))
    }
    ratio = live.later_rounds_ttft(runs["host"]) / live.later_rounds_ttft(runs["device"])
    return {
        "num_blocks": num_blocks,
        "needed_tokens": needed,
        "runs": runs,
        "rounds_2_4_ratio": ratio,
        "same_answers": runs["device"]["answers_sha256"] == runs["host"]["answers_sha256"],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sections", default="copy,multiturn")
    p.add_argument("--dry-run", action="store_true", help="CPU and tiny shapes: checks the code, measures nothing")
    p.add_argument("--copy-blocks", type=int, default=2048, help="blocks moved each way (8B shape: 2 MiB each)")
    p.add_argument("--users", type=int, default=80)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--pool-fraction-inverse", type=int, default=3, help="the workload needs N x the device pool")
    p.add_argument("--kv-host-gb", type=float, default=32.0)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    device = "cpu" if args.dry_run else "cuda"
    if not args.dry_run and not torch.cuda.is_available():
        raise SystemExit("kv_tiers_gpu: no CUDA device (use --dry-run to check the code on CPU)")
    sections = set(args.sections.split(","))
    out: dict = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu (dry run)"}
    if "copy" in sections:
        out["copy"] = bench_copy(TINY if args.dry_run else LLAMA_8B, 16 if args.dry_run else args.copy_blocks, device)
        c = out["copy"]
        print(f"{'copy (GB/s)':<26}{'tiers':>10}{'ceiling':>10}")
        print(f"{'G1 -> G2 (offload)':<26}{c['g1_to_g2_gb_per_s']:>10.1f}{c['ceiling_d2h_gb_per_s']:>10.1f}")
        print(f"{'G2 -> G1 (onboard)':<26}{c['g2_to_g1_gb_per_s']:>10.1f}{c['ceiling_h2d_gb_per_s']:>10.1f}")
        print("target: >= 40 GB/s each way on an H100")
    if "multiturn" in sections and not args.dry_run:
        out["multiturn"] = m = bench_multiturn(args)
        print(
            f"multiturn rounds 2-4 mean TTFT ratio (host tier / device only): {m['rounds_2_4_ratio']:.3f} "
            f"(target <= 0.6); identical answers: {m['same_answers']}"
        )
        for d, h in zip(m["runs"]["device"]["rounds"], m["runs"]["host"]["rounds"]):
            print(f"  round {d['round']}: {d['ttft_mean_s'] * 1e3:.1f} ms vs {h['ttft_mean_s'] * 1e3:.1f} ms")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2, default=str) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
