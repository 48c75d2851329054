"""KV tiers in the engine core (modelled tiers, a fake runner, a test clock): write-through after a step, onboarding
from host and disk as a KV load while the batch steps, one load per block (no convoy), the cost check, failed and
aborted loads, per-tier events and stats."""

import pytest

from engines.base.block_hash import NONE_HASH, chain_block_hashes
from engines.base.engine_configs import BatchConfig
from engines.base.events import KvEventKind, KvTier
from engines.base.types import EngineRequest, FinishReason, KvLayout, SamplingParams
from engines.core.engine_core import CoreConfig, EngineCore
from engines.core.loads import LoadDone
from engines.core.runner import Done, RunnerInfo
from engines.core.sequence import SequenceStatus
from engines.core.step import SchedulerOutput
from engines.core.tiers.kv_tiers import Onboard, OnboardBlock, TierSpec
from engines.core.tiers.modelled_tiers import ModelledTiers

BS = 4
NEXT = 7
BLOCK_BYTES = 1000


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class TierRunner:
    """Samples NEXT; its tiers are modelled: a host block loads in 1 s, a disk block in 2 s (test clock)."""

    def __init__(self, clock: Clock, num_blocks: int, spec: TierSpec, fail: bool = False):
        self.info = RunnerInfo(KvLayout(1, 1, 1, "float32", BS), num_blocks, 1024, 1000)
        self.tiers = ModelledTiers(spec, host_bytes_per_s=BLOCK_BYTES, disk_bytes_per_s=BLOCK_BYTES / 2, clock=clock)
        self.steps: list[list[tuple[str, int, int]]] = []
        self.started = []
        self.fail = fail

    def launch(self, out):
        self.steps.append([(s.seq.req_id, s.start, s.num_new_tokens) for s in out.scheduled])
        return Done([(NEXT, None)] * len(out.sampling))

    def step_duration(self, out) -> float:
        return 0.0

    def start_load(self, load) -> None:
        self.started.append(load)
        self.tiers.start_load(load)

    def poll_loads(self):
        done = self.tiers.poll_loads()
        return [LoadDone(d.req_id, False, "broken") for d in done] if self.fail else done


def make_core(num_blocks=8, host=8, disk=0, fail=False, max_num_seqs=8):
    clock = Clock()
    spec = TierSpec(num_host_blocks=host, num_disk_blocks=disk, block_bytes=BLOCK_BYTES)
    core = EngineCore(
        CoreConfig(BatchConfig(max_num_seqs, 64)),
        TierRunner(clock, num_blocks, spec, fail),
        clock,
    )
    return core, clock


def request(req_id, tokens, max_tokens=1):
    return EngineRequest(req_id, tuple(tokens), SamplingParams(max_tokens=max_tokens, ignore_eos=True))


def run_until_idle(core, clock, max_iters=50):
    outs = []
    for _ in range(max_iters):
        core.poll_loads()
        outs += core.step()
        if not (core.has_work or core.has_loads):
            return outs
        if core.has_loads and not core.has_work:
            clock.now += 1.0
    raise AssertionError("engine did not settle")


A = list(range(100, 113))  # 3 full blocks and a token
HA = chain_block_hashes(A, BS)
B = list(range(500, 532))  # 8 full blocks: enough to evict A from an 8-block device pool


def evict_a(core, clock):
    core.add(request("b", B))
    run_until_idle(core, clock)
    assert not any(h in core.block_manager.cached for h in HA)


# -- write-through -----------------------------------------------------------------------------
def test_blocks_a_step_completes_are_written_through_to_host_once():
    core, clock = make_core()
    core.add(request("a", A))
    run_until_idle(core, clock)
    tiers = core.tiering.tiers
    assert list(tiers.host.blocks) == HA and tiers.counters.num_host_offloaded == 3
    events = core.drain_kv_events()
    host = [e for e in events if e.tier is KvTier.HOST]
    assert [(e.kind, e.parent_hash, e.block_hashes) for e in host] == [(KvEventKind.STORED, NONE_HASH, tuple(HA))]
    core.add(request("a2", A))  # a device hit: nothing copied again
    run_until_idle(core, clock)
    assert tiers.counters.num_host_offloaded == 3
    s = core.stats()
    assert (s.num_host_blocks_total, s.num_host_blocks_used, s.num_blocks_offloaded_host) == (8, 3, 3)


