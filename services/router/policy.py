"""Routing policies: which decode worker takes a request, and whether a prefill worker goes first.

Pure objects with no I/O and no transport: the same ones run in the router service and the simulator.
"""

import random
import time
from collections.abc import Callable
from typing import Protocol

from services.router.array_policy import ArrayKvPolicy
from services.router.kv_policy import Clock, KvAwarePolicy, KvPolicyConfig, Rng
from services.router.prefix_index import PrefixIndex
from services.router.slot_index import SlotIndex
from services.router.types import Choice, DisaggDecision, RouteInput, WorkerView


class RoutingPolicy(Protocol):
    name: str

    # the prefix index this policy wants fed with the workers' KV events; None: it reads none (declared, so the
    # router's shell never has to find out by looking at the policy's type)
    @property
    def event_index(self) -> PrefixIndex | None: ...

    def choose(self, request: RouteInput, candidates: list[WorkerView]) -> Choice:
        """Pick one of `candidates` (non-empty, all live, none excluded), with the prefix it likely caches."""
        ...


def load_of(view: WorkerView) -> float:
    """Sequences on the worker, counting routes it has not yet reported, per sequence slot."""
    return (view.load.num_running + view.load.num_waiting + view.num_unreflected) / view.max_num_seqs


def _load_key(view: WorkerView) -> tuple[float, int, str]:
    # NOTE: a total order, so equal loads never depend on the candidates' order
    return load_of(view), view.load.num_blocks_used, view.worker_id


class RoundRobinPolicy:
    """Cycles over candidates sorted by worker_id, per model; resumes after the last worker chosen,
    so workers joining or leaving neither restart the cycle nor skip anyone."""

    name = "round_robin"
    event_index = None

    def __init__(self) -> None:
        self._last: dict[str, str] = {}  # model -> worker_id chosen last

    def choose(self, request: RouteInput, candidates: list[WorkerView]) -> Choice:
        ordered = sorted(candidates, key=lambda v: v.worker_id)
        last = self._last.get(request.model)
        chosen = next((v for v in ordered if last is None or v.worker_id > last), ordered[0])
        self._last[request.model] = chosen.worker_id
        return Choice(chosen)


class LeastLoadedPolicy:
    """The lowest `load_of`; ties go to fewer KV blocks used, then the smallest worker_id."""

    name = "least_loaded"
    event_index = None

    def choose(self, request: RouteInput, candidates: list[WorkerView]) -> Choice:
        return Choice(min(candidates, key=_load_key))


# every policy a router accepts; "kv" is built by `make_policy` with its index, clock and RNG, the others bare
POLICIES: dict[str, Callable[..., RoutingPolicy]] = {
    RoundRobinPolicy.name: RoundRobinPolicy,
    LeastLoadedPolicy.name: LeastLoadedPolicy,
    KvAwarePolicy.name: KvAwarePolicy,
}


def make_policy(
    name: str,
    kv: KvPolicyConfig = KvPolicyConfig(),
    clock: Clock = time.monotonic,
    rng: Rng | None = None,
    index_max_entries: int = 1_000_000,
) -> RoutingPolicy:
    """The policy called `name`; only "kv" uses the rest (its prefix index, clock and RNG)."""
    if name == KvAwarePolicy.name:  # NOTE: the array-scored kind: the same decisions, at a fraction of the cost
        return ArrayKvPolicy(SlotIndex(index_max_entries), clock, rng or random.Random(), kv)
    try:
        return POLICIES[name]()
    except KeyError:
        raise ValueError(f"unknown routing policy {name!r}; choose one of {', '.join(sorted(POLICIES))}") from None


class DisaggregationPolicy:
    """Conditional disaggregation: a prefill worker goes first only when the uncached prompt is long
    enough to pay for the KV transfer and the least-loaded prefill worker is not queueing."""

    def __init__(self, min_tokens: int = 512, max_waiting: int = 4):
        self.min_tokens = min_tokens
        self.max_waiting = max_waiting

    def decide(self, request: RouteInput, prefill: list[WorkerView], num_cached_tokens: int = 0) -> DisaggDecision:
        if not prefill:
            return DisaggDecision(None, "aggregated: no prefill workers")
        num_uncached = max(len(request.token_ids) - num_cached_tokens, 0)
        if num_uncached < self.min_tokens:
            return DisaggDecision(None, f"aggregated: {num_uncached} uncached tokens < {self.min_tokens}")
        best = min(prefill, key=_load_key)
        num_waiting = best.load.num_waiting + best.num_unreflected  # routes it has not reported yet queue too
        if num_waiting >= self.max_waiting:
            return DisaggDecision(
                None,
                f"aggregated: prefill pool saturated ({best.worker_id} has "
                f"{num_waiting} waiting >= {self.max_waiting})",
            )
        return DisaggDecision(
            best,
            f"disaggregated: {num_uncached} uncached tokens >= {self.min_tokens}; "
            f"{best.worker_id} has {num_waiting} waiting",
        )
