"""The multi-turn chat workload of `tandem bench serve --workload multiturn` (the shape of LMCache's multi-round
QA): every user opens with a shared system part and a part of their own; each later round resends the whole
history with the model's real answer and a short new question. Reports TTFT by round, and the answers (so that
two runs can be checked for identical greedy outputs).

Knows no transport: a `Send` turns a spec into a RequestRecord; the prompt for a spec comes from `prompt(spec)`.
"""

import asyncio
import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tandem.bench.loadgen import RequestSpec, Send
from tandem.bench.serve_stats import RequestRecord
from tandem.bench.stats import percentile

QUESTION_TOKENS = 32  # each later round's new question ("a short new question")


@dataclass(frozen=True, slots=True)
class Multiturn:
    users: int
    rounds: int
    system_tokens: int
    user_tokens: int
    answer_tokens: int
    qps: float | None = None  # requests started per second at most; None: as soon as allowed
    round_barrier: bool = False  # round r+1 starts only when every user's round r has finished

    def __post_init__(self) -> None:
        if min(self.users, self.rounds, self.user_tokens, self.answer_tokens) < 1 or self.system_tokens < 0:
            raise ValueError(
                "--users, --rounds, --user-tokens and --answer-tokens must be >= 1 and --system-tokens >= 0"
            )
        if self.qps is not None and self.qps <= 0:
            raise ValueError(f"--qps must be > 0, got {self.qps}")

    def describe(self) -> str:
        return (
            f"multiturn: {self.users} users x {self.rounds} rounds, system {self.system_tokens} + user "
            f"{self.user_tokens} tokens, answers {self.answer_tokens}, questions {QUESTION_TOKENS}"
            + (f", {self.qps:g} req/s" if self.qps else "")
            + (", round barrier" if self.round_barrier else "")
        )


class Conversations:
    """Each user's history as token ids. `prompt(spec)` is what the client sends for spec (user, round);
    `answer(spec, text)` appends the model's answer and the next question. Deterministic given the seed, the
    allowed ids and the answers."""

    def __init__(
        self, mt: Multiturn, allowed_ids: np.ndarray, seed: int = 0, tokenize: Callable[[str], list[int]] | None = None
    ):
        self.mt, self.allowed, self.seed, self.tokenize = mt, allowed_ids, seed, tokenize
        system = self._pick([2], mt.system_tokens)
        self.history = [system + self._pick([3, u], mt.user_tokens) for u in range(mt.users)]
        self.answers: list[list[str]] = [[] for _ in range(mt.users)]

    def spec(self, user: int, rnd: int, arrival_s: float | None = None) -> RequestSpec:
        """`rnd` counts from 0; the spec's index encodes (user, round)."""
        return RequestSpec(rnd * self.mt.users + user, arrival_s, len(self.history[user]), self.mt.answer_tokens)

    def where(self, spec: RequestSpec) -> tuple[int, int]:
        return spec.index % self.mt.users, spec.index // self.mt.users

    def prompt(self, spec: RequestSpec) -> list[int]:
        return list(self.history[self.where(spec)[0]])

    def answer(self, spec: RequestSpec, text: str) -> None:
        user, rnd = self.where(spec)
        self.answers[user].append(text)
        ids = (
            self.tokenize(text)
            if self.tokenize is not None and text
            else self._pick([5, user, rnd], self.mt.answer_tokens)
        )
        self.history[user] += ids + self._pick([4, user, rnd], QUESTION_TOKENS)

    def _pick(self, key: list[int], n: int) -> list[int]:
        rng = np.random.default_rng([self.seed, *key])
        return self.allowed[rng.integers(0, self.allowed.size, n)].tolist()


def tokenizer_encode(model_dir: Path) -> Callable[[str], list[int]]:
    """The model's tokenizer as text -> ids without special tokens (an answer is sent back as the model's text)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
    return lambda text: tok.encode(text, add_special_tokens=False).ids


async def run_conversations(conv: Conversations, send: Send) -> list[tuple[int, RequestRecord]]:
    """Every user's rounds; returns (round, record) pairs, round counted from 1."""
    mt, pacer = conv.mt, _Pacer(conv.mt.qps)
    out: list[tuple[int, RequestRecord]] = []

    async def one(user: int, rnd: int) -> None:
        await pacer.wait()
        spec = conv.spec(user, rnd)
        record = await send(spec)
        conv.answer(spec, record.text)
        out.append((rnd + 1, record))

    if mt.round_barrier:
        for rnd in range(mt.rounds):
            await asyncio.gather(*(one(u, rnd) for u in range(mt.users)))
    else:

        async def user_chain(user: int) -> None:
            for rnd in range(mt.rounds):
                await one(user, rnd)

        await asyncio.gather(*(user_chain(u) for u in range(mt.users)))
    return out


class _Pacer:
    """Start slots 1/qps apart, handed out in call order (no limit without a rate)."""

    def __init__(self, qps: float | None):
        self.gap, self.next_s = (1.0 / qps if qps else 0.0), None

    async def wait(self) -> None:
        if not self.gap:
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        start = now if self.next_s is None else max(now, self.next_s)
        self.next_s = start + self.gap
        if start > now:
            await asyncio.sleep(start - now)


def rounds_summary(pairs: list[tuple[int, RequestRecord]], num_rounds: int) -> list[dict]:
    """TTFT by round over the requests that completed: `[{"round", "ttft_mean_s", "ttft_p50_s",
    "num_requests"}, ...]` (num_requests counts those sent)."""
    rows = []
    for rnd in range(1, num_rounds + 1):
        records = [r for k, r in pairs if k == rnd]
        ttfts = [r.ttft_s for r in records if r.is_ok]
        rows.append(
            {
                "round": rnd,
                "ttft_mean_s": sum(ttfts) / len(ttfts) if ttfts else float("nan"),
                "ttft_p50_s": percentile(ttfts, 50),
                "num_requests": len(records),
            }
        )
    return rows


def answers_digest(conv: Conversations) -> str:
    """One hash over every answer in (user, round) order: equal digests, identical outputs."""
    h = hashlib.sha256()
    for user_answers in conv.answers:
        for text in user_answers:
            h.update(text.encode() + b"\x00")
    return h.hexdigest()
