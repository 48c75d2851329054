"""Scheduler on CPU: token budgets, chunked prefill, prefix hits on admission, preemption by recompute, and the
commit of a step's tokens (`update_from_output`); every sampled token is NEXT."""

from engines.base.block_hash import NONE_HASH, hash_block
from engines.base.engine_configs import BatchConfig
from engines.base.types import FinishReason, SamplingParams
from engines.core.block_manager import BlockManager
from engines.core.scheduler import Scheduler, SchedulerConfig
from engines.core.sequence import Sequence, SequenceStatus

BS = 4
NEXT = 900  # the token every simulated step samples


def make_sched(num_blocks=16, max_num_batched_tokens=64, max_num_seqs=8, chunked=True, caching=True) -> Scheduler:
    bm = BlockManager(num_blocks, BS, enable_prefix_caching=caching)
    return Scheduler(
        SchedulerConfig(BatchConfig(max_num_seqs, max_num_batched_tokens, enable_chunked_prefill=chunked)), bm
    )


def make_seq(req_id: str, tokens, max_tokens: int = 32, hold_kv: bool = False) -> Sequence:
    return Sequence(
        req_id, list(tokens), len(tokens), SamplingParams(max_tokens=max_tokens, ignore_eos=True), hold_kv=hold_kv
    )


def step(sched: Scheduler) -> list[tuple[str, int, int, bool]]:
    """One engine step; returns (req_id, start, num_new_tokens, samples) per scheduled sequence."""
    out = sched.schedule()
    plan = [(s.seq.req_id, s.start, s.num_new_tokens, s.samples) for s in out.scheduled]
    sched.update_from_output(out, [(NEXT, None)] * len(out.sampling))
    return plan


def admitted(sched: Scheduler, *seqs: Sequence) -> None:
    """Put already-computed sequences straight into running (their last token still to compute)."""
    for seq in seqs:
        assert sched.block_manager.allocate_slots(seq, seq.num_tokens - 1)
        seq.num_computed_tokens = seq.num_tokens - 1
        seq.status, seq.was_admitted = SequenceStatus.RUNNING, True
        sched.running.append(seq)


# -- budget and chunking ---------------------------------------------------------------------
def test_prefill_then_decode_one_token_per_step():
    sched = make_sched()
    a = make_seq("a", range(6), max_tokens=3)
    sched.add(a)
    assert a.status is SequenceStatus.WAITING and sched.has_work
    assert step(sched) == [("a", 0, 6, True)]
    assert a.status is SequenceStatus.RUNNING and a.block_table == [0, 1]
    assert step(sched) == [("a", 6, 1, True)]
    assert step(sched) == [("a", 7, 1, True)]
    assert a.finish_reason is FinishReason.LENGTH and a.status is SequenceStatus.FINISHED
    assert a.token_ids == list(range(6)) + [NEXT] * 3
    assert not sched.has_work
    assert sched.schedule().scheduled == []


def test_chunked_prefill_cuts_a_long_prompt_into_budget_sized_chunks():
    sched = make_sched(max_num_batched_tokens=4)
    a = make_seq("a", range(10))
    sched.add(a)
    assert step(sched) == [("a", 0, 4, False)]
    assert a.block_table == [0] and a.num_tokens == 10
    assert step(sched) == [("a", 4, 4, False)]
    assert a.block_table == [0, 1]
    assert step(sched) == [("a", 8, 2, True)]
    assert a.block_table == [0, 1, 2] and a.num_tokens == 11
    assert step(sched) == [("a", 10, 1, True)]


def test_running_first_then_waiting_in_the_leftover_budget():
    sched = make_sched(max_num_batched_tokens=4)
    a = make_seq("a", range(3))
    sched.add(a)
    assert step(sched) == [("a", 0, 3, True)]
    b, c = make_seq("b", range(10, 20)), make_seq("c", range(30, 32))
    sched.add(b)
    sched.add(c)
    out = sched.schedule()
    assert [(s.seq.req_id, s.start, s.num_new_tokens) for s in out.scheduled] == [("a", 3, 1), ("b", 0, 3)]
    assert out.num_tokens == 4
    assert list(sched.waiting) == [c]


