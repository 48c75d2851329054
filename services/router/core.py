"""One routing decision: candidates from the registry (quarantined workers only when nothing else is left), a
decode worker from the policy, a prefill worker from the disaggregation policy, in-flight load recorded; when
every decode candidate is past the busy threshold, load is shed instead. The array-scored kv policy decides without
a view per worker where it can, and leaves its bookkeeping for after the reply. Pure: no I/O, no transport."""

from dataclasses import dataclass

from services.router.array_policy import ArrayKvPolicy
from services.router.policy import DisaggregationPolicy, RoutingPolicy, load_of
from services.router.registry import Registry
from services.router.types import (
    Choice,
    NoWorkerAvailableError,
    RouteDecision,
    RouteInput,
    UnknownModelError,
    WorkerRole,
    WorkersBusyError,
    WorkerView,
)


@dataclass(frozen=True, slots=True)
class BusyThresholds:
    """When a decode worker counts as saturated (0 turns a check off): `load`, sequences per batch slot
    (running, waiting and routed-but-unreported, as `load_of`); `kv`, the share of its KV blocks in use."""

    load: float = 0.0
    kv: float = 0.0

    def is_busy(self, view: WorkerView) -> bool:
        kv_used = view.load.num_blocks_used / view.load.num_blocks_total if view.load.num_blocks_total else 0.0
        return (0 < self.load <= load_of(view)) or (0 < self.kv <= kv_used)


class RouterCore:
    def __init__(
        self,
        registry: Registry,
        policy: RoutingPolicy,
        disagg: DisaggregationPolicy,
        busy: BusyThresholds = BusyThresholds(),
    ):
        self.registry = registry
        self.policy = policy
        self.disagg = disagg
        self.busy = busy

    def route(self, request: RouteInput) -> RouteDecision:
        """Choose workers for `request` and count it against them; raises when none can take it."""
        request.validate()
        choice = self._choose_arrays(request) or self.policy.choose(request, self._decode_candidates(request))
        decode, num_cached = choice.view, choice.num_cached_tokens
        split = self.disagg.decide(request, self.candidates(request, WorkerRole.PREFILL), num_cached)
        chosen = [decode.worker_id] + ([split.prefill.worker_id] if split.prefill else [])
        num_tokens = len(request.token_ids)
        self.registry.add_inflight(request.req_id, chosen, num_tokens, max(num_tokens - num_cached, 0))
        return RouteDecision(decode, split.prefill, self.policy.name, num_cached, split.reason)

    def _choose_arrays(self, request: RouteInput) -> Choice | None:
        """The array-scored kv path, where nothing needs a per-worker look: no exclusions, no quarantine, and not
        every worker busy. None: the per-view path decides (and raises what it must)."""
        if not isinstance(self.policy, ArrayKvPolicy) or request.exclude_worker_ids or self.registry.has_quarantine():
            return None
        group = self.registry.arrays(request.model, WorkerRole.DECODE)
        if not group.worker_ids:  # none: the per-view path says so
            return None
        # NOTE: every live worker busy is declined too: the per-view path raises WorkersBusyError
        picked = self.policy.choose_arrays(request, group, self.busy.load, self.busy.kv)
        if picked is None:
            return None
        view = self.registry.view(picked[0])
        return Choice(view, picked[1]) if view is not None else None

    def flush_deferred(self) -> None:
        """What the last decisions left for after their reply (the array policy's LRU touches and recent routes);
        anything that reads that state makes it first anyway, so calling this only moves the work off the reply."""
        if isinstance(self.policy, ArrayKvPolicy):
            self.policy.flush_deferred()

    def candidates(self, request: RouteInput, role: WorkerRole) -> list[WorkerView]:
        views = [v for v in self.registry.views(request.model, role) if v.worker_id not in request.exclude_worker_ids]
        # NOTE: quarantine is a preference: a pool whose every worker failed recently still serves
        healthy = [v for v in views if not self.registry.quarantine_left_s(v.worker_id)]
        return healthy or views

    def _decode_candidates(self, request: RouteInput) -> list[WorkerView]:
        found = self.candidates(request, WorkerRole.DECODE)
        if found:
            if all(self.busy.is_busy(v) for v in found):
                raise WorkersBusyError(f"all {len(found)} decode workers for model {request.model!r} are busy")
            return found
        if not self.registry.has_model(request.model) and self.registry.views():
            raise UnknownModelError(f"model {request.model!r} is not served by any worker")
        excluded = ", ".join(sorted(request.exclude_worker_ids))
        suffix = f" (excluding {excluded})" if excluded else ""
        raise NoWorkerAvailableError(f"no live decode worker for model {request.model!r}{suffix}")
