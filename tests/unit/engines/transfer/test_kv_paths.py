"""KV moved between two sim engines with real paged caches: by a NIXL READ (prefill engine's descriptor) and by
the gRPC fallback's staging file; bad descriptors fail one request with a clear error and lose nothing else."""

import time

import pytest

from engines.base.engine_configs import TransferConfig
from engines.base.errors import InvalidRequestError
from engines.base.types import EngineRequest, FinishReason, KvExport, SamplingParams
from engines.core.sequence import SequenceStatus
from engines.sim.config import SimOptions
from engines.sim.runner import SimSpec, build_core
from engines.transfer import descriptor, transports
from engines.transfer.descriptor import NIXL, STAGING, KvDescriptor
from engines.transfer.nixl_link import is_available
from engines.transfer.paged import staging_nbytes
from engines.transfer.staging import StagingFile

BYTES_PER_TOKEN = 8192  # small (32 layers x 8 heads x 8 dims, bf16): the same code as 128 KiB, less memory
needs_nixl = pytest.mark.skipif(not is_available(), reason="NIXL is not installed")


def core(transport: str):
    sim = SimOptions("", 0.0, kv_cache_mb=64 * 64 * BYTES_PER_TOKEN >> 20, kv_bytes_per_token=BYTES_PER_TOKEN)
    return build_core(SimSpec(sim, transfer=TransferConfig(transport)))


def prompt(i: int = 0, n: int = 300) -> tuple[int, ...]:
    return tuple((i * 7919 + j * 31) % 500 + 10 for j in range(n))


def prefill(engine, req_id: str, tokens) -> tuple[int, bytes]:
    engine.add(EngineRequest(req_id, tokens, SamplingParams(max_tokens=8), hold_kv=True))
    outs = []
    while not any(o.finish_reason for o in outs):
        outs += engine.step()
    assert outs[-1].finish_reason is FinishReason.PREFILLED
    return outs[-1].new_token_ids[-1], outs[-1].kv_handle


def decode(engine, req_id: str, tokens, first: int, kv_params: bytes, max_tokens: int = 8):
    engine.add(
        EngineRequest(req_id, tokens, SamplingParams(max_tokens=max_tokens), output_token_ids=(first,), kv=kv_params)
    )


def run(engine, until: set[str], timeout_s: float = 60.0) -> dict:
    """Step as the engine loop does (a loop with only loads in flight waits a little) until `until` finished."""
    finished, deadline = {}, time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not engine.has_work:
            time.sleep(0.001)
        engine.poll_loads()
        finished |= {o.req_id: o for o in engine.failed_loads + engine.step() if o.finish_reason}
        engine.failed_loads = []
        if until <= finished.keys():
            return finished
    raise AssertionError(f"not finished: {until - finished.keys()}")


@needs_nixl
def test_a_nixl_read_fills_the_decode_cache_and_no_prompt_token_is_computed():
    p, d = core("nixl"), core("nixl")
    first, kv_params = prefill(p, "r", prompt())
    assert descriptor.decode(kv_params).kind == NIXL
    decode(d, "r", prompt(), first, kv_params)
    out = run(d, {"r"})["r"]
    assert (out.finish_reason, out.error, out.num_cached_tokens) == (FinishReason.LENGTH, None, 300)
    assert d.stats().num_prompt_tokens_computed == 0
    assert d.runner.mover.num_bytes_loaded == 5 * 64 * BYTES_PER_TOKEN  # 5 whole blocks of 64 tokens


def test_the_staging_fallback_loads_what_the_prefill_engine_exported():
    p, d = core("grpc"), core("grpc")
    first, kv_params = prefill(p, "r", prompt())
    assert kv_params == b""  # without NIXL the blocks are pulled as bytes
    layout = p.info.kv_layout
    staging = StagingFile(staging_nbytes(layout, 8) * 2, "tandem-kv-test")
    try:
        desc = p.export_kv("r", staging.path, 4096)  # the handle of what it wrote there
        assert descriptor.decode(desc) == KvDescriptor(STAGING, layout, prompt()[:300], base=4096, path=staging.path)
        decode(d, "r", prompt(), first, desc)
        out = run(d, {"r"})["r"]
    finally:
        staging.close()
    assert (out.finish_reason, out.error) == (FinishReason.LENGTH, None)
    assert d.stats().num_prompt_tokens_computed == 0


