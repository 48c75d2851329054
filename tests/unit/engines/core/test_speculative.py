"""Speculative decoding's pure half: n-gram prompt lookup, the adaptive draft length, and the scheduler's
proposals and their commit — accepted tokens only, rejected positions' blocks given back, nothing rejected cached."""

import pytest

from engines.base.engine_configs import BatchConfig
from engines.base.structured import StructuredSpec
from engines.base.types import FinishReason, SamplingParams
from engines.core.block_manager import BlockManager
from engines.core.scheduler import Scheduler, SchedulerConfig
from engines.core.sequence import Sequence, SequenceStatus
from engines.core.speculative import NgramProposer, SpecConfig, SpecState, Speculator, best_draft_len, parse_speculative

BS = 4
NGRAM = SpecConfig("ngram", max_draft_tokens=4, draft_cost=0.0)


# -- the proposer ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("tokens", "k", "expected"),
    [
        ([1, 2, 3, 4, 1, 2], 3, [3, 4, 1]),  # the trigram misses, the bigram (1, 2) hits
        ([1, 2, 3, 9, 2, 3, 7, 2, 3], 2, [7, 2]),  # the latest occurrence wins
        ([5, 6, 7, 8], 4, []),  # nothing repeats
        ([5, 6, 7, 5], 4, [6, 7, 5]),  # a unigram, and the proposal may run into the suffix itself
        ([7], 4, []),
        ([1, 2, 3, 1, 2], 1, [3]),
    ],
)
def test_ngram_proposes_what_followed_the_latest_match(tokens, k, expected):
    assert NgramProposer(1, 3).propose("r", tokens, k) == expected


def test_ngram_prefers_the_longest_suffix():
    tokens = [4, 2, 8, 1, 2, 9, 1, 2]
    assert NgramProposer(1, 3).propose("r", tokens + [8, 1, 2], 2) == [9, 1]  # trigram (8, 1, 2); the bigram says 8, 1
    assert NgramProposer(3, 3).propose("r", [1, 2, 3, 4], 2) == []  # min 3: no trigram repeats


# -- the adaptive draft length -----------------------------------------------------------------
def test_best_draft_len_follows_the_acceptance_rate_and_the_cost():
    assert best_draft_len(0.9, 4, 0.1) == 4
    assert best_draft_len(0.05, 4, 0.1) == 0  # 1 + 0.05 < 1.1: a proposal does not pay for its cost
    assert best_draft_len(0.5, 8, 0.1) < 8  # the tail adds less than it costs
    assert best_draft_len(0.0, 4, 0.0) == 0  # a tie is no gain


def test_a_request_whose_proposals_fail_rests_then_tries_again():
    spec = Speculator(SpecConfig("ngram", max_draft_tokens=4, draft_cost=0.2, cooldown_steps=3))
    state = SpecState()
    assert spec.draft_len(state, 4) > 0
    for _ in range(5):
        state.record(4, 0)
    assert spec.draft_len(state, 4) == 0  # off, and resting
    assert [spec.draft_len(state, 4) for _ in range(3)] == [0, 0, 0]
    assert spec.draft_len(state, 4) > 0  # a fresh prior after the rest


def test_rests_in_a_row_grow_and_a_request_that_copies_again_starts_short():
    spec = Speculator(SpecConfig("ngram", max_draft_tokens=4, draft_cost=0.2, cooldown_steps=3))
    state = SpecState()

    def fail_until_rest() -> int:
        while spec.draft_len(state, 4) > 0:
            state.record(4, 0)
        steps = 1
        while spec.draft_len(state, 4) == 0:
            steps += 1
        return steps  # decode steps without proposals, the one that decided included

    assert [fail_until_rest() for _ in range(6)] == [4, 7, 13, 25, 49, 49]  # 3, 6, 12, 24, 48 (16x at most)
    state.record(4, 4)  # it copies: the rate beats the prior
    assert fail_until_rest() == 4


def test_a_fresh_request_probes_once_even_where_the_prior_does_not_pay():
    spec = Speculator(SpecConfig("draft", max_draft_tokens=4, draft_cost=0.6, cooldown_steps=3), proposer=object())
    failing, agreeing = SpecState(), SpecState()
    assert spec.draft_len(failing, 4) == spec.draft_len(agreeing, 4) == 1  # at cost 0.6 the prior 0.5 pays no k
    failing.record(1, 0)
    agreeing.record(1, 1)
    assert spec.draft_len(failing, 4) == 0 and failing.cooldown == 3
    assert spec.draft_len(agreeing, 4) == 1  # measured at 0.69: it pays
    assert [spec.draft_len(failing, 4) for _ in range(4)] == [0] * 4  # rested; the prior alone pays nothing
    assert failing.cooldown == 6  # so it rests again, longer, without a second probe


def test_a_sampled_request_weighs_its_own_costs():
    spec = Speculator(SpecConfig("ngram", max_draft_tokens=4, verify_costs=(0.1,) * 4, verify_costs_sampled=(1.2,) * 4))
    greedy, sampled = SpecState(is_fresh=False), SpecState(is_fresh=False)
    assert spec.draft_len(greedy, 4, is_greedy=True) > 0
    assert spec.draft_len(sampled, 4, is_greedy=False) == 0 and sampled.cooldown > 0


def test_spec_config_is_validated():
    with pytest.raises(ValueError, match="speculative method"):
        SpecConfig("eagle")
    assert parse_speculative("draft:/m/small") == ("draft", "/m/small")
    assert parse_speculative("ngram") == ("ngram", "") and parse_speculative("") == ("", "")
    for bad in ("draft", "ngram:3", "medusa:x"):
        with pytest.raises(ValueError):
            parse_speculative(bad)
    with pytest.raises(ValueError):
        SpecConfig("ngram", ngram_min=3, ngram_max=2)


