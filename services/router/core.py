"""One routing decision: candidates from the registry, a decode worker from the policy, a prefill
worker from the disaggregation policy, in-flight load recorded. Pure: no I/O, no transport."""
from services.router.policy import DisaggregationPolicy, RoutingPolicy
from services.router.registry import Registry
from services.router.types import (NoWorkerAvailableError, RouteDecision, RouteInput, UnknownModelError,
                                   WorkerRole, WorkerView)


class RouterCore:
    def __init__(self, registry: Registry, policy: RoutingPolicy, disagg: DisaggregationPolicy):
        self.registry = registry
        self.policy = policy
        self.disagg = disagg

    def route(self, request: RouteInput) -> RouteDecision:
        """Choose workers for `request` and count it against them; raises when none can take it."""
        request.validate()
        choice = self.policy.choose(request, self._decode_candidates(request))
        decode, num_cached = choice.view, choice.num_cached_tokens
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
