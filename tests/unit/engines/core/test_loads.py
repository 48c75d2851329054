"""KV loads in the engine core: a LOADING sequence holds its blocks and is never scheduled while the batch steps;
a finished load queues it with the tokens computed, a failed one falls back to computing them, an abort waits for
the load to end before its blocks go, and a load several sequences share is started once."""

import pytest

from engines.base.engine_configs import BatchConfig
from engines.base.errors import InvalidRequestError
from engines.base.types import FinishReason, KvLayout, SamplingParams
from engines.core.engine_core import CoreConfig, EngineCore
from engines.core.loads import KvLoad, LoadDone
from engines.core.runner import Done, RunnerInfo
from engines.core.sequence import Sequence, SequenceStatus

BS = 4
NEXT = 7


class FakeRunner:
    """Samples NEXT; records started loads; ends them when a test says so."""

    def __init__(self, num_blocks: int = 16):
        self.info = RunnerInfo(KvLayout(1, 1, 1, "float32", BS), num_blocks, 1024, 1000)
        self.started: list[KvLoad] = []
        self.ended: list[LoadDone] = []
        self.steps: list[list[tuple[str, int, int]]] = []

    def launch(self, out):
        self.steps.append([(s.seq.req_id, s.start, s.num_new_tokens) for s in out.scheduled])
        return Done([(NEXT, None)] * len(out.sampling))

    def step_duration(self, out) -> float:
        return 0.0

    def start_load(self, load: KvLoad) -> None:
        if load.source == "bad":
            raise InvalidRequestError("unreadable source")
        self.started.append(load)

    def poll_loads(self) -> list[LoadDone]:
        ended, self.ended = self.ended, []
        return ended


def make_core(num_blocks: int = 16) -> EngineCore:
    return EngineCore(CoreConfig(BatchConfig(8, 64)), FakeRunner(num_blocks))


def make_seq(core: EngineCore, req_id: str, tokens, max_tokens: int = 2) -> Sequence:
    seq = Sequence(req_id, list(tokens), len(tokens), SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    core.seqs[req_id] = seq
    return seq


def test_a_loading_sequence_waits_while_the_batch_steps_then_computes_only_the_rest():
    core = make_core()
    other = make_seq(core, "other", range(100, 105))
    core.scheduler.add(other)
    seq = make_seq(core, "a", range(10))
    assert core.start_load(seq, 8, "src")
    assert core.runner.started == [KvLoad("a", (0, 1), 8, "src")]
    assert seq.status is SequenceStatus.LOADING and seq.block_table == [0, 1]
    assert core.stats().num_waiting == 2 and core.has_loads
    core.step()
    core.step()
    assert core.runner.steps == [[("other", 0, 5)], [("other", 5, 1)]]
    core.runner.ended.append(LoadDone("a", True))
    core.step()
    assert core.runner.steps[-1] == [("a", 8, 2)]  # the loaded 8 tokens are not computed again
    assert seq.num_cached_tokens == 8 and not core.has_loads


def test_loaded_blocks_enter_the_prefix_cache_only_when_the_load_ends():
    core = make_core()
    seq = make_seq(core, "a", range(10))
    core.start_load(seq, 8, "src")
    probe = Sequence("p", list(range(9)), 9, SamplingParams())
    assert core.block_manager.get_computed_blocks(probe) == []  # NOTE: nothing is written there yet
    core.runner.ended.append(LoadDone("a", True))
    core.poll_loads()
    assert core.block_manager.get_computed_blocks(probe) == [0, 1]
    assert [len(e.block_hashes) for e in core.drain_kv_events()] == [2]


def test_a_failed_load_frees_its_blocks_and_the_tokens_are_computed():
    core = make_core()
    seq = make_seq(core, "a", range(10))
    core.start_load(seq, 8, "src")
    core.runner.ended.append(LoadDone("a", False, "connection reset"))
    core.step()
    assert core.runner.steps == [[("a", 0, 10)]]
    assert seq.num_cached_tokens == 0


def test_a_failed_load_keeps_the_blocks_before_it():
    core = make_core()
    seq = make_seq(core, "a", range(12))
    assert core.block_manager.allocate_slots(seq, 4)
    seq.num_computed_tokens = 4
    core.start_load(seq, 4, "src")
    assert core.runner.started[0].block_ids == (1,)
    core.runner.ended.append(LoadDone("a", False, "gone"))
    core.step()
    assert core.runner.steps == [[("a", 4, 8)]] and seq.block_table[0] == 0


def test_an_abort_while_loading_frees_the_blocks_only_when_the_load_ends():
    core = make_core()
    seq = make_seq(core, "a", range(10))
    core.start_load(seq, 8, "src")
    free = core.block_manager.num_free_blocks
    out = core.abort("a")
    assert out.finish_reason is FinishReason.ABORT
    assert core.block_manager.num_free_blocks == free  # NOTE: the runner may still be writing them
    core.runner.ended.append(LoadDone("a", True))
    core.poll_loads()
    assert core.block_manager.num_free_blocks == free + 2 and seq.status is SequenceStatus.FINISHED
    assert not core.has_work and core.step() == []


def test_no_room_or_a_refused_source_changes_nothing():
    core = make_core(num_blocks=2)
    seq = make_seq(core, "a", range(10))
    assert not core.start_load(seq, 10, "src")
    assert seq.block_table == [] and core.block_manager.num_free_blocks == 2
    with pytest.raises(InvalidRequestError):
        core.start_load(seq, 4, "bad")
    assert seq.block_table == [] and core.block_manager.num_free_blocks == 2 and not core.has_loads


def test_a_load_several_sequences_share_is_started_once():
    core = make_core()
    a = make_seq(core, "a", range(10))
    b = make_seq(core, "b", range(10))
    core.start_load(a, 8, "src")
    for block_id in a.block_table[:2]:
        core.block_manager._touch(block_id)
    b.block_table = a.block_table[:2]
    core.join_load(b, "a")
    assert len(core.runner.started) == 1 and core.stats().num_waiting == 2
    core.runner.ended.append(LoadDone("a", True))
    core.step()
    assert sorted(core.runner.steps[0]) == [("a", 8, 2), ("b", 8, 2)]


def test_a_load_starts_at_a_block_boundary():
    core = make_core()
    seq = make_seq(core, "a", range(10))
    seq.num_computed_tokens = 2
    with pytest.raises(ValueError, match="block boundary"):
        core.start_load(seq, 4, "src")


class _Channel:
    def __init__(self):
        self.sent, self.waits = [], []

    def recv(self, timeout):
        self.waits.append(timeout)
        return []

    def send(self, message):
        self.sent.append(message)


def test_the_engine_loop_polls_loads_each_iteration_and_waits_briefly_on_them():
    from engines.core.loop import IDLE_WAIT_S, LOAD_WAIT_S, EngineLoop

    core = make_core()
    loop = EngineLoop(core, _Channel())
    core.start_load(make_seq(core, "a", range(10)), 8, "src")
    loop.iterate()
    assert loop.channel.waits == [LOAD_WAIT_S] and core.runner.steps == []
    core.runner.ended.append(LoadDone("a", True))
    loop.iterate()
    assert core.runner.steps == [[("a", 8, 2)]]
    loop.iterate()
    loop.iterate()
    assert loop.channel.waits[-1] == IDLE_WAIT_S
    assert [o.new_token_ids for m in loop.channel.sent for o in m.outputs] == [(NEXT,), (NEXT,)]
