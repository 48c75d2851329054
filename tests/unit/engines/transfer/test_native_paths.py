"""KV moved between two native engines (a tiny random Llama, float32 on CPU): a NIXL READ of the prefill
engine's blocks straight into the decode engine's paged cache, and the gRPC fallback's staging file. Either
way the decode engine computes no prompt token and generates exactly what one engine alone generates."""

import pytest
import torch

from engines.base.engine_configs import CacheConfig, TransferConfig
from engines.base.types import EngineRequest, FinishReason, SamplingParams
from engines.native.config import EngineConfig
from engines.native.kv_transfer import paged_cache
from engines.native.runner import build_core
from engines.transfer import descriptor, transports
from engines.transfer.descriptor import NIXL, STAGING, KvDescriptor
from engines.transfer.nixl_link import is_available
from engines.transfer.paged import staging_nbytes
from engines.transfer.staging import StagingFile
from tests.unit.engines.transfer.test_kv_paths import decode, prefill

PROMPT = tuple((j * 31) % 200 + 5 for j in range(45))  # 3 blocks of 16, the last one partial
MAX_TOKENS = 6
needs_nixl = pytest.mark.skipif(not is_available(), reason="NIXL is not installed")


def core(model, transport: str = transports.BYTES, kv_cache_dtype: str = "auto"):
    return build_core(
        EngineConfig(
            model=str(model),
            kv_cache_dtype=kv_cache_dtype,
            cache=CacheConfig(num_blocks=32),
            transfer=TransferConfig(kv_transport=transport),
        )
    )


def generated(engine, req_id: str) -> tuple[int, ...]:
    tokens = []
    deadline_steps = 10_000
    while deadline_steps:
        deadline_steps -= 1
        engine.poll_loads()
        for o in engine.failed_loads + engine.step():
            if o.req_id == req_id:
                tokens += o.new_token_ids
                if o.finish_reason:
                    assert (o.finish_reason, o.error) == (FinishReason.LENGTH, None)
                    return tuple(tokens)
        engine.failed_loads = []
    raise AssertionError("never finished")


@pytest.fixture(scope="module")
def reference(tiny_llama) -> tuple[int, ...]:
    engine = core(tiny_llama)
    engine.add(EngineRequest("r", PROMPT, SamplingParams(max_tokens=MAX_TOKENS)))
    return generated(engine, "r")


@needs_nixl
def test_a_nixl_read_lands_the_prompts_kv_and_decode_continues_exactly(tiny_llama, reference):
    p, d = core(tiny_llama, "nixl"), core(tiny_llama, "nixl")
    first, kv_params = prefill(p, "r", PROMPT)
    desc = descriptor.decode(kv_params)
    assert (desc.kind, desc.num_blocks, desc.mem) == (NIXL, 3, "DRAM")
    decode(d, "r", PROMPT, first, kv_params, max_tokens=MAX_TOKENS)
    assert (first,) + generated(d, "r") == reference
    assert d.stats().num_prompt_tokens_computed == 0
    assert d.runner.mover.num_bytes_loaded == 3 * staging_nbytes(d.info.kv_layout, 1)


def test_the_staging_fallback_lands_the_same_kv(tiny_llama, reference):
    p, d = core(tiny_llama, "grpc"), core(tiny_llama, "grpc")
    first, kv_params = prefill(p, "r", PROMPT)
    assert kv_params == b""  # without NIXL the blocks are pulled as bytes
    layout = p.info.kv_layout
    staging = StagingFile(staging_nbytes(layout, 4), "tandem-kv-test")
    try:
        handle = p.export_kv("r", staging.path, 0)
        assert descriptor.decode(handle) == KvDescriptor(STAGING, layout, PROMPT, path=staging.path)
        decode(d, "r", PROMPT, first, handle, max_tokens=MAX_TOKENS)
        assert (first,) + generated(d, "r") == reference
    finally:
        staging.close()
    assert d.stats().num_prompt_tokens_computed == 0


def test_the_paged_view_is_the_cache_tensor_itself(tiny_llama):
    engine = core(tiny_llama, "grpc")
    kv = engine.runner.kv_cache
    view = paged_cache(kv)
    layout = kv.layout
    assert view.geometry.base == kv.tensor.data_ptr()
    assert view.geometry.nbytes == kv.tensor.numel() * kv.tensor.element_size()
    src = torch.arange(staging_nbytes(layout, 2), dtype=torch.int64).remainder(251).to(torch.uint8)
    view.write_blocks([7, 2], src.numpy().reshape(layout.num_layers * 2, 2, -1))
    planes = kv.tensor.view(torch.uint8).view(layout.num_layers * 2, kv.num_blocks, -1)
    assert torch.equal(planes[:, 7], src.view(layout.num_layers * 2, 2, -1)[:, 0])
    assert torch.equal(planes[:, 2], src.view(layout.num_layers * 2, 2, -1)[:, 1])


def test_an_fp8_cache_moves_kv_as_bytes_with_its_scales(tiny_llama):
    engine = core(tiny_llama, "nixl", kv_cache_dtype="fp8")
    assert engine.runner.mover is None and engine.info.kv_transport == transports.BYTES


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_device_cache_copies_blocks_in_and_out_on_its_stream(tiny_llama):
    from engines.native.kv_cache import KvCache
    from engines.native.kv_transfer import DeviceCache

    layout = core(tiny_llama).info.kv_layout
    kv = KvCache(layout, 8, "cuda")
    view = paged_cache(kv)
    assert isinstance(view, DeviceCache) and view.geometry.mem == "VRAM"
    src = torch.randint(
        0, 255, (layout.num_layers * 2, 2, staging_nbytes(layout, 1) // (layout.num_layers * 2)), dtype=torch.uint8
    )
    view.write_blocks([5, 1], src.numpy())
    out = torch.empty_like(src)
    view.read_blocks([5, 1], out.numpy())
    assert torch.equal(out, src)
