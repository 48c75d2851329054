"""The simulator's routing policies: the router's own objects, plus a seeded random baseline. Pure."""

import random

from engines.base.types import KvLayout
from services.router.kv_policy import KvAwarePolicy, KvPolicyConfig
from services.router.policy import POLICIES, RoutingPolicy
from services.router.prefix_index import PrefixIndex
from services.router.types import Choice, RouteInput, WorkerView

POLICY_NAMES = ("kv", "round_robin", "random", "least_loaded")  # `tandem sim`'s; "kv-approx" is accepted too


class RandomPolicy:
    """A uniform draw among candidates (sorted by worker_id, so a seed fixes every choice)."""

    name = "random"
    event_index = None

    def __init__(self, seed: int = 0):
        self.rng = random.Random(seed)

    def choose(self, request: RouteInput, candidates: list[WorkerView]) -> Choice:
        return Choice(self.rng.choice(sorted(candidates, key=lambda v: v.worker_id)))


def make_sim_policy(
    name: str, clock, layout: KvLayout, seed: int = 0, kv_overlap_weight: float = 1.0, kv_inflight_weight: float = 0.1
) -> tuple[RoutingPolicy, PrefixIndex | None]:
    """The policy and, for "kv", the prefix index the simulator must feed with KV events ("kv-approx": the same
    cost over the router's own recent decisions alone, as on engines without KV events)."""
    if name in ("kv", "kv-approx"):
        index = PrefixIndex()
        config = KvPolicyConfig(
            overlap_weight=kv_overlap_weight,
            inflight_weight=kv_inflight_weight,
            block_size=layout.block_size,
            use_events=name == "kv",
        )
        return KvAwarePolicy(index, clock, config=config), index if name == "kv" else None
    if name == "random":
        return RandomPolicy(seed), None
    if name in POLICIES:
        return POLICIES[name](), None
    raise ValueError(f"unknown policy {name!r}; choose from {', '.join(POLICY_NAMES)}")
