"""Compile every Triton launch of aot_plan.py ahead of time for Hopper (no GPU needed), read each
binary's registers, spills and shared memory (`ptxas -v`) and its tensor-core instructions (SASS),
and judge it: a compile error, any spill, or a `tl.dot` kernel without an MMA instruction fails.
CLI: python -m engines.native.kernels.aot [--json PATH]. Runs no kernel; must not run under TRITON_INTERPRET.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field

from engines.native.kernels.aot_plan import Launch, record_all

SM90 = {
    "regs": 65536,
    "max_warps": 64,
    "max_blocks": 32,
    "smem": 228 * 1024,
    "smem_per_block": 227 * 1024,
    "reserved_smem": 1024,
}  # per SM (H100); CUDA reserves 1 KB of shared memory per block
# an opcode ending in MMA (HMMA, HGMMA, QGMMA, IMMA...) is a tensor-core op; HFMA2.MMA is not (a modifier)
_MMA = re.compile(r"(?<=\s)([A-Z]*MMA)(?=[.\s])")


@dataclass(slots=True)
class Compiled:
    kernel: str
    variant: str  # the constexprs that tell this binary apart
    label: str  # the first launch that needed it
    num_launches: int
    signature: dict = field(default_factory=dict)  # argument types as the JIT keys them ("constexpr" for an int 1)
    num_warps: int = 0
    num_stages: int = 0
    registers: int = 0
    spill_bytes: int = 0
    stack_bytes: int = 0
    smem_bytes: int = 0
    occupancy: float = 0.0
    has_dot: bool = False
    mma: str = ""  # tensor-core SASS ops, e.g. "HGMMA x24"
    ptx_mma: str = ""  # "wgmma" / "mma.sync" / ""
    error: str = ""

    @property
    def problems(self) -> list[str]:
        out = [self.error] if self.error else []
        if not self.error and self.spill_bytes:
            out.append(f"{self.spill_bytes} bytes spilled")
        if not self.error and self.has_dot and not self.mma:
            out.append("tl.dot without a tensor-core instruction")
        return out


# -- specialization: what the JIT would key a launch on ----------------------------------------
def specialize(launch: Launch) -> tuple[dict, dict, dict]:
    """(signature, constexprs, attrs) as triton's JIT builds them for these arguments."""
    from triton.backends.compiler import BaseBackend
    from triton.runtime.jit import native_specialize_impl

    signature, constexprs, attrs = {}, {}, {}
    for i, param in enumerate(launch.kernel.params):
        value = launch.args[param.name]
        if param.is_constexpr:
            signature[param.name], constexprs[param.name] = "constexpr", value
            continue
        if hasattr(value, "dtype") and hasattr(value, "storage_offset"):
            kind = _pointer_type(value.dtype)
            aligned = value.storage_offset() * value.element_size() % 16 == 0  # the allocator's base is
            spec = "D" if aligned else ""
        else:
            kind, spec = native_specialize_impl(BaseBackend, value, False, True, True)
        signature[param.name] = kind
        if kind == "constexpr":
            constexprs[param.name] = spec  # an int 1 is specialized into the code
        elif spec == "D":
            attrs[(i,)] = [["tt.divisibility", 16]]
    return signature, constexprs, attrs


def _pointer_type(dtype) -> str:
    import torch
    from triton.backends.compiler import BaseBackend
    from triton.runtime.jit import native_specialize_impl

    return native_specialize_impl(BaseBackend, torch.empty(0, dtype=dtype), False, True, True)[0]


def unique_builds(launches: list[Launch]) -> list[tuple[Launch, dict, dict, dict, int]]:
    """One entry per distinct binary: (first launch, signature, constexprs, attrs, number of launches)."""
    builds: dict[str, list] = {}
    for launch in launches:
        sig, const, attrs = specialize(launch)
        key = repr(
            (
                launch.kernel.__name__,
                sorted(sig.items()),
                sorted(const.items(), key=str),
                sorted(attrs.items()),
                sorted(launch.options.items()),
            )
        )
        if key in builds:
            builds[key][4] += 1
        else:
            builds[key] = [launch, sig, const, attrs, 1]
    return [tuple(b) for b in builds.values()]


# -- compile and inspect ----------------------------------------------------------------------
def build(launch: Launch, sig: dict, const: dict, attrs: dict, count: int, arch: int = 90) -> Compiled:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    variant = ", ".join(f"{k}={v}" for k, v in const.items())
    row = Compiled(launch.kernel.__name__, variant, launch.label, count, dict(sig))
    try:
        binary = triton.compile(
            ASTSource(launch.kernel, sig, const, attrs),
            target=GPUTarget("cuda", arch, 32),
            options=dict(launch.options),
        )
    except Exception as e:  # noqa: BLE001 -- any compiler failure is this build's verdict, reported
        row.error = f"compile error: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
        return row
    row.num_warps, row.num_stages = binary.metadata.num_warps, binary.metadata.num_stages
    row.smem_bytes = binary.metadata.shared
    row.has_dot = "tt.dot" in binary.asm["ttir"]
    ptx = binary.asm["ptx"]
    row.ptx_mma = "wgmma" if "wgmma.mma_async" in ptx else "mma.sync" if "mma.sync" in ptx else ""
    row.registers, row.spill_bytes, row.stack_bytes = ptxas_usage(ptx, arch)
    row.mma = sass_mma(binary.asm["cubin"])
    row.occupancy = occupancy(row.registers, row.num_warps, row.smem_bytes)
    return row


