"""Synthetic request traces from a seed: a diurnal load with bursts, a constant load, and llm-d's precise-prefix
benchmark shape (tenants sharing long contexts). Rows in the Mooncake schema (ms timestamps, 512-token hash ids),
so `tandem sim` reads them like the public traces. Pure: rows out, no I/O (writing is `write_jsonl`'s)."""
import json
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

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
    return -(-num_tokens // MOONCAKE_BLOCK_SIZE)


def poisson_arrivals(rate_at, max_rate: float, seconds: float, rng: random.Random) -> Iterator[float]:
    """Arrival times of a Poisson process whose rate at t is `rate_at(t)` <= `max_rate` (by thinning)."""
    t = 0.0
    while True:
        t += rng.expovariate(max_rate)
        if t >= seconds:
            return
        if rng.random() * max_rate < rate_at(t):
            yield t


def diurnal_bursty(seed: int, seconds: float = 3600.0, mean_rate: float = 6.0, amplitude: float = 0.6,
                   period_s: float = 1800.0, bursts_per_hour: float = 6.0, burst_factor: float = 2.5,
                   burst_s: float = 60.0, lengths: Lengths = Lengths()) -> list[TraceRow]:
    """A day-shaped load (a sine from its trough, `period_s` long) with bursts of `burst_factor` x the rate
    lasting `burst_s`, at Poisson times; lognormal lengths; every prompt its own blocks."""
    rng = random.Random(seed)
    num_bursts = round(bursts_per_hour * seconds / 3600.0)
    bursts = sorted(rng.uniform(0.0, seconds - burst_s) for _ in range(num_bursts))

    def rate_at(t: float) -> float:
        day = mean_rate * (1.0 - amplitude * math.cos(2.0 * math.pi * t / period_s))
        return day * (burst_factor if any(b <= t < b + burst_s for b in bursts) else 1.0)

    peak = mean_rate * (1.0 + amplitude) * burst_factor
    return _rows(poisson_arrivals(rate_at, peak, seconds, rng), rng, lengths)


def constant_load(seed: int, seconds: float = 1800.0, rate: float = 6.0,
                  lengths: Lengths = Lengths()) -> list[TraceRow]:
    """Poisson arrivals at one rate: the load never changes, only its noise does."""
    rng = random.Random(seed)
    return _rows(poisson_arrivals(lambda t: rate, rate, seconds, rng), rng, lengths)


def _rows(arrivals: Iterator[float], rng: random.Random, lengths: Lengths) -> list[TraceRow]:
    ids, rows = _Ids(), []
    for t in arrivals:
        isl, osl = lengths.draw(rng)
        rows.append(TraceRow(round(t, 3), isl, osl, ids.take(_blocks(isl))))
    return rows


@dataclass(frozen=True, slots=True)
class PrefixShape:
    """llm-d's precise-prefix benchmark: tenants each with one shared context, users each sending new queries."""

    num_tenants: int = 150
    users_per_tenant: int = 5
    context_tokens: int = 6144  # "6k": 12 whole 512-token blocks, so the whole context is shareable
    query_tokens: int = 1200
    output_tokens: int = 512  # NOTE: not in llm-d's published shape; our choice, stated with every result
    qps: tuple[float, ...] = (3.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0)
    stage_s: float = 60.0  # each QPS stage lasts this long, back to back

    def context_demand_tokens(self) -> int:
        """KV the shared contexts need held at once across the cluster."""
        return self.num_tenants * self.context_tokens


def precise_prefix(seed: int, shape: PrefixShape = PrefixShape()) -> list[TraceRow]:
    """Poisson arrivals at each QPS stage in turn; each request a random tenant's context plus a new query (which
    of the tenant's users sent it changes no block: every query is new text). Hash ids 1.. are the contexts'
    blocks; queries take fresh ids above them."""
    rng = random.Random(seed)
    ctx_blocks = _blocks(shape.context_tokens)
    contexts = [tuple(range(1 + k * ctx_blocks, 1 + (k + 1) * ctx_blocks)) for k in range(shape.num_tenants)]
    ids = _Ids(1 + shape.num_tenants * ctx_blocks)
    rows, start = [], 0.0
    isl = shape.context_tokens + shape.query_tokens
    for qps in shape.qps:
        for t in poisson_arrivals(lambda _: qps, qps, shape.stage_s, rng):
            tenant = rng.randrange(shape.num_tenants)
            query = ids.take(_blocks(isl) - ctx_blocks)
            rows.append(TraceRow(round(start + t, 3), isl, shape.output_tokens, contexts[tenant] + query))
        start += shape.stage_s
    return rows


def write_jsonl(rows: list[TraceRow], path: Path) -> None:
    """The rows as a Mooncake-schema JSONL file (ms timestamps)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps({"timestamp": round(r.arrival_s * 1000), "input_length": r.isl,
                                "output_length": r.osl, "hash_ids": list(r.hash_ids)}) + "\n")