def test_bytes_and_a_staging_descriptor_import_through_the_same_load_path():
    p = core("grpc")
    first, _ = prefill(p, "r", prompt())
    kv, layout = p.export_kv("r"), p.info.kv_layout
    staging = StagingFile(staging_nbytes(layout, 8), "tandem-kv-test")
    try:
        desc = p.export_kv("r", staging.path, 0)
        by_bytes, by_staging = core("grpc"), core("grpc")
        by_bytes.add(EngineRequest("r", prompt(), SamplingParams(max_tokens=8), kv=kv, output_token_ids=(first,)))
        decode(by_staging, "r", prompt(), first, desc)
        for d, kind in ((by_bytes, KvExport), (by_staging, KvDescriptor)):
            assert d.seqs["r"].status is SequenceStatus.LOADING and "r" not in d.scheduler.waiting
            assert isinstance(d.scheduler.loading["r"].load.source, kind)  # one queue, one load, either source
            assert d.scheduler.loading["r"].load.block_ids == (0, 1, 2, 3, 4)
        outs = [run(d, {"r"})["r"] for d in (by_bytes, by_staging)]
    finally:
        staging.close()
    for out in outs:
        assert (out.finish_reason, out.error, out.num_cached_tokens) == (FinishReason.LENGTH, None, 300)
    assert by_bytes.stats().num_prompt_tokens_computed == by_staging.stats().num_prompt_tokens_computed == 0


@pytest.mark.parametrize(
    "blob, message",
    [
        (b"\x93garbage", "not a KV descriptor"),
        (
            descriptor.encode(KvDescriptor(STAGING, core("grpc").info.kv_layout, (1, 2), path="/etc/passwd")),
            "is not a KV staging file",
        ),
    ],
)
def test_unreadable_kv_params_refuse_the_request(blob, message):
    d = core("grpc")
    with pytest.raises(InvalidRequestError, match=message):
        decode(d, "r", prompt(), 7, blob)
    assert d.seqs == {} and not d.has_loads


@needs_nixl
def test_a_descriptor_from_an_unknown_agent_fails_its_request_alone():
    p, d = core("nixl"), core("nixl")
    first, good = prefill(p, "good", prompt(1))
    bad = descriptor.decode(good)
    bad = descriptor.encode(
        KvDescriptor(
            NIXL,
            bad.layout,
            bad.token_ids,
            bad.block_ids,
            "ghost-agent",
            b"not metadata",
            bad.base,
            bad.num_pool_blocks,
        )
    )
    decode(d, "bad", prompt(1), first, bad)
    decode(d, "good", prompt(1), first, good)
    finished = run(d, {"bad", "good"})
    assert finished["bad"].finish_reason is FinishReason.ERROR
    assert "unknown NIXL agent 'ghost-agent'" in finished["bad"].error
    assert (finished["good"].finish_reason, finished["good"].error) == (FinishReason.LENGTH, None)


@needs_nixl
def test_a_descriptor_of_released_blocks_is_caught_and_the_tokens_computed():
    p, d = core("nixl"), core("nixl")
    first, stale = prefill(p, "old", prompt(1))
    p.release_kv("old")
    p.reset_prefix_cache()
    prefill(p, "new", prompt(2))  # reuses the freed blocks: other tokens' KV
    decode(d, "old", prompt(1), first, stale)
    out = run(d, {"old"})["old"]
    assert (out.finish_reason, out.error) == (FinishReason.LENGTH, None)
    assert d.stats().num_prompt_tokens_computed == 300  # the load was refused by its check, nothing wrong kept


def test_an_import_waits_for_room_and_never_starves_the_queue():
    d = core("grpc")  # 64 blocks of 64 tokens
    p = core("grpc")
    layout = p.info.kv_layout
    staging = StagingFile(staging_nbytes(layout, 40) * 3, "tandem-kv-test")
    try:
        descs = []
        for i in range(3):  # each needs 32 blocks with its growth: two fit at once, the third waits
            tokens = prompt(i, 1900)
            first, _ = prefill(p, f"r{i}", tokens)
            desc = p.export_kv(f"r{i}", staging.path, i * staging_nbytes(layout, 40))
            p.release_kv(f"r{i}")
            descs.append((tokens, first, desc))
            assert descriptor.decode(desc).num_blocks == 30
        for i, (tokens, first, desc) in enumerate(descs):
            decode(d, f"r{i}", tokens, first, desc, max_tokens=128)
        assert len(d.scheduler.importing) == 1 and d.stats().num_waiting == 3  # two fit with their growth
        finished = run(d, {"r0", "r1", "r2"})
    finally:
        staging.close()
    assert all(o.finish_reason is FinishReason.LENGTH and o.error is None for o in finished.values())
    assert d.stats().num_prompt_tokens_computed == 0 and d.stats().num_preemptions == 0


