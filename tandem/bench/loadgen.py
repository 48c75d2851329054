"""The load a serving benchmark offers: request specs (synthetic or from a trace), their token-id prompts,
and the driver that sends them closed-loop (N in flight) or open-loop (at arrival times).

Knows no transport: a `Send` callable turns a spec into a RequestRecord (HTTP, or an engine in-process).
"""

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tandem.bench.serve_stats import RequestRecord
from tandem.bench.traces import MOONCAKE_BLOCK_SIZE, TraceRow

# without a tokenizer: ids every vocabulary we serve has as ordinary tokens (specials sit below 100)
FALLBACK_TOKEN_IDS = (100, 356)
_WARM_UP_INDEX = 1 << 40  # warm-up prompts get their own seeds: they never share a prefix with timed ones


@dataclass(frozen=True, slots=True)
class RequestSpec:
    index: int
    arrival_s: float | None  # since the run's start; None: closed loop, sent when a slot frees
    isl: int  # prompt tokens
    osl: int  # max_tokens
    hash_ids: tuple[int, ...] = ()  # Mooncake prefix blocks: equal ids, equal prompt blocks


Send = Callable[[RequestSpec], Awaitable[RequestRecord]]


def synthetic_specs(
    num_requests: int, isl: int, osl: int, request_rate: float | None = None, seed: int = 0
) -> list[RequestSpec]:
    """`num_requests` specs of fixed lengths; with a rate, Poisson arrivals (exponential gaps), else closed loop."""
    if min(num_requests, isl, osl) < 1:
        raise ValueError(f"num_requests, isl and osl must be >= 1, got {num_requests}, {isl}, {osl}")
    arrivals = poisson_arrivals(num_requests, request_rate, seed) if request_rate is not None else None
    return [RequestSpec(i, None if arrivals is None else float(arrivals[i]), isl, osl) for i in range(num_requests)]


def poisson_arrivals(num_requests: int, rate: float, seed: int = 0) -> np.ndarray:
    """Arrival times of a Poisson process at `rate` req/s, the first at 0; rate inf sends all at once."""
    if rate <= 0:
        raise ValueError(f"request rate must be > 0, got {rate}")
    if np.isinf(rate):
        return np.zeros(num_requests)
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, num_requests)
    gaps[0] = 0.0
    return np.cumsum(gaps)


def warm_up_specs(num_requests: int, isl: int, osl: int) -> list[RequestSpec]:
    """Untimed closed-loop requests whose prompts differ from every timed one."""
    return [RequestSpec(_WARM_UP_INDEX + i, None, isl, osl) for i in range(num_requests)]


def trace_specs(rows: list[TraceRow]) -> list[RequestSpec]:
    return [RequestSpec(i, r.arrival_s, r.isl, r.osl, r.hash_ids) for i, r in enumerate(rows)]


def allowed_token_ids(tokenizer_dir: Path | None) -> np.ndarray:
    """Ordinary (non-special) ids of the model's vocabulary; a small safe range without a tokenizer."""
    if tokenizer_dir is None:
        return np.arange(*FALLBACK_TOKEN_IDS)
    from tandem.bench.workload import special_token_ids, vocab_size

    excluded = special_token_ids(tokenizer_dir)
    allowed = np.array([i for i in range(vocab_size(tokenizer_dir)) if i not in excluded])
    if allowed.size == 0:
        raise ValueError(f"{tokenizer_dir}: no ordinary token ids to build prompts from")
    return allowed


class PromptMaker:
    """Deterministic prompts of exactly `isl` ids: random per request, or, for Mooncake rows, one fixed
    random block per hash id so that requests sharing a prefix hash share those prompt tokens."""

    def __init__(self, allowed_ids: np.ndarray, seed: int = 0, block_size: int = MOONCAKE_BLOCK_SIZE):
        self.allowed, self.seed, self.block_size = allowed_ids, seed, block_size

    def prompt(self, spec: RequestSpec) -> list[int]:
        if spec.hash_ids:
            blocks = [self._pick([self.seed, 1, h], self.block_size) for h in spec.hash_ids]
            ids = np.concatenate(blocks)[: spec.isl]
            if ids.size == spec.isl:
                return ids.tolist()
        return self._pick([self.seed, 0, spec.index], spec.isl).tolist()

    def _pick(self, key: list[int], n: int) -> np.ndarray:
        rng = np.random.default_rng(key)
        return self.allowed[rng.integers(0, self.allowed.size, n)]


async def run_schedule(
    specs: list[RequestSpec],
    send: Send,
    max_concurrency: int | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> list[RequestRecord]:
    """Send every spec; records come back in spec order.

    Specs without arrival times run closed-loop with `max_concurrency` in flight; with arrival times they
    are sent at `start + arrival_s`, and `max_concurrency` (if given) caps what is in flight, delaying later
    arrivals (their queueing before the send is not part of TTFT).
    """
    if max_concurrency is None and any(s.arrival_s is None for s in specs):
        raise ValueError("a closed-loop run needs max_concurrency")
    slots = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    records: list[RequestRecord | None] = [None] * len(specs)
    tasks: list[asyncio.Task] = []
    start = clock()
    for pos, spec in enumerate(specs):
        if spec.arrival_s is not None and (delay := start + spec.arrival_s - clock()) > 0:
            await asyncio.sleep(delay)
        if slots is not None:
            await slots.acquire()
        tasks.append(asyncio.create_task(_send_one(spec, send, records, pos, slots, clock)))
    await asyncio.gather(*tasks)
    return records  # type: ignore[return-value]  (every slot filled by _send_one)


async def _send_one(
    spec: RequestSpec, send: Send, records: list, pos: int, slots: asyncio.Semaphore | None, clock: Callable[[], float]
) -> None:
    try:
        records[pos] = await send(spec)
    except Exception as exc:  # NOTE: a sender bug must cost one record, never the whole run
        now = clock()
        records[pos] = RequestRecord(submit_s=now, end_s=now, error=f"{type(exc).__name__}: {exc}")
    finally:
        if slots is not None:
            slots.release()
