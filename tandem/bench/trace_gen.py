"""Synthetic request traces from a seed: a diurnal load with bursts, a constant load, and llm-d's precise-prefix
benchmark shape (tenants sharing long contexts). Rows in the Mooncake schema (ms timestamps, 512-token hash ids),
so `tandem sim` reads them like the public traces. Pure: rows out, no I/O (writing is `write_jsonl`'s)."""

import itertools
import json
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from engines.base.block_hash import num_blocks_for
from tandem.bench.traces import MOONCAKE_BLOCK_SIZE, TraceRow


@dataclass(frozen=True, slots=True)
class Lengths:
    """Lognormal prompt and answer lengths around their medians, clipped to [min, max]."""

    isl_median: float = 2000.0
    isl_sigma: float = 0.8
    osl_median: float = 250.0
    osl_sigma: float = 0.6
    max_isl: int = 16000
    max_osl: int = 2000

    def draw(self, rng: random.Random) -> tuple[int, int]:
        isl = min(self.max_isl, max(16, round(rng.lognormvariate(math.log(self.isl_median), self.isl_sigma))))
        osl = min(self.max_osl, max(2, round(rng.lognormvariate(math.log(self.osl_median), self.osl_sigma))))
        return isl, osl


class _Ids:
    """Fresh hash ids: no two requests share a block unless a generator says so."""

    def __init__(self, start: int = 1):
        self.next = start

    def take(self, num: int) -> tuple[int, ...]:
        ids = tuple(range(self.next, self.next + num))
        self.next += num
        return ids


def _blocks(num_tokens: int) -> int:
    return num_blocks_for(num_tokens, MOONCAKE_BLOCK_SIZE)


def poisson_arrivals(rate_at, max_rate: float, seconds: float, rng: random.Random) -> Iterator[float]:
    """Arrival times of a Poisson process whose rate at t is `rate_at(t)` <= `max_rate` (by thinning)."""
    t = 0.0
    while True:
        t += rng.expovariate(max_rate)
        if t >= seconds:
            return
        if rng.random() * max_rate < rate_at(t):
            yield t


def day_rate(t: float, mean_rate: float, amplitude: float, period_s: float) -> float:
    """The diurnal trace's base rate at `t`, bursts aside: a sine from its trough (1 - amplitude) x mean at 0."""
    return mean_rate * (1.0 - amplitude * math.cos(2.0 * math.pi * t / period_s))


def diurnal_bursty(
    seed: int,
    seconds: float = 3600.0,
    mean_rate: float = 6.0,
    amplitude: float = 0.6,
    period_s: float = 1800.0,
    bursts_per_hour: float = 6.0,
    burst_factor: float = 2.5,
    burst_s: float = 60.0,
    lengths: Lengths = Lengths(),
) -> list[TraceRow]:
    """A day-shaped load (a sine from its trough, `period_s` long) with bursts of `burst_factor` x the rate
    lasting `burst_s`, at Poisson times; lognormal lengths; every prompt its own blocks."""
    rng = random.Random(seed)
    num_bursts = round(bursts_per_hour * seconds / 3600.0)
    bursts = sorted(rng.uniform(0.0, seconds - burst_s) for _ in range(num_bursts))

    def rate_at(t: float) -> float:
        day = day_rate(t, mean_rate, amplitude, period_s)
        return day * (burst_factor if any(b <= t < b + burst_s for b in bursts) else 1.0)

    peak = mean_rate * (1.0 + amplitude) * burst_factor
    return _rows(poisson_arrivals(rate_at, peak, seconds, rng), rng, lengths)


def constant_load(
    seed: int, seconds: float = 1800.0, rate: float = 6.0, lengths: Lengths = Lengths()
) -> list[TraceRow]:
    """Poisson arrivals at one rate: the load never changes, only its noise does."""
    rng = random.Random(seed)
    return _rows(poisson_arrivals(lambda t: rate, rate, seconds, rng), rng, lengths)


def _rows(arrivals: Iterator[float], rng: random.Random, lengths: Lengths) -> list[TraceRow]:
    ids, rows = _Ids(), []
    for t in arrivals:
        isl, osl = lengths.draw(rng)
        rows.append(TraceRow(round(t, 3), isl, osl, ids.take(_blocks(isl))))
    return rows