def test_descriptors_round_trip_and_reject_blocks_outside_the_cache():
    layout = core("grpc").info.kv_layout
    d = KvDescriptor(NIXL, layout, tuple(range(70)), (3, 9), "a", b"meta", 4096, 16)
    assert descriptor.decode(descriptor.encode(d)) == d
    with pytest.raises(InvalidRequestError, match="outside its cache"):
        descriptor.decode(descriptor.encode(KvDescriptor(NIXL, layout, tuple(range(70)), (3, 16), "a", b"", 0, 16)))


@needs_nixl
def test_a_read_after_the_sources_lease_ended_is_not_trusted_and_the_tokens_are_computed():
    p, d = core("nixl"), core("nixl")
    first, kv_params = prefill(p, "r", prompt())
    lapsed = descriptor.with_expiry(kv_params, time.time() - 1)
    assert descriptor.decode(lapsed).expires_unix_s < time.time()
    decode(d, "r", prompt(), first, lapsed)
    out = run(d, {"r"})["r"]
    assert (out.finish_reason, out.error) == (FinishReason.LENGTH, None)
    assert d.stats().num_prompt_tokens_computed == 300 and d.runner.mover.num_bytes_loaded == 0


@needs_nixl
def test_a_read_within_the_lease_is_used():
    p, d = core("nixl"), core("nixl")
    first, kv_params = prefill(p, "r", prompt())
    decode(d, "r", prompt(), first, descriptor.with_expiry(kv_params, time.time() + 60))
    out = run(d, {"r"})["r"]
    assert (out.finish_reason, out.error) == (FinishReason.LENGTH, None)
    assert d.stats().num_prompt_tokens_computed == 0


def test_with_expiry_leaves_what_is_not_a_descriptor_for_the_engine_to_refuse():
    assert descriptor.with_expiry(b"\x93garbage", 5.0) == b"\x93garbage"


@needs_nixl
@pytest.mark.parametrize("end", ["release", "abort", "expiry"])
def test_a_held_requests_blocks_are_exposed_to_readers_only_until_its_lease_ends(end):
    p = core("nixl")
    prefill(p, "held", prompt())
    prefill(p, "other", prompt(1))
    link = p.runner.mover.link
    assert set(link._exposed) == {"held", "other"}  # one registration per held request, none for the cache
    if end == "release":
        p.release_kv("held")
    elif end == "abort":
        p.abort("held")
    else:
        p.expire_held(time.monotonic() + 3600)
    assert "held" not in link._exposed  # deregistered before its blocks can go to another request
    assert ("other" in link._exposed) is (end != "expiry")


def test_a_bytes_engine_has_no_mover_and_moves_its_real_blocks_as_an_export():
    p, d = core(transports.BYTES), core(transports.BYTES)
    assert p.runner.mover is None and p.info.kv_transport == transports.BYTES
    first, kv_params = prefill(p, "r", prompt())
    assert kv_params == b""  # nothing for the decode engine to load itself: the blocks are pulled as bytes
    with pytest.raises(InvalidRequestError, match="exports its KV as bytes"):
        p.export_kv("r", "/nonexistent", 0)  # no staging connector asks it: its KV leaves as bytes only
    kv = p.export_kv("r")
    assert kv.num_blocks == 5 and len(kv.data) == staging_nbytes(p.info.kv_layout, 5)
    d.add(EngineRequest("r", prompt(), SamplingParams(max_tokens=8), kv=kv, output_token_ids=(first,)))
    out = run(d, {"r"})["r"]
    assert out.finish_reason is FinishReason.LENGTH and out.num_cached_tokens == 300
    assert d.stats().num_prompt_tokens_computed == 0