def test_budget_caps_running_decodes_and_admissions():
    sched = make_sched(max_num_batched_tokens=2)
    a, b, c = make_seq("a", [1], max_tokens=2), make_seq("b", [2], max_tokens=2), make_seq("c", [3], max_tokens=2)
    for seq in (a, b, c):
        sched.add(seq)
    assert step(sched) == [("a", 0, 1, True), ("b", 0, 1, True)]
    assert step(sched) == [("a", 1, 1, True), ("b", 1, 1, True)]  # c still waits: no budget
    assert a.is_finished and b.is_finished and sched.running == []
    assert step(sched) == [("c", 0, 1, True)]


def test_running_sequences_past_the_budget_are_not_scheduled_this_step():
    sched = make_sched(max_num_batched_tokens=2)
    a, b, c = make_seq("a", [1, 2]), make_seq("b", [3, 4]), make_seq("c", [5, 6])
    admitted(sched, a, b, c)
    out = sched.schedule()
    assert [(s.seq.req_id, s.start, s.num_new_tokens) for s in out.scheduled] == [("a", 1, 1), ("b", 1, 1)]
    assert out.preempted == [] and sched.running == [a, b, c]


def test_without_chunked_prefill_a_prompt_waits_for_its_whole_budget():
    sched = make_sched(max_num_batched_tokens=8, chunked=False)
    a = make_seq("a", range(3), max_tokens=2)
    sched.add(a)
    assert step(sched) == [("a", 0, 3, True)]
    b, c = make_seq("b", range(10, 18)), make_seq("c", [40])
    sched.add(b)
    sched.add(c)
    assert step(sched) == [("a", 3, 1, True)]  # b needs 8 > 7 left; c queues behind it
    assert a.is_finished
    assert list(sched.waiting) == [b, c] and b.block_table == []
    assert step(sched) == [("b", 0, 8, True)]
    assert step(sched) == [("b", 8, 1, True), ("c", 0, 1, True)]


def test_max_num_seqs_caps_the_running_set():
    sched = make_sched(max_num_seqs=2)
    a, b, c = make_seq("a", [1], max_tokens=1), make_seq("b", [2], max_tokens=3), make_seq("c", [3])
    for seq in (a, b, c):
        sched.add(seq)
    assert step(sched) == [("a", 0, 1, True), ("b", 0, 1, True)]
    assert a.is_finished and sched.running == [b] and list(sched.waiting) == [c]
    assert step(sched) == [("b", 1, 1, True), ("c", 0, 1, True)]
    assert sched.running == [b, c]


# -- prefix hits on admission ----------------------------------------------------------------
def test_prefix_hit_on_admission_skips_cached_blocks_and_is_counted():
    sched = make_sched(num_blocks=8)
    a = make_seq("a", range(10), max_tokens=1)
    sched.add(a)
    assert step(sched) == [("a", 0, 10, True)]
    assert a.is_finished and sched.block_manager.num_free_blocks == 8  # freed, blocks 0 and 1 cached
    b = make_seq("b", list(range(8)) + [50, 51])
    sched.add(b)
    assert step(sched) == [("b", 8, 2, True)]
    assert b.block_table == [0, 1, 2]  # hits 0 and 1 revived; a's unhashed tail 2 was at the front
    assert b.num_cached_tokens == 8
    assert (sched.prefix_queries, sched.prefix_hits) == (20, 8)
    assert a.num_cached_tokens == 0


def test_a_fully_cached_prompt_still_computes_its_last_block():
    sched = make_sched(num_blocks=8)
    a = make_seq("a", range(8))
    sched.add(a)
    step(sched)
    b = make_seq("b", range(8))
    sched.add(b)
    assert step(sched) == [("a", 8, 1, True), ("b", 4, 4, True)]
    assert b.block_table == [0, 3]
    assert sched.block_manager.blocks[0].ref_count == 2
    assert b.num_cached_tokens == 4
    assert (sched.prefix_queries, sched.prefix_hits) == (16, 4)


