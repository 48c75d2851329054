"""Every Triton kernel compiled for Hopper (sm_90a) at the engine's Llama-3.1-8B launches, without a GPU:
no compile error, no spill, tensor-core instructions wherever a kernel has a tl.dot. The build runs in a
child process (this one imports the kernels under TRITON_INTERPRET=1) with its cache in a pytest tmp dir."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from engines.native.kernels import aot

KERNELS = Path(aot.__file__).parent


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("aot")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = str(KERNELS.parents[2])
    env |= {
        "TRITON_CACHE_DIR": str(tmp / "triton-cache"),
        "TRITON_DEFAULT_FP_FUSION": "1",
        "PYTHONPATH": os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])]),
    }
    proc = subprocess.run(
        [sys.executable, "-m", "engines.native.kernels.aot", "--json", str(tmp / "aot.json")],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    data = json.loads((tmp / "aot.json").read_text()) if (tmp / "aot.json").exists() else None
    return proc, data


def launched_kernels() -> set[str]:
    """Every @triton.jit function some wrapper launches (`name[grid](...)`) in engines/native."""
    names = set()
    for path in [*KERNELS.glob("*.py"), *KERNELS.parent.glob("*/*.py")]:
        src = path.read_text()
        jitted = set(re.findall(r"@triton\.jit\s*\ndef (\w+)", src))
        names |= {n for n in jitted if re.search(rf"\b{n}\[", src)}
    return names


@pytest.mark.timeout(1000)  # the module's one build: ~70 s of CPU, minutes of wall time on a loaded machine
def test_every_kernel_compiles_for_sm90_without_spills_and_with_tensor_cores(built):
    proc, data = built
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    rows = data["rows"]
    assert {r["kernel"] for r in rows} == launched_kernels()
    assert all(not r["problems"] and r["registers"] > 0 and 0 < r["occupancy"] <= 1 for r in rows)
    dots = {r["kernel"] for r in rows if r["has_dot"]}
    assert dots == {"_split_kernel", "_prefill_kernel", "_w8a16_kernel", "_nvfp4_kernel"}
    # the prefill tile (128 x 64 at head_dim 128) is big enough for Hopper's warpgroup MMA
    assert all("HGMMA" in r["mma"] and r["ptx_mma"] == "wgmma" for r in rows if r["kernel"] == "_prefill_kernel")
    assert all("UPCAST=False" in r["variant"] for r in rows if r["has_dot"])  # the GPU's dot, not fp32
    assert "0 failed" in proc.stdout


def test_the_plan_covers_both_kv_dtypes_and_every_decode_split(built):
    rows = built[1]["rows"]
    decode = {
        (r["variant"].split("NUM_SPLITS=")[1].split(",")[0], r["signature"]["k_cache_ptr"])
        for r in rows
        if r["kernel"] == "_split_kernel"
    }
    assert decode == {(str(s), kv) for s in (1, 2, 4, 8, 16, 32) for kv in ("*bf16", "*fp8e4nv")}
    prefill = [(r["num_warps"], r["num_stages"]) for r in rows if r["kernel"] == "_prefill_kernel"]
    assert prefill == [(8, 3)] * 2  # tiles_for(128) on a GPU, not the interpreter's


def test_an_int_of_one_is_specialized_as_the_jit_does(built):
    gemv = next(r for r in built[1]["rows"] if r["label"] == "fp8 w8a16 qkv_proj m=1")
    assert gemv["signature"]["M"] == "constexpr" and "M=1" in gemv["variant"]
    assert gemv["signature"]["x_ptr"] == "*bf16" and gemv["signature"]["w_ptr"] == "*fp8e4nv"


def test_occupancy_follows_the_sm90_limits():
    assert aot.occupancy(32, 4, 0) == 1.0  # 16 blocks of 4 warps fill 64 warps
    assert aot.occupancy(128, 4, 0) == 0.25  # 128 x 32 x 4 = 16K registers a block: 4 blocks of 4 warps
    assert aot.occupancy(170, 8, 96 * 1024) == 8 / 64  # 176 (rounded) x 256 threads: 1 block
    assert aot.occupancy(72, 4, 38 * 1024) == 20 / 64  # shared memory: 228 KB / 39 KB = 5 blocks
    assert aot.occupancy(256, 4, 0) == 0.0


def test_tensor_core_ops_are_read_from_opcodes_not_modifiers(monkeypatch):
    sass = (
        "        /*04a0*/                   HFMA2.MMA R11, -RZ, RZ, 1.625, 0 ;\n"
        "        /*0500*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], RZ ;\n"
        "        /*0510*/                   HMMA.16816.F32.BF16 R4, R8, R12, R4 ;\n"
        "        /*0520*/                   HMMA.16816.F32.BF16 R4, R8, R12, R4 ;\n"
    )
    assert aot._MMA.findall(sass) == ["HGMMA", "HMMA", "HMMA"]
    row = aot.Compiled("_k", "", "k", 1, registers=40, has_dot=True)
    assert row.problems == ["tl.dot without a tensor-core instruction"]
    row.mma, row.spill_bytes = "HMMA x2", 8
    assert row.problems == ["8 bytes spilled"]