# -- onboarding --------------------------------------------------------------------------------
def test_a_host_hit_is_loaded_while_the_batch_steps_then_only_the_rest_is_computed():
    core, clock = make_core(num_blocks=8, host=16)
    core.add(request("a", A))
    run_until_idle(core, clock)
    evict_a(core, clock)
    core.runner.steps.clear()
    core.add(request("other", range(900, 905), max_tokens=3))
    core.add(request("a2", A + [1, 2, 3]))
    out = core.step()  # "other" runs; "a2" starts loading its 3 blocks from the host tier
    load = core.runner.started[-1]
    assert load.req_id == "a2" and load.num_tokens == 12 and len(load.block_ids) == 3
    assert [b.tier for b in load.source.blocks] == [KvTier.HOST] * 3
    assert [b.block_hash for b in load.source.blocks] == HA
    assert core.seqs["a2"].status is SequenceStatus.LOADING
    assert core.runner.steps == [[("other", 0, 5)]] and out[0].req_id == "other"
    clock.now += 2.0  # 3 blocks at 1 block/s: not yet
    core.poll_loads()
    core.step()
    assert core.seqs["a2"].status is SequenceStatus.LOADING
    clock.now += 1.0
    outs = run_until_idle(core, clock)
    assert ("a2", 12, 4) in core.runner.steps[-2] + core.runner.steps[-1]  # only the 4 new tokens computed
    last = [o for o in outs if o.req_id == "a2"][-1]
    assert last.finish_reason is FinishReason.LENGTH and last.num_cached_tokens == 12
    s = core.stats()
    assert (s.prefix_hits_host, s.num_blocks_onboarded_host, s.num_onboards) == (12, 3, 1)
    assert s.onboard_seconds == 3.0


def test_requests_needing_blocks_a_load_brings_wait_for_it_instead_of_loading_again():
    core, clock = make_core(num_blocks=16, host=16)
    core.add(request("a", A))
    run_until_idle(core, clock)
    core.reset_prefix_cache()  # forgets every tier: rebuild host-only copies of A
    core.add(request("a", A))
    run_until_idle(core, clock)
    core.block_manager.reset_prefix_cache()  # the device cache alone forgets A; the host tier keeps it
    core.runner.started.clear()
    core.add(request("x", A + [1]))
    core.add(request("y", A + [2, 3]))
    core.step()
    assert [load.req_id for load in core.runner.started] == ["x"]  # one load, started once
    assert core.seqs["y"].status is SequenceStatus.LOADING and core.seqs["y"].block_table == []
    clock.now += 3.0
    outs = run_until_idle(core, clock)
    done = {o.req_id: o for o in outs if o.finished}
    assert done["x"].num_cached_tokens == 12 and done["y"].num_cached_tokens == 12  # y hit x's loaded blocks
    assert len(core.runner.started) == 1


def test_a_disk_hit_loads_from_disk_and_comes_back_to_host():
    core, clock = make_core(num_blocks=8, host=3, disk=8)
    core.add(request("a", A))
    run_until_idle(core, clock)
    core.add(request("a2", A))  # a device hit: the second sighting sends A's blocks to disk
    run_until_idle(core, clock)
    tiers = core.tiering.tiers
    assert list(tiers.disk.blocks) == HA
    evict_a(core, clock)  # B's 8 blocks also push A out of the 3-slot host tier
    assert not any(h in tiers.host for h in HA)
    core.runner.started.clear()
    core.add(request("a3", A))
    core.step()
    load = core.runner.started[-1]
    assert [b.tier for b in load.source.blocks] == [KvTier.DISK] * 3
    clock.now += 6.0  # 3 blocks at half a block per second
    outs = run_until_idle(core, clock)
    assert [o for o in outs if o.req_id == "a3"][-1].num_cached_tokens == 12
    assert all(h in tiers.host for h in HA)  # onboarded blocks are written through to host again
    s = core.stats()
    assert (s.prefix_hits_disk, s.num_blocks_onboarded_disk, s.num_blocks_offloaded_disk) == (12, 3, 3)


