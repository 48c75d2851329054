"""The native engine's KV tiers on CPU (a tiny random Llama, its loop on a thread): a prefix evicted from the device
pool comes back from the host tier, from disk, and from disk after a restart with exactly the tokens of an engine
without tiers, in float32 and with an FP8 cache; a corrupt disk block is recomputed, never served."""

import asyncio
import time

import pytest
import torch

from engines.base import EngineRequest
from engines.base.engine_configs import CacheConfig
from engines.base.types import KvLayout
from engines.native.config import EngineConfig, ModelConfig
from engines.native.kv_cache import bytes_per_block
from tests.unit.engines.helpers import collect, greedy, started

BS = 16
NUM_BLOCKS = 8  # a prompt of 4 blocks plus a filler of 5 cannot both stay on the device
PROMPT = torch.randint(0, 400, (64,), generator=torch.Generator().manual_seed(5)).tolist()
FILLERS = [torch.randint(0, 400, (80,), generator=torch.Generator().manual_seed(s)).tolist() for s in (6, 7)]
NUM_CACHED = 48  # a hit leaves the last of the 4 blocks to compute (at least one token is always computed)


def block_gb(model_dir, n: int, kv_dtype: str = "float32") -> float:
    cfg = ModelConfig.from_dir(model_dir)
    layout = KvLayout(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, kv_dtype, BS)
    return n * bytes_per_block(layout) / 1e9 + 1e-12


async def run(engine, req_id: str, prompt=PROMPT) -> list[int]:
    tokens, _ = await collect(engine, EngineRequest(req_id, tuple(prompt), greedy(8)))
    return tokens


async def reference(model_dir, **kw) -> list[int]:
    engine = await started(model_dir, num_blocks=NUM_BLOCKS, **kw)
    try:
        return await run(engine, "ref")
    finally:
        await engine.shutdown()


async def evict(engine) -> None:
    for i, filler in enumerate(FILLERS):
        await run(engine, f"fill{i}", filler)


async def until(predicate, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


async def announced(engine, timeout_s: float = 10.0) -> list:
    """The engine's KV events, once it has announced any."""
    deadline = time.monotonic() + timeout_s
    while not (events := await engine.kv_events_since(0)):
        assert time.monotonic() < deadline, "no KV events announced"
        await asyncio.sleep(0.02)
    return events


@pytest.mark.parametrize("kv_dtype", ["auto", "fp8"])
async def test_a_prefix_evicted_from_the_device_comes_back_from_host_with_the_same_tokens(tiny_llama, kv_dtype):
    expected = await reference(tiny_llama, kv_cache_dtype=kv_dtype)
    engine = await started(
        tiny_llama,
        num_blocks=NUM_BLOCKS,
        kv_cache_dtype=kv_dtype,
        kv_host_gb=block_gb(tiny_llama, 64, "float8_e4m3fn" if kv_dtype == "fp8" else "float32"),
    )
    try:
        assert await run(engine, "a") == expected
        await evict(engine)
        computed = engine.stats().num_prompt_tokens_computed
        assert await run(engine, "a2") == expected
        s = engine.stats()
        assert s.prefix_hits_host == NUM_CACHED and s.num_blocks_onboarded_host == 3 and s.num_onboards == 1
        assert s.num_prompt_tokens_computed - computed == len(PROMPT) - NUM_CACHED
        assert s.kv_host_bytes_per_s > 0  # measured by the load
    finally:
        await engine.shutdown()


@pytest.mark.parametrize("kv_dtype", ["auto", "fp8"])
async def test_disk_blocks_serve_after_host_eviction_and_after_a_restart(tiny_llama, tmp_path, kv_dtype):
    kv_layout_dtype = "float8_e4m3fn" if kv_dtype == "fp8" else "float32"
    expected = await reference(tiny_llama, kv_cache_dtype=kv_dtype)
    tiers = dict(
        kv_cache_dtype=kv_dtype,
        kv_host_gb=block_gb(tiny_llama, 4, kv_layout_dtype),
        kv_disk_dir=str(tmp_path / "kv"),
        kv_disk_gb=block_gb(tiny_llama, 64, kv_layout_dtype),
    )
    engine = await started(tiny_llama, num_blocks=NUM_BLOCKS, **tiers)
    try:
        assert await run(engine, "a") == expected
        # a device hit on 3 blocks and the 4th computed again: the second sighting sends all 4 to disk
        assert await run(engine, "a2") == expected
        await until(lambda: engine.stats().num_blocks_offloaded_disk == 4)
        await evict(engine)  # out of the 8-block device pool and the 4-slot host tier
        assert await run(engine, "a3") == expected
        s = engine.stats()
        assert (s.prefix_hits_disk, s.prefix_hits_host, s.num_blocks_onboarded_disk) == (NUM_CACHED, 0, 3)
    finally:
        await engine.shutdown()
    assert len(list((tmp_path / "kv").glob("??/*.kvb"))) == 4
    restarted = await started(tiny_llama, num_blocks=NUM_BLOCKS, **tiers)
    try:
        await until(lambda: restarted.stats().num_disk_blocks_used == 4)  # re-indexed at start
        events = await announced(restarted)  # NOTE: the events come with the engine's first step
        assert events and all(e.tier.value == "disk" for e in events)
        assert await run(restarted, "b") == expected
        assert restarted.stats().prefix_hits_disk == NUM_CACHED
    finally:
        await restarted.shutdown()


async def test_a_corrupt_disk_block_is_dropped_and_recomputed(tiny_llama, tmp_path):
    expected = await reference(tiny_llama)
    tiers = dict(
        kv_host_gb=block_gb(tiny_llama, 4), kv_disk_dir=str(tmp_path / "kv"), kv_disk_gb=block_gb(tiny_llama, 64)
    )
    engine = await started(tiny_llama, num_blocks=NUM_BLOCKS, **tiers)
    try:
        await run(engine, "a")
        await run(engine, "a2")
        await until(lambda: engine.stats().num_blocks_offloaded_disk == 4)
    finally:
        await engine.shutdown()
    files = sorted((tmp_path / "kv").glob("??/*.kvb"), key=lambda p: p.stat().st_mtime)
    damaged = files[1]
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0xFF
    damaged.write_bytes(bytes(data))
    restarted = await started(tiny_llama, num_blocks=NUM_BLOCKS, **tiers)
    try:
        assert await run(restarted, "b") == expected
        s = restarted.stats()
        assert s.prefix_hits_disk == 0 and s.num_onboards == 0  # the load failed as a whole: computed here
        # the damaged file is gone; the block, recomputed (a second sighting), may be written again, intact
        assert not damaged.exists() or damaged.read_bytes() != bytes(data)
        assert await run(restarted, "c") == expected
    finally:
        await restarted.shutdown()


def test_tier_settings_are_checked(tiny_llama):
    with pytest.raises(ValueError, match="host tier"):
        EngineConfig(model=str(tiny_llama), cache=CacheConfig(kv_disk_dir="/tmp/x", kv_disk_gb=1))
    with pytest.raises(ValueError, match="directory"):
        EngineConfig(model=str(tiny_llama), cache=CacheConfig(kv_host_gb=1, kv_disk_gb=1))
    with pytest.raises(ValueError, match=">= 0"):
        EngineConfig(model=str(tiny_llama), cache=CacheConfig(kv_host_gb=-1))