# llm-d's published load (inference-perf's poisson stages, (QPS, seconds)): a warm-up that seats the residents
# (15 QPS x 50 s = one request per (tenant, user) on average), then the ladder 3 -> 60 QPS
LLMD_WARMUP = ((15.0, 50.0),)
LLMD_LADDER = (
    (3.0, 20.0),
    (10.0, 20.0),
    (15.0, 20.0),
    (20.0, 38.0),
    (22.0, 34.0),
    (25.0, 30.0),
    (30.0, 25.0),
    (35.0, 21.0),
    (40.0, 38.0),
    (43.0, 36.0),
    (46.0, 33.0),
    (49.0, 30.0),
    (52.0, 29.0),
    (55.0, 27.0),
    (57.0, 26.0),
    (60.0, 25.0),
)
# NOTE: mean output per request, derived: llm-d's precise run kept up with its arrivals (TTFT p90 0.54 s, queue ~0),
# so its completions track its arrivals and output tok/s / requests/s is the mean output: 8,730 / 35.562 = 245.5
LLMD_OUTPUT_TOKENS = 245


@dataclass(frozen=True, slots=True)
class PrefixShape:
    """llm-d's precise-prefix benchmark (inference-perf's shared-prefix data): tenants each with one shared
    context, and users each with one question of their own that they send again and again."""

    num_tenants: int = 150
    users_per_tenant: int = 5
    context_tokens: int = 6144  # published 6,000; 12 whole 512-token blocks, so the whole context is shareable
    query_tokens: int = 1200
    output_tokens: int = LLMD_OUTPUT_TOKENS
    stages: tuple[tuple[float, float], ...] = LLMD_WARMUP + LLMD_LADDER  # (QPS, seconds), back to back
    num_warmup_stages: int = len(LLMD_WARMUP)

    @classmethod
    def uniform(cls, qps: tuple[float, ...], stage_s: float, **kwargs) -> "PrefixShape":
        """Stages of one length each, no warm-up."""
        return cls(stages=tuple((q, stage_s) for q in qps), num_warmup_stages=0, **kwargs)

    @property
    def qps(self) -> tuple[float, ...]:
        return tuple(q for q, _ in self.stages)

    def stage_starts(self) -> list[float]:
        """Each stage's start time (s), and the trace's end last."""
        return list(itertools.accumulate((s for _, s in self.stages), initial=0.0))

    def resident_tokens(self) -> int:
        """KV the shape's distinct prompts need held at once: each tenant's context plus its users' questions."""
        return self.num_tenants * (self.context_tokens + self.users_per_tenant * self.query_tokens)


def precise_prefix(seed: int, shape: PrefixShape = PrefixShape()) -> list[TraceRow]:
    """Poisson arrivals at each stage's QPS in turn; each request one (tenant, user) drawn uniformly: the tenant's
    context, then that user's own question (the same text each time, as inference-perf's shared-prefix data sends
    it). Hash ids 1.. are the contexts' blocks; the questions' blocks follow."""
    rng = random.Random(seed)
    ctx_blocks, q_blocks = _blocks(shape.context_tokens), _blocks(shape.context_tokens + shape.query_tokens)
    contexts = [tuple(range(1 + k * ctx_blocks, 1 + (k + 1) * ctx_blocks)) for k in range(shape.num_tenants)]
    ids = _Ids(1 + shape.num_tenants * ctx_blocks)
    prompts = [[ctx + ids.take(q_blocks - ctx_blocks) for _ in range(shape.users_per_tenant)] for ctx in contexts]
    rows = []
    isl = shape.context_tokens + shape.query_tokens
    for (qps, seconds), start in zip(shape.stages, shape.stage_starts()):
        for t in poisson_arrivals(lambda _, q=qps: q, qps, seconds, rng):
            prompt = prompts[rng.randrange(shape.num_tenants)][rng.randrange(shape.users_per_tenant)]
            rows.append(TraceRow(round(start + t, 3), isl, shape.output_tokens, prompt))
    return rows


def write_jsonl(rows: list[TraceRow], path: Path) -> None:
    """The rows as a Mooncake-schema JSONL file (ms timestamps)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for r in rows:
            f.write(
                json.dumps(
                    {
                        "timestamp": round(r.arrival_s * 1000),
                        "input_length": r.isl,
                        "output_length": r.osl,
                        "hash_ids": list(r.hash_ids),
                    }
                )
                + "\n"
            )
