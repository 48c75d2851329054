"""The planner's domain results as the Planner proto's Plan. Conversion only."""

import time

from services.common.protos import common_pb2, planner_pb2
from services.planner.types import Observation, TickResult, WorkerRole

_ROLES = {WorkerRole.PREFILL: common_pb2.WORKER_ROLE_PREFILL, WorkerRole.DECODE: common_pb2.WORKER_ROLE_DECODE}


def plan_to_pb(connector: str, obs: Observation, result: TickResult, core, last: planner_pb2.Plan) -> planner_pb2.Plan:
    """This tick's plan; the prediction is the last adjustment's (kept from `last` between adjustments)."""
    plan = planner_pb2.Plan(connector=connector, computed_unix_s=time.time(), warnings=list(result.warnings))
    predicted = result.predicted
    if predicted is not None:
        plan.predicted_request_rate, plan.predicted_isl, plan.predicted_osl = (
            predicted.request_rate,
            predicted.isl,
            predicted.osl,
        )
    else:
        plan.predicted_request_rate, plan.predicted_isl, plan.predicted_osl = (
            last.predicted_request_rate,
            last.predicted_isl,
            last.predicted_osl,
        )
    if obs.num_requests is not None and obs.window_s > 0:
        plan.observed_request_rate = obs.num_requests / obs.window_s
    for role, target in result.targets.items():
        r = obs.replicas.get(role)
        plan.targets.add(
            role=_ROLES[role],
            target_replicas=target,
            reason=core.state[role].reason,
            slo_budget=result.budgets.get(role, 0.0),
            **(
                {}
                if r is None
                else dict(
                    current_replicas=r.desired,
                    ready_replicas=r.ready,
                    starting_replicas=r.starting,
                    draining_replicas=r.draining,
                    held=r.is_held,
                )
            ),
        )
    return plan
