"""Router protobuf messages <-> router domain types. The only router module that knows both shapes."""

from engines.base.block_hash import chain_root
from services.common.convert import layout_from_pb, layout_to_pb, role_to_pb
from services.common.convert import role_from_pb as _role_from_pb
from services.common.protos import common_pb2, router_pb2
from services.common.roles import WorkerRole
from services.router.types import InvalidArgumentError, RouteDecision, RouteInput, WorkerInfo, WorkerLoad, WorkerView

_LOAD_FIELDS = WorkerLoad.__slots__


def role_from_pb(value: int) -> WorkerRole:
    try:
        return _role_from_pb(value)
    except ValueError as exc:
        raise InvalidArgumentError(str(exc)) from None


def worker_info_from_pb(msg: router_pb2.WorkerInfo) -> WorkerInfo:
    layout = layout_from_pb(msg.layout) if msg.HasField("layout") else None
    return WorkerInfo(
        msg.worker_id, role_from_pb(msg.role), msg.address, msg.model, layout, msg.max_num_seqs, msg.max_model_len
    )


def worker_info_to_pb(info: WorkerInfo) -> router_pb2.WorkerInfo:
    msg = router_pb2.WorkerInfo(
        worker_id=info.worker_id,
        role=role_to_pb(info.role),
        address=info.address,
        model=info.model,
        max_num_seqs=info.max_num_seqs,
        max_model_len=info.max_model_len,
    )
    if info.layout is not None:
        msg.layout.CopyFrom(layout_to_pb(info.layout))
    return msg


def load_from_pb(msg: common_pb2.WorkerLoad) -> WorkerLoad:
    return WorkerLoad(**{name: getattr(msg, name) for name in _LOAD_FIELDS})


def load_to_pb(load: WorkerLoad) -> common_pb2.WorkerLoad:
    return common_pb2.WorkerLoad(**{name: getattr(load, name) for name in _LOAD_FIELDS})


def route_input_from_pb(msg: router_pb2.RouteRequest, secret: str = "") -> RouteInput:
    # NOTE: the token ids stay in the message's repeated field (a read-only sequence): copying 8k of them into a
    # tuple costs far more than the decision, which reads only their count when the gateway sent block hashes
    return RouteInput(
        msg.req_id,
        msg.model,
        msg.token_ids,
        frozenset(msg.exclude_worker_ids),
        tuple(msg.block_hashes),
        msg.hash_block_size,
        chain_root(msg.cache_salt, secret),
    )


def worker_ref(view: WorkerView) -> router_pb2.WorkerRef:
    return router_pb2.WorkerRef(worker_id=view.worker_id, address=view.info.address)


def decision_to_pb(decision: RouteDecision) -> router_pb2.RouteResponse:
    msg = router_pb2.RouteResponse(
        decode=worker_ref(decision.decode),
        policy=decision.policy,
        num_cached_tokens=decision.num_cached_tokens,
        reason=decision.reason,
    )
    if decision.prefill is not None:
        msg.prefill.CopyFrom(worker_ref(decision.prefill))
    return msg


def worker_status_to_pb(view: WorkerView) -> router_pb2.WorkerStatus:
    return router_pb2.WorkerStatus(
        worker=worker_info_to_pb(view.info),
        load=load_to_pb(view.load),
        lease_expires_in_s=view.lease_expires_in_s,
        num_inflight=view.num_inflight,
    )