def test_the_cost_check_skips_a_tier_slower_than_recomputing():
    core, clock = make_core(num_blocks=8, host=16)
    core.add(request("a", A))
    run_until_idle(core, clock)
    evict_a(core, clock)
    core.tiering.prefill_tokens_per_s = 100.0  # 4 tokens in 0.04 s beat a 1 s host load
    core.runner.started.clear()
    core.add(request("a2", A))
    outs = run_until_idle(core, clock)
    assert core.runner.started == []
    assert outs[-1].num_cached_tokens == 0
    core.tiering.prefill_tokens_per_s = 1.0  # 4 s to recompute a block: the 1 s load wins
    evict_a(core, clock)
    core.runner.started.clear()
    core.add(request("a3", A))
    run_until_idle(core, clock)
    assert [load.req_id for load in core.runner.started] == ["a3"]


def test_a_failed_load_computes_its_tokens_and_does_not_try_again():
    core, clock = make_core(num_blocks=8, host=16, fail=True)
    core.add(request("a", A))
    run_until_idle(core, clock)
    evict_a(core, clock)
    core.runner.started.clear()
    core.add(request("a2", A))
    outs = run_until_idle(core, clock)
    assert len(core.runner.started) == 1
    assert outs[-1].finish_reason is FinishReason.LENGTH and outs[-1].num_cached_tokens == 0
    assert core.stats().num_onboards == 0
    assert core.block_manager.num_free_blocks == 8  # nothing leaked


def test_an_aborted_loading_request_frees_its_blocks_when_the_load_ends():
    core, clock = make_core(num_blocks=8, host=16)
    core.add(request("a", A))
    run_until_idle(core, clock)
    evict_a(core, clock)
    core.add(request("a2", A))
    core.step()
    assert core.seqs["a2"].status is SequenceStatus.LOADING
    assert core.abort("a2").finish_reason is FinishReason.ABORT
    assert core.block_manager.num_free_blocks == 5  # the 3 destination blocks are still being written
    clock.now += 3.0
    core.poll_loads()
    assert core.block_manager.num_free_blocks == 8
    assert all(b.num_pins == 0 for b in core.tiering.tiers.host.blocks.values())


def test_a_block_leaves_the_device_tier_but_stays_announced_in_host():
    core, clock = make_core(num_blocks=8, host=16)
    core.add(request("a", A))
    run_until_idle(core, clock)
    core.drain_kv_events()
    evict_a(core, clock)
    events = core.drain_kv_events()
    removed = {h for e in events if e.kind is KvEventKind.REMOVED for h in e.block_hashes if e.tier is KvTier.DEVICE}
    assert set(HA) <= removed
    assert not any(
        e.kind is KvEventKind.REMOVED and e.tier is KvTier.HOST and set(HA) & set(e.block_hashes) for e in events
    )
    assert {h for (h, tier) in core.kv_events._live if tier is KvTier.HOST} >= set(HA)


def test_reset_prefix_cache_forgets_every_tier():
    core, clock = make_core(num_blocks=8, host=16, disk=8)
    core.add(request("a", A))
    run_until_idle(core, clock)
    core.add(request("a2", A))
    run_until_idle(core, clock)
    assert len(core.tiering.tiers.disk) == 3
    core.reset_prefix_cache()
    assert len(core.tiering.tiers.host) == 0 and len(core.tiering.tiers.disk) == 0
    assert [e.kind for e in core.drain_kv_events()] == [KvEventKind.CLEARED]


