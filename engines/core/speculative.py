"""Speculative decoding's scheduler half: the proposer interface and n-gram prompt lookup, the per-request adaptive
draft length, and the counters. Pure: no torch, no I/O — the runner verifies what is proposed here (a draft model
proposer, engines/native/draft.py, plugs in through `Proposer`)."""

from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import Protocol

METHODS = ("", "ngram", "draft")  # "": off; "draft": a small model with the target's tokenizer


@dataclass(frozen=True, slots=True)
class SpecConfig:
    method: str = ""
    max_draft_tokens: int = 4  # k, the most tokens proposed for one request in one step
    ngram_min: int = 1  # shortest suffix matched against the context
    ngram_max: int = 3  # longest suffix, tried first
    # NOTE: what verifying one proposed token costs, as a fraction of a plain decode step; the adaptive rule
    # proposes only while the tokens it expects to gain outweigh it (CPU, small models: verification is cheap)
    draft_cost: float = 0.1
    # what verifying k proposed tokens costs (index k - 1), measured by the runner at start (engines/native/
    # spec_costs.py) for a greedy request and for a sampled one (each verified row is sampled too); on a CPU it is
    # far from linear. (): draft_cost * k
    verify_costs: tuple[float, ...] = ()
    verify_costs_sampled: tuple[float, ...] = ()
    propose_cost: float = 0.0  # what the proposer itself spends per proposed token (a draft model's step)
    max_num_seqs: int = 16  # above this many running requests the batch is compute-bound: nobody speculates
    cooldown_steps: int = 16  # steps a request first waits before it tries again, once speculation stopped paying

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"speculative method must be one of {METHODS}, got {self.method!r}")
        if self.max_draft_tokens < 1 or not 1 <= self.ngram_min <= self.ngram_max:
            raise ValueError("max_draft_tokens must be >= 1 and 1 <= ngram_min <= ngram_max")
        if (
            min(self.draft_cost, self.propose_cost, *self.verify_costs, *self.verify_costs_sampled) < 0
            or self.cooldown_steps < 0
        ):
            raise ValueError("draft_cost, verify_costs, propose_cost and cooldown_steps must be >= 0")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")

    def cost(self, k: int, is_greedy: bool = True) -> float:
        """What proposing and verifying k tokens adds to a plain decode step, as a fraction of it."""
        table = self.verify_costs if is_greedy else self.verify_costs_sampled or self.verify_costs
        verify = table[k - 1] if k <= len(table) else self.draft_cost * k
        return verify + self.propose_cost * k

    @property
    def is_enabled(self) -> bool:
        return bool(self.method)


def parse_speculative(value: str) -> tuple[str, str]:
    """A `--speculative` value ("", "ngram" or "draft:DIR") as (method, draft model directory)."""
    method, _, draft_dir = value.partition(":")
    if method == "draft" and not draft_dir:
        raise ValueError("speculative draft needs its model directory: draft:DIR")
    if method != "draft" and draft_dir:
        raise ValueError(f"speculative {method!r} takes no argument, got {value!r}")
    SpecConfig(method)  # NOTE: raises the one clear error for an unknown method
    return method, draft_dir


class Proposer(Protocol):
    def propose(self, req_id: str, token_ids: Seq[int], k: int) -> list[int]:
        """Up to `k` tokens likely to follow `token_ids` (request `req_id`'s prompt + output so far); [] for none."""

    def forget(self, req_id: str) -> None:
        """The request ended: drop whatever was kept for it."""


class NgramProposer:
    """Prompt lookup: find the latest earlier occurrence of the context's last n tokens (longest n first) and
    propose the tokens that followed it."""

    def __init__(self, ngram_min: int, ngram_max: int):
        self.ngram_min, self.ngram_max = ngram_min, ngram_max

    def propose(self, req_id: str, token_ids: Seq[int], k: int) -> list[int]:
        n_tokens = len(token_ids)
        for n in range(min(self.ngram_max, n_tokens - 1), self.ngram_min - 1, -1):
            start = _latest_match(token_ids, n)
            if start >= 0:
                return list(token_ids[start + n : start + n + k])
        return []

    def forget(self, req_id: str) -> None:
        pass  # NOTE: stateless: the context is the request's own tokens