def test_prefix_hit_then_chunked_rest_of_the_prompt():
    sched = make_sched(num_blocks=8, max_num_batched_tokens=3)
    a = make_seq("a", range(5), max_tokens=1)
    sched.add(a)
    assert step(sched) == [("a", 0, 3, False)]
    assert step(sched) == [("a", 3, 2, True)]
    b = make_seq("b", list(range(4)) + [60, 61, 62, 63, 64])
    sched.add(b)
    assert step(sched) == [("b", 4, 3, False)]
    assert step(sched) == [("b", 7, 2, True)]
    assert b.num_cached_tokens == 4 and sched.prefix_hits == 4


def test_no_prefix_hits_when_caching_is_off():
    sched = make_sched(num_blocks=8, caching=False)
    a = make_seq("a", range(9), max_tokens=1)
    sched.add(a)
    step(sched)
    b = make_seq("b", range(9))
    sched.add(b)
    assert step(sched) == [("b", 0, 9, True)]
    assert (sched.prefix_queries, sched.prefix_hits, b.num_cached_tokens) == (18, 0, 0)


# -- preemption by recompute -----------------------------------------------------------------
def test_out_of_blocks_preempts_the_last_running_sequence():
    sched = make_sched(num_blocks=2)
    a, b = make_seq("a", range(4)), make_seq("b", range(10, 14))
    sched.add(a)
    sched.add(b)
    assert step(sched) == [("a", 0, 4, True), ("b", 0, 4, True)]
    assert (a.block_table, b.block_table) == ([0], [1])
    out = sched.schedule()  # a's 5th token needs a block; only b's can be had
    assert [(s.seq.req_id, s.start, s.num_new_tokens) for s in out.scheduled] == [("a", 4, 1)]
    assert out.preempted == [b]
    assert a.block_table == [0, 1]
    assert b.status is SequenceStatus.WAITING
    assert (b.num_computed_tokens, b.block_table, b.num_registered_blocks) == (0, [], 0)
    assert b.token_ids == list(range(10, 14)) + [NEXT]  # its sampled token is kept, to be recomputed
    assert sched.running == [a] and list(sched.waiting) == [b]
    assert sched.num_preemptions == 1
    assert b.block_hashes == [hash_block(NONE_HASH, range(10, 14))]
    assert sched.block_manager.drain_events().removed == b.block_hashes  # a reused b's block 1


def test_preempted_sequence_goes_back_to_the_front_of_waiting():
    sched = make_sched(num_blocks=2)
    a, b = make_seq("a", range(4), max_tokens=2), make_seq("b", range(10, 14))
    sched.add(a)
    sched.add(b)
    step(sched)
    c = make_seq("c", [77])
    sched.add(c)
    assert list(sched.waiting) == [c]
    assert step(sched) == [("a", 4, 1, True)]  # b preempted; nothing admitted this step
    assert list(sched.waiting) == [b, c]
    assert a.is_finished
    # b comes back first and recomputes prompt and sampled token; it is not a new prefix query
    assert step(sched) == [("b", 0, 5, True)]
    assert b.block_table == [1, 0]  # a's tail block (front) then its hashed block
    assert (sched.prefix_queries, sched.prefix_hits) == (8, 0)
    assert list(sched.waiting) == [c]


def test_no_admission_in_a_step_that_preempted():
    sched = make_sched(num_blocks=3, max_num_batched_tokens=2, caching=False)
    a, b = make_seq("a", range(5)), make_seq("b", range(10, 19))
    admitted(sched, a, b)  # a: [0] for 4 tokens, b: [1, 2] for 8 tokens; nothing free
    out = sched.schedule()
    # a needs a block: b goes; its freed blocks would fit a 1-token chunk of b, but b must wait a step
    assert [(s.seq.req_id, s.num_new_tokens) for s in out.scheduled] == [("a", 1)]
    assert out.preempted == [b]
    assert a.block_table == [0, 1]
    assert list(sched.block_manager.free_queue) == [2]
    assert list(sched.waiting) == [b] and sched.running == [a]