# -- in the scheduler -------------------------------------------------------------------------
def make(num_blocks=16, budget=64, spec=NGRAM, max_num_seqs=8) -> Scheduler:
    return Scheduler(SchedulerConfig(BatchConfig(max_num_seqs, budget), spec), BlockManager(num_blocks, BS))


def decoding(sched: Scheduler, tokens, max_tokens=32, **params) -> Sequence:
    seq = Sequence("r", list(tokens), len(tokens) - 1, SamplingParams(max_tokens=max_tokens, ignore_eos=True, **params))
    assert sched.block_manager.allocate_slots(seq, seq.num_tokens - 1)
    seq.num_computed_tokens = seq.num_tokens - 1
    seq.status, seq.was_admitted = SequenceStatus.RUNNING, True
    sched.running.append(seq)
    return seq


def test_a_decoding_sequence_verifies_its_proposals_in_one_span():
    sched = make()
    seq = decoding(sched, [1, 2, 3, 4, 5, 1, 2])  # proposes 3, 4, 5, 1
    out = sched.schedule()
    (s,) = out.scheduled
    assert (s.start, s.num_new_tokens, s.spec_token_ids, s.samples) == (6, 5, (3, 4, 5, 1), True)
    assert s.input_ids() == [2, 3, 4, 5, 1]
    assert out.num_tokens == 5  # the budget counts proposed tokens
    assert len(seq.block_table) == 3  # room for positions 6..10


def test_commit_keeps_the_accepted_tokens_and_gives_back_the_rest():
    sched = make()
    seq = decoding(sched, [1, 2, 3, 4, 5, 1, 2])
    out = sched.schedule()
    sched.update_from_output(out, [[(3, None), (4, None), (9, None)]])  # 3, 4 accepted, 9 instead of 5
    assert seq.token_ids == [1, 2, 3, 4, 5, 1, 2, 3, 4, 9]
    assert seq.num_computed_tokens == 9  # the KV of 2, 3, 4 is good; 9 is computed next step
    assert len(seq.block_table) == 3  # 10 tokens
    assert (sched.speculator.num_proposed, sched.speculator.num_accepted) == (4, 2)
    assert sched.num_generated_tokens == 3


def test_rejected_proposals_never_reach_the_prefix_cache_or_its_events():
    sched = make()
    seq = decoding(sched, [1, 2, 3, 1, 2])  # block 0 = (1, 2, 3, 1); proposes 3, 1, 2
    sched.block_manager.drain_events()
    out = sched.schedule()
    assert out.scheduled[0].spec_token_ids == (3, 1, 2)
    sched.update_from_output(out, [(7, None)])  # nothing accepted: one plain token
    stored = [tokens for _, _, tokens in sched.block_manager.drain_events().stored]
    assert stored == []  # block 1 would be (2, 3, 1, 2) had the proposals counted
    assert seq.token_ids == [1, 2, 3, 1, 2, 7] and len(seq.block_table) == 2
    for _ in range(3):  # fill block 1 with real tokens: (2, 7, 8, 8)
        out = sched.schedule()
        sched.update_from_output(out, [(8, None)] * len(out.sampling))
    cached = {b.token_ids for b in sched.block_manager.blocks if b.block_hash is not None}
    assert cached == {(1, 2, 3, 1), (2, 7, 8, 8)}


def test_accepted_tokens_stop_at_max_tokens_and_at_a_stop_token():
    sched = make()
    seq = decoding(sched, [1, 2, 3, 4, 1, 2], max_tokens=3)  # 1 out already: room for 2 → 1 proposal
    out = sched.schedule()
    assert out.scheduled[0].spec_token_ids == (3,)
    sched = make()
    seq = decoding(sched, [1, 2, 3, 4, 1, 2], stop_token_ids=(4,))
    sched.update_from_output(sched.schedule(), [[(3, None), (4, None), (1, None)]])
    assert seq.token_ids[-2:] == [3, 4] and seq.finish_reason is FinishReason.STOP
    assert seq.status is SequenceStatus.FINISHED and not seq.block_table


def test_what_does_not_speculate():
    for kw in ({"spec": SpecConfig()}, {"budget": 1}):
        sched = make(**kw)
        decoding(sched, [1, 2, 3, 1, 2])
        assert sched.schedule().scheduled[0].spec_token_ids == ()
    sched = make()  # NOTE: structured outputs: the grammar's mask is per token, so they decode plainly
    decoding(sched, [1, 2, 3, 1, 2], structured=StructuredSpec("json_object"))
    assert sched.schedule().scheduled[0].spec_token_ids == ()
    sched = make(spec=SpecConfig("ngram", max_num_seqs=1, draft_cost=0.0))  # the batch is too large
    decoding(sched, [1, 2, 3, 1, 2])
    decoding(sched, [1, 2, 3, 1, 2]).req_id = "r2"
    assert all(not s.spec_token_ids for s in sched.schedule().scheduled)


def test_without_blocks_for_its_proposals_a_sequence_decodes_plainly():
    sched = make(num_blocks=2)
    seq = decoding(sched, [1, 2, 3, 4, 5, 1, 2])  # 2 blocks hold 8 tokens: no room for 4 proposals
    (s,) = sched.schedule().scheduled
    assert (s.num_new_tokens, s.spec_token_ids) == (1, ()) and seq.status is SequenceStatus.RUNNING
