"""What trusting KV costs per request, away from transfer noise: signing and verifying one handle (2000 tokens, a
NIXL descriptor), registering one request's blocks for readers (prefill side, at Llama-3.1-8B bf16 shape, 32 blocks
of 64 tokens) and loading that metadata (decode side). The anchor is the transfer it sits beside: one request's KV
at the NIXL target of 2 GB/s. Prints a table, writes JSON.

    python bench/kv_trust_costs.py --json bench/results/kv-trust-costs.json
"""

import argparse
import asyncio
import json
import os
import time
from pathlib import Path

import numpy as np

from engines.sim.kv_payload import payload_layout
from engines.transfer import descriptor
from engines.transfer.descriptor import NIXL, KvDescriptor
from engines.transfer.nixl_link import NixlLink, is_available
from engines.transfer.paged import HostCache, block_bytes, staging_nbytes
from services.common.kv_signing import KvSigner, KvVerifier
from services.common.protos import common_pb2
from services.decode.kv_gate import KvGate

TOKENS, BLOCK, NUM_BLOCKS, TARGET_GB_S = 2000, 64, 32, 2.0


def handles(n: int, params: bytes) -> list[common_pb2.KvHandle]:
    layout = common_pb2.KvLayout(num_layers=32, num_kv_heads=8, head_dim=128, dtype="bfloat16", block_size=BLOCK)
    return [
        common_pb2.KvHandle(
            worker_id="prefill-0",
            address="10.0.0.1:5000",
            req_id=f"r{i}",
            num_tokens=TOKENS,
            num_blocks=NUM_BLOCKS,
            lease_expires_unix_s=time.time() + 60,
            engine_params=params,
            layout=layout,
        )
        for i in range(n)
    ]


def signing_ms(n: int) -> tuple[float, float]:
    key, tokens = os.urandom(32), tuple((j * 31) % 500 + 10 for j in range(TOKENS))
    layout = payload_layout(131072, BLOCK)
    params = descriptor.encode(
        KvDescriptor(NIXL, layout, tokens, tuple(range(NUM_BLOCKS)), "agent", os.urandom(3200), 1 << 40, 4096)
    )
    batch, signer, gate = handles(n, params), KvSigner(key), KvGate(KvVerifier(key), None)
    start = time.perf_counter()
    for h in batch:
        signer.seal(h, tokens)
    sign = (time.perf_counter() - start) / n

    async def verify() -> float:
        begin = time.perf_counter()
        for h in batch:
            await gate.admit(h, tokens)
        return (time.perf_counter() - begin) / n

    return sign * 1e3, asyncio.run(verify()) * 1e3


def nixl_ms(n: int) -> tuple[float, float]:
    layout = payload_layout(131072, BLOCK)
    num_pool = NUM_BLOCKS + 8
    caches = [
        HostCache(np.zeros(num_pool * layout.num_layers * 2 * block_bytes(layout), np.uint8), layout, num_pool)
        for _ in range(2)
    ]
    src, dst = NixlLink(caches[0].geometry, "cost-src"), NixlLink(caches[1].geometry, "cost-dst")
    g, expose, load = caches[0].geometry, 0.0, 0.0
    for i in range(n):
        blocks = list(range(i % 8, i % 8 + NUM_BLOCKS))
        start = time.perf_counter()
        metadata = src.expose(f"r{i}", blocks)
        src.conceal(f"r{i}")
        expose += time.perf_counter() - start
        desc = KvDescriptor(NIXL, layout, tuple(range(TOKENS)), tuple(blocks), src.name, metadata, g.base, num_pool)
        start = time.perf_counter()
        dst._remote(desc)
        load += time.perf_counter() - start
    return expose / n * 1e3, load / n * 1e3


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--num", type=int, default=200)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    transfer_ms = staging_nbytes(payload_layout(131072, BLOCK), NUM_BLOCKS) / (TARGET_GB_S * 1e9) * 1e3
    sign, verify = signing_ms(args.num)
    rows = {"sign a handle (prefill worker)": sign, "verify a handle (decode worker)": verify}
    if is_available():
        expose, load = nixl_ms(args.num)
        rows |= {
            "register + deregister one request's blocks (prefill engine)": expose,
            "load one request's metadata (decode engine, poster thread)": load,
        }
    print(f"{'per request':<64}{'ms':>8}{'% of transfer':>15}   (transfer: {transfer_ms:.0f} ms at {TARGET_GB_S} GB/s)")
    for name, ms in rows.items():
        print(f"{name:<64}{ms:>8.3f}{100 * ms / transfer_ms:>14.2f}%")
    if args.json is not None:
        args.json.write_text(
            json.dumps({"transfer_ms_at_target": transfer_ms, "ms_per_request": rows, "num": args.num}, indent=2)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