def test_preempting_several_keeps_their_admission_order_in_waiting():
    sched = make_sched(num_blocks=4, max_num_batched_tokens=16, caching=False)
    a = make_seq("a", range(12))
    assert sched.block_manager.allocate_slots(a, 4)  # a prefilled a first chunk; its next needs 2 blocks
    a.num_computed_tokens, a.status, a.was_admitted = 4, SequenceStatus.RUNNING, True
    sched.running.append(a)
    b, c = make_seq("b", [20, 21]), make_seq("c", [30, 31])
    admitted(sched, b, c)  # b: [1], c: [2]
    d = make_seq("d", [40, 41])
    admitted(sched, d)  # d: [3]
    out = sched.schedule()
    assert out.preempted == [d, c]
    assert [(s.seq.req_id, s.start, s.num_new_tokens) for s in out.scheduled] == [("a", 4, 8), ("b", 1, 1)]
    assert a.block_table == [0, 2, 3]  # c's block was freed last, so it sits in front
    assert list(sched.waiting) == [c, d]
    assert sched.num_preemptions == 2


def test_a_sequence_that_cannot_fit_alone_preempts_itself():
    sched = make_sched(num_blocks=2)
    held = make_seq("held", range(3), max_tokens=2, hold_kv=True)
    sched.add(held)
    assert step(sched) == [("held", 0, 3, True)]
    assert held.status is SequenceStatus.HELD and held.block_table == [0]
    a = make_seq("a", range(10, 14))
    sched.add(a)
    assert step(sched) == [("a", 0, 4, True)]
    out = sched.schedule()  # a's 5th token needs a block; the held one is not reclaimable
    assert out.scheduled == [] and out.preempted == [a]
    assert list(sched.waiting) == [a] and sched.running == []
    assert (a.num_computed_tokens, a.block_table) == (0, [])
    assert list(sched.block_manager.free_queue) == [1]
    assert held.block_table == [0] and sched.block_manager.blocks[0].ref_count == 1


# -- finish ----------------------------------------------------------------------------------
def test_a_prefilled_hold_kv_sequence_keeps_its_blocks():
    sched = make_sched(num_blocks=4)
    a = make_seq("a", range(5), max_tokens=8, hold_kv=True)
    sched.add(a)
    assert step(sched) == [("a", 0, 5, True)]
    assert a.finish_reason is FinishReason.PREFILLED and a.num_output_tokens == 1
    assert a.status is SequenceStatus.HELD and sched.num_held == 1
    assert a.block_table == [0, 1]
    assert [b.ref_count for b in sched.block_manager.blocks] == [1, 1, 0, 0]
    assert list(sched.block_manager.free_queue) == [2, 3]
    assert sched.running == [] and not sched.has_work


def test_a_hold_kv_sequence_whose_first_token_ends_it_holds_nothing():
    sched = make_sched(num_blocks=4)
    a = make_seq("a", range(5), max_tokens=1, hold_kv=True)
    sched.add(a)
    step(sched)
    assert a.finish_reason is FinishReason.LENGTH and a.status is SequenceStatus.FINISHED
    assert a.block_table == [] and sched.num_held == 0


def test_an_aborted_hold_kv_sequence_frees_its_blocks():
    sched = make_sched(num_blocks=4)
    a = make_seq("a", range(5), hold_kv=True)
    sched.add(a)
    step(sched)
    a.finish_reason = FinishReason.ABORT
    sched.finish(a)
    assert a.status is SequenceStatus.FINISHED
    assert a.block_table == []
    assert list(sched.block_manager.free_queue) == [1, 2, 3, 0]
    assert sched.running == []


def test_finish_of_a_waiting_sequence_takes_it_out_of_the_queue():
    sched = make_sched()
    a, b = make_seq("a", [1]), make_seq("b", [2])
    sched.add(a)
    sched.add(b)
    a.finish_reason = FinishReason.ABORT
    sched.finish(a)
    assert list(sched.waiting) == [b] and a.status is SequenceStatus.FINISHED
    assert step(sched) == [("b", 0, 1, True)]