def test_an_onboard_source_names_each_blocks_slot_and_tokens():
    core, clock = make_core(num_blocks=8, host=16)
    core.add(request("a", A))
    run_until_idle(core, clock)
    evict_a(core, clock)
    core.add(request("a2", A))
    core.step()
    source = core.runner.started[-1].source
    assert source == Onboard(
        (
            OnboardBlock(KvTier.HOST, 0, HA[0], NONE_HASH, tuple(A[0:4])),
            OnboardBlock(KvTier.HOST, 1, HA[1], HA[0], tuple(A[4:8])),
            OnboardBlock(KvTier.HOST, 2, HA[2], HA[1], tuple(A[8:12])),
        )
    )


def test_a_loaded_request_goes_back_ahead_of_requests_holding_no_blocks():
    core, clock = make_core(num_blocks=8, host=16, max_num_seqs=1)
    core.add(request("a", A))
    run_until_idle(core, clock)
    evict_a(core, clock)
    core.add(request("busy", range(900, 905), max_tokens=4))
    core.step()  # "busy" holds the one running slot
    core.add(request("a2", A + [1, 2, 3]))
    core.seqs["a2"].may_onboard = True
    core.scheduler._maybe_onboard(core.seqs["a2"], core.scheduler._outstanding())  # planned while the batch is full
    core._start_new_loads()
    clock.now += 0.5
    core.add(request("late", range(950, 954)))  # arrives while a2 loads
    clock.now += 2.5
    core.poll_loads()
    assert [s.req_id for s in core.scheduler.waiting] == ["a2", "late"]


def test_loaded_requests_never_hold_the_pool_among_them_with_nothing_left_to_run():
    system = list(range(100, 116))  # 4 blocks every user shares
    users = [system + list(range(200 + 10 * u, 208 + 10 * u)) for u in range(6)]
    core, clock = make_core(num_blocks=16, host=64)

    def settle():
        for _ in range(400):
            core.poll_loads()
            if not core.step():
                clock.now += 1.0  # nothing ran: time passes for the loads
            if not (core.has_work or core.has_loads):
                return
        raise AssertionError(f"stuck: {[(s.req_id, s.status) for s in core.seqs.values()]}")

    for u, prompt in enumerate(users):
        core.add(request(f"first-{u}", prompt + [1], max_tokens=2))
    settle()
    core.add(request("evict", range(3000, 3064)))
    settle()
    for u, prompt in enumerate(users):  # 6 x 7 blocks do not fit 16: each may load only when its prompt then fits
        core.add(request(f"second-{u}", prompt + [1, 5, 6, 7, 8], max_tokens=2))
    settle()
    assert core.stats().prefix_hits_host > 0


@pytest.mark.parametrize("num_blocks", [40, 48, 56, 64])
def test_conversations_outgrowing_the_pool_always_finish_every_round(num_blocks):
    """Six users resend their growing histories each round (a shared 8-block system part); the device pool holds
    two or three of them: with loads, waiting requests holding blocks and preemptions, no round may stall."""
    history = [list(range(100, 132)) + [1000 + 100 * u + k for k in range(32)] for u in range(6)]
    core, clock = make_core(num_blocks=num_blocks, host=400)
    for rnd in range(8):
        for u in range(6):
            core.add(request(f"r{rnd}-{u}", history[u], max_tokens=4))
        for _ in range(3000):
            core.poll_loads()
            if not core.step():
                clock.now += 1.0  # nothing ran: time passes for the loads
            if not (core.has_work or core.has_loads):
                break
        else:
            raise AssertionError(f"round {rnd} stalled: {[(s.req_id, s.status) for s in core.seqs.values()]}")
        history = [h + [7] * 4 + [2000 + 100 * u + 10 * rnd + k for k in range(8)] for u, h in enumerate(history)]
    assert core.stats().prefix_hits_host > 0