def _latest_match(token_ids: Seq[int], n: int) -> int:
    """Start of the latest occurrence of the last `n` tokens that ends before them; -1 for none."""
    suffix = list(token_ids[-n:])
    last = suffix[-1]
    for end in range(len(token_ids) - 2, n - 2, -1):  # `end`: index of the occurrence's last token
        if token_ids[end] == last and list(token_ids[end - n + 1 : end + 1]) == suffix:
            return end - n + 1
    return -1


@dataclass(slots=True)
class SpecState:
    """One request's acceptance record: decayed counts of proposed and accepted tokens (with a prior of one
    half), from which the draft length is chosen."""

    proposed: float = 2.0
    accepted: float = 1.0
    cooldown: int = 0  # steps left before it speculates again
    num_rests: int = 0  # rests in a row since its acceptance last beat the prior: each doubles the next
    is_fresh: bool = True  # nothing recorded since it started: it probes once whatever the cost

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed

    def record(self, num_proposed: int, num_accepted: int, decay: float = 0.8) -> None:
        self.proposed = decay * self.proposed + num_proposed
        self.accepted = decay * self.accepted + num_accepted
        self.is_fresh = False
        if self.acceptance_rate > 0.5:  # NOTE: better than the prior: copying (again), so rests start short again
            self.num_rests = 0

    def rest(self, steps: int) -> None:
        """Stop proposing for `steps` doubled per rest in a row (at most 16x), then try with a fresh prior."""
        self.cooldown = steps << min(self.num_rests, 4)
        self.num_rests += 1
        self.proposed, self.accepted = 2.0, 1.0


def best_draft_len(rate: float, max_k: int, cost) -> int:
    """The k that maximizes expected tokens per unit of step time, (1 + a + ... + a^k) / (1 + cost(k)), for a
    per-token acceptance rate a; 0 when no k beats a plain decode step. `cost`: SpecConfig.cost, or a number
    (each proposed token costs that much)."""
    cost_of = cost if callable(cost) else (lambda k: cost * k)
    best_k, best_gain, gain = 0, 1.0, 1.0
    for k in range(1, max_k + 1):
        gain += rate**k
        speed = gain / (1.0 + cost_of(k))
        if speed > best_gain * 1.0001:  # NOTE: a tie is no gain: stay plain
            best_k, best_gain = k, speed
    return best_k


class Speculator:
    """What the scheduler asks before each decode: the tokens to verify with it. Keeps the counters."""

    def __init__(self, config: SpecConfig, proposer: Proposer | None = None):
        if proposer is None and config.method != "ngram":
            raise ValueError(f"speculative {config.method!r} needs its proposer")
        self.config = config
        self.proposer = proposer or NgramProposer(config.ngram_min, config.ngram_max)
        self.num_proposed = 0  # tokens proposed (and verified)
        self.num_accepted = 0  # of them, accepted
        self.num_verify_steps = 0  # sequence-steps that verified at least one proposed token

    def draft_len(self, state: SpecState, max_k: int, is_greedy: bool = True) -> int:
        """How many tokens to propose now (0: a plain decode step); counts down a cooldown."""
        if state.cooldown > 0:
            state.cooldown -= 1
            return 0
        k = best_draft_len(
            state.acceptance_rate, min(max_k, self.config.max_draft_tokens), lambda n: self.config.cost(n, is_greedy)
        )
        if state.is_fresh and max_k > 0:  # NOTE: a costly draft would never start from the prior: measure it once
            k = max(k, 1)
        elif k == 0 and max_k > 0:  # NOTE: it stopped paying: rest, then try once more (a text that never copies
            state.rest(self.config.cooldown_steps)  # rests longer and longer, so it costs ever less)
        return k

    def propose(
        self, req_id: str, token_ids: Seq[int], state: SpecState, max_k: int, num_running: int, is_greedy: bool = True
    ) -> tuple[int, ...]:
        if num_running > self.config.max_num_seqs or max_k < 1:
            return ()
        k = self.draft_len(state, max_k, is_greedy)
        return tuple(self.proposer.propose(req_id, token_ids, k)[:k]) if k else ()

    def record(self, state: SpecState, num_proposed: int, num_accepted: int) -> None:
        state.record(num_proposed, num_accepted)
        self.num_proposed += num_proposed
        self.num_accepted += num_accepted
        self.num_verify_steps += 1
