"""Tenant isolation in the engine core: a request's hash root (its cache salt, keyed by the deployment secret) enters
the first block's hash, so tenants never hit each other's cached blocks while each still hits its own."""

from engines.base.block_hash import NONE_HASH, chain_block_hashes, chain_root
from engines.base.engine_configs import CacheConfig
from engines.base.events import KvEvent, KvEventKind, KvTier
from engines.base.types import EngineRequest, SamplingParams
from engines.core import messages
from engines.core.block_manager import BlockManager
from engines.core.sequence import Sequence
from engines.zero.runner import ZeroSpec, build_core

BS = 4
TOKENS = list(range(100, 113))  # three full blocks and one token
ROOT_A, ROOT_B = chain_root("tenant-a", "s3cret"), chain_root("tenant-b", "s3cret")


def test_the_root_is_none_hash_only_without_salt_and_secret():
    assert chain_root() == NONE_HASH
    roots = {chain_root("a"), chain_root("b"), chain_root("", "s1"), chain_root("", "s2"), chain_root("a", "s1")}
    assert len(roots) == 5 and NONE_HASH not in roots
    assert chain_root("a", "s1") == chain_root("a", "s1")  # every process derives the same root


def test_a_root_changes_every_block_hash_of_the_chain():
    plain, salted = chain_block_hashes(TOKENS, BS), chain_block_hashes(TOKENS, BS, ROOT_A)
    assert len(plain) == len(salted) == 3
    assert all(p != s for p, s in zip(plain, salted))


def _seq(req_id: str, root: int) -> Sequence:
    return Sequence(req_id, list(TOKENS), len(TOKENS), SamplingParams(max_tokens=4), hash_root=root)


def _prefill(bm: BlockManager, seq: Sequence) -> list[int]:
    computed = bm.get_computed_blocks(seq)
    assert bm.allocate_slots(seq, seq.num_tokens - len(computed) * BS, computed)
    seq.num_computed_tokens = seq.num_tokens
    return computed


def test_block_manager_serves_a_prefix_only_to_the_same_root():
    bm = BlockManager(num_blocks=16, block_size=BS)
    first = _seq("a1", ROOT_A)
    assert _prefill(bm, first) == []
    assert _prefill(bm, _seq("b1", ROOT_B)) == []  # same tokens, other tenant: no hit
    assert _prefill(bm, _seq("u1", NONE_HASH)) == []  # nor for unsalted traffic
    assert _prefill(bm, _seq("a2", ROOT_A)) == first.block_table[:3]  # the tenant's own repeat hits
    assert first.block_hashes == chain_block_hashes(TOKENS, BS, ROOT_A)


def test_stored_events_carry_salted_hashes_but_never_the_root():
    bm = BlockManager(num_blocks=8, block_size=BS)
    _prefill(bm, _seq("a1", ROOT_A))
    stored = bm.drain_events().stored
    hashes = chain_block_hashes(TOKENS, BS, ROOT_A)
    assert [(parent, h) for parent, h, _ in stored] == [
        (NONE_HASH, hashes[0]),
        (hashes[0], hashes[1]),
        (hashes[1], hashes[2]),
    ]


def _run(core, request: EngineRequest) -> int:
    core.add(request)
    cached = 0
    for _ in range(50):
        for out in core.step():
            if out.req_id == request.req_id:
                cached = max(cached, out.num_cached_tokens)
                if out.finish_reason is not None:
                    return cached
    raise AssertionError("the request did not finish")


def test_engine_core_reports_no_cached_tokens_across_tenants(tmp_path):
    core = build_core(ZeroSpec(model=str(tmp_path), cache=CacheConfig(block_size=BS, num_blocks=64)))
    prompt, params = tuple(TOKENS), SamplingParams(max_tokens=2, ignore_eos=True)
    assert _run(core, EngineRequest("a1", prompt, params, hash_root=ROOT_A)) == 0
    assert _run(core, EngineRequest("b1", prompt, params, hash_root=ROOT_B)) == 0
    assert _run(core, EngineRequest("a2", prompt, params, hash_root=ROOT_A)) == 3 * BS
    events = core.drain_kv_events()
    stored = [e for e in events if e.kind is KvEventKind.STORED]
    a_hashes, b_hashes = (tuple(chain_block_hashes(TOKENS, BS, r)) for r in (ROOT_A, ROOT_B))
    assert stored[0] == KvEvent(stored[0].seq, KvEventKind.STORED, NONE_HASH, a_hashes, KvTier.DEVICE)
    assert stored[1] == KvEvent(stored[1].seq, KvEventKind.STORED, NONE_HASH, b_hashes, KvTier.DEVICE)


def test_the_engine_process_wire_keeps_the_salt_and_the_root():
    request = EngineRequest("r", (1, 2, 3), SamplingParams(cache_salt="t:x"), hash_root=ROOT_A)
    assert messages.decode(messages.encode(messages.Add(request))).request == request