def ptxas_usage(ptx: str, arch: int) -> tuple[int, int, int]:
    """(registers per thread, spill store + load bytes, stack frame bytes) from `ptxas -v`, run with the
    flags triton's own cubin step passes (so it allocates the same registers)."""
    from triton.backends.nvidia.compiler import get_ptxas

    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        log = subprocess.run(
            [
                get_ptxas(arch).path,
                "-lineinfo",
                "-v",
                "--regAllocOptLevel=2",
                f"--gpu-name=sm_{arch}a",
                src,
                "-o",
                os.path.join(tmp, "k.o"),
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stderr
    regs = re.search(r"Used (\d+) registers", log)
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    stack = re.search(r"(\d+) bytes stack frame", log)
    return (
        int(regs.group(1)) if regs else 0,
        int(spills.group(1)) + int(spills.group(2)) if spills else 0,
        int(stack.group(1)) if stack else 0,
    )


def sass_mma(cubin: bytes) -> str:
    """Tensor-core instructions in the binary's SASS, e.g. "HGMMA x24" ("" when none)."""
    from triton import knobs

    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run(
            [knobs.nvidia.cuobjdump.path, "-sass", f.name], capture_output=True, text=True, check=True
        ).stdout
    counts: dict[str, int] = {}
    for op in _MMA.findall(sass):
        counts[op] = counts.get(op, 0) + 1
    return " ".join(f"{op} x{n}" for op, n in sorted(counts.items()))


def occupancy(registers: int, num_warps: int, smem_bytes: int, sm: dict = SM90) -> float:
    """Resident warps / the SM's maximum, from registers (allocated per warp in 256-register units),
    shared memory and the block limit."""
    if not num_warps or registers > 255 or smem_bytes > sm["smem_per_block"]:
        return 0.0
    per_warp = -(-registers * 32 // 256) * 256
    blocks = min(sm["max_blocks"], sm["max_warps"] // num_warps, sm["regs"] // (per_warp * num_warps))
    if smem_bytes:
        blocks = min(blocks, sm["smem"] // (smem_bytes + sm["reserved_smem"]))
    return blocks * num_warps / sm["max_warps"]


# -- report -----------------------------------------------------------------------------------
_builds: list = []  # a worker process's own recording (launches hold JIT functions: not picklable)


def _build_at(index: int) -> Compiled:
    if not _builds:
        _builds.extend(unique_builds(record_all()))
    return build(*_builds[index])


def compile_all(jobs: int = 2, log=print) -> list[Compiled]:
    """Every distinct binary, built by `jobs` processes (each records the same plan, in the same order)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    count = len(unique_builds(record_all()))
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        rows = []
        for row in pool.map(_build_at, range(count)):
            rows.append(row)
            log(f"[{len(rows)}/{count}] {row.label}: {'; '.join(row.problems) or 'ok'}")
    return rows


def table(rows: list[Compiled]) -> str:
    head = (
        f"{'kernel / variant':<64} {'warps':>5} {'stg':>3} {'regs':>4} {'spill':>5} {'smem KB':>7} "
        f"{'occ':>5}  tensor cores"
    )
    lines, last = [head, "-" * len(head)], None  # a row: the first launch that needs the binary
    for r in sorted(rows, key=lambda r: r.kernel):
        if r.kernel != last:
            lines.append(r.kernel)
            last = r.kernel
        tc = r.mma or ("none" if r.has_dot else "-")
        body = (
            f"{r.num_warps:>5} {r.num_stages:>3} {r.registers:>4} {r.spill_bytes:>5} "
            f"{r.smem_bytes / 1024:>7.1f} {r.occupancy:>5.0%}  {tc}"
        )
        lines.append(f"  {r.label[:62]:<62} " + ("FAILED " + "; ".join(r.problems) if r.error else body))
        lines += [f"  ^ FAIL: {p}" for p in r.problems if not r.error]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--jobs", type=int, default=2, help="compiler processes")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        parser.error("unset TRITON_INTERPRET: the interpreter's kernels cannot be compiled")
    start = time.perf_counter()
    rows = compile_all(args.jobs, log=lambda msg: print(msg, file=sys.stderr))
    print(table(rows))
    failed = [r for r in rows if r.problems]
    print(f"{len(rows)} binaries for sm_90a in {time.perf_counter() - start:.0f} s; {len(failed)} failed")
    if args.json:
        import triton

        with open(args.json, "w") as f:
            json.dump(
                {
                    "target": "cuda sm_90a (GPUTarget('cuda', 90, 32))",
                    "triton": triton.__version__,
                    "shapes": "Llama-3.1-8B",
                    "rows": [asdict(r) | {"problems": r.problems} for r in rows],
                },
                f,
                indent=1,
            )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