def a_only_in_host(num_blocks=8, host=16):
    """A core whose host tier holds A's blocks and whose device pool does not."""
    core, clock = make_core(num_blocks=num_blocks, host=host)
    core.add(request("a", A))
    run_until_idle(core, clock)
    evict_a(core, clock)
    return core, clock


def test_a_request_onboarded_again_after_a_preemption_counts_its_cached_tokens_once():
    core, clock = a_only_in_host()
    core.add(request("a2", A + [1, 2, 3], max_tokens=4))
    core.step()  # a2 loads A's 3 blocks from host
    clock.now += 3.0
    core.poll_loads()
    first = core.step()[0]  # admitted: its 4 new tokens computed, a first token out
    assert first.num_cached_tokens == 12
    seq = core.seqs["a2"]
    core.scheduler.running.remove(seq)  # preempted as the scheduler does it ...
    core.scheduler._preempt(seq, SchedulerOutput())
    assert core.block_manager.reset_prefix_cache() is not None  # ... and its device blocks reused meanwhile
    core.runner.started.clear()
    outs = run_until_idle(core, clock)
    assert [load.req_id for load in core.runner.started] == ["a2"]  # onboarded again from host
    assert {o.num_cached_tokens for o in outs} == {12}
    s = core.stats()
    counts = (s.prefix_queries, s.prefix_hits, s.prefix_hits_host, s.num_blocks_onboarded_host)
    assert counts == (13 + 32 + 16, 12, 12, 3 + 4)  # a, b, a2 queried; a2's host hit counted once, loaded twice


def test_a_request_waiting_for_room_to_load_its_prefix_is_not_admitted_by_computing_it():
    core, clock = a_only_in_host()
    core.runner.steps.clear()
    core.add(request("r1", [900], max_tokens=8))
    core.add(request("r2", [950], max_tokens=8))
    core.step()
    core.add(request("a2", A + [1, 2, 3, 4, 5, 6, 7], max_tokens=4))  # 6 blocks: its load does not fit beside r1, r2
    core.step()
    assert core.seqs["a2"].status is SequenceStatus.WAITING and core.runner.started == []
    outs = run_until_idle(core, clock, max_iters=100)
    assert [load.req_id for load in core.runner.started] == ["a2"]
    assert not any(name == "a2" and start == 0 for step in core.runner.steps for name, start, _ in step)
    assert {o.num_cached_tokens for o in outs if o.req_id == "a2"} == {12}
    assert core.stats().num_preemptions == 0


def test_a_request_waiting_for_room_to_load_is_not_computed_while_a_loaded_request_is_about_to_run():
    clock = Clock()
    spec = TierSpec(num_host_blocks=64, block_bytes=BLOCK_BYTES)
    core = EngineCore(CoreConfig(BatchConfig(8, 8)), TierRunner(clock, 8, spec), clock)
    d = list(range(300, 317))  # 4 full blocks and a token
    for name, prompt in (("a", A), ("d", d), ("b", B)):  # B pushes A and D out of the 8-block device pool
        core.add(request(name, prompt))
        run_until_idle(core, clock)
    core.runner.started.clear()
    core.runner.steps.clear()
    core.add(request("x", A + [1, 2, 3]))  # loads A's 3 blocks
    core.add(request("c", d + [9]))  # its 5 blocks do not fit beside x's
    core.step()
    clock.now += 3.0
    core.poll_loads()  # x holds its loaded blocks, nothing runs, nothing loads: x runs next, then c loads
    outs = run_until_idle(core, clock, max_iters=100)
    assert [load.req_id for load in core.runner.started] == ["x", "c"]
    assert not any(name == "c" and start == 0 for step in core.runner.steps for name, start, _ in step)
    assert {o.req_id: o.num_cached_tokens for o in outs} == {"x": 12, "c": 16}
