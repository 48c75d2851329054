"""One routing decision: candidates from the registry, a decode worker from the policy, a prefill
worker from the disaggregation policy, in-flight load recorded. Pure: no I/O, no transport."""
from typing import Protocol, runtime_checkable

from services.router.policy import DisaggregationPolicy, RoutingPolicy
from services.router.registry import Registry
from services.router.types import (NoWorkerAvailableError, RouteDecision, RouteInput, UnknownModelError,
                                   WorkerRole, WorkerView)


@runtime_checkable
class PrefixOverlap(Protocol):
    """How many of a prompt's leading tokens a worker already holds in its KV cache."""

    def num_cached_tokens(self, token_ids: tuple[int, ...], worker_id: str) -> int: ...


class NoPrefixIndex:
    """Stands in until the KV-event prefix index exists: nothing is ever known to be cached."""

    def num_cached_tokens(self, token_ids: tuple[int, ...], worker_id: str) -> int:
        return 0


class RouterCore:
    def __init__(self, registry: Registry, policy: RoutingPolicy, disagg: DisaggregationPolicy,
                 overlap: PrefixOverlap | None = None):
        self.registry = registry
        self.policy = policy
        self.disagg = disagg
        # NOTE: a policy that estimates overlap itself (KvAwarePolicy) is the overlap unless one is given
        self.overlap = overlap or (policy if isinstance(policy, PrefixOverlap) else NoPrefixIndex())

    def route(self, request: RouteInput) -> RouteDecision:
        """Choose workers for `request` and count it against them; raises when none can take it."""
        request.validate()
        decode = self.policy.choose(request, self._decode_candidates(request))
        num_cached = self.overlap.num_cached_tokens(request.token_ids, decode.worker_id)
        split = self.disagg.decide(request, self.candidates(request, WorkerRole.PREFILL), num_cached)
        chosen = [decode.worker_id] + ([split.prefill.worker_id] if split.prefill else [])
        num_tokens = len(request.token_ids)
        self.registry.add_inflight(request.req_id, chosen, num_tokens, max(num_tokens - num_cached, 0))
        return RouteDecision(decode, split.prefill, self.policy.name, num_cached, split.reason)

    def candidates(self, request: RouteInput, role: WorkerRole) -> list[WorkerView]:
        views = self.registry.views(request.model, role)
        return [v for v in views if v.worker_id not in request.exclude_worker_ids]

    def _decode_candidates(self, request: RouteInput) -> list[WorkerView]:
        found = self.candidates(request, WorkerRole.DECODE)
        if found:
            return found
        if not self.registry.has_model(request.model) and self.registry.views():
            raise UnknownModelError(f"model {request.model!r} is not served by any worker")
        excluded = ", ".join(sorted(request.exclude_worker_ids))
        suffix = f" (excluding {excluded})" if excluded else ""
        raise NoWorkerAvailableError(f"no live decode worker for model {request.model!r}{suffix}")
