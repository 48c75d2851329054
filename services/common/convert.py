"""Domain dataclasses <-> protobuf messages. The only module that knows both shapes."""

import dataclasses

from engines.base.events import KvEvent, KvEventKind, KvSnapshot, KvTier
from engines.base.structured import StructuredSpec
from engines.base.types import EngineStats, FinishReason, KvLayout, SamplingParams, TokenLogprob
from services.common.domain import FailureReport, ListedWorker, Prefilled, Route, RouteRequest, TokenDelta, WorkerRef
from services.common.protos import common_pb2 as pb
from services.common.protos import router_pb2, worker_pb2
from services.common.roles import WorkerRole

_FINISH_TO_PB = {
    None: pb.FINISH_REASON_UNSPECIFIED,
    FinishReason.STOP: pb.FINISH_REASON_STOP,
    FinishReason.LENGTH: pb.FINISH_REASON_LENGTH,
    FinishReason.ABORT: pb.FINISH_REASON_ABORT,
    FinishReason.ERROR: pb.FINISH_REASON_ERROR,
    FinishReason.PREFILLED: pb.FINISH_REASON_PREFILLED,
}
_FINISH_FROM_PB = {v: k for k, v in _FINISH_TO_PB.items()}
_KIND_TO_PB = {
    KvEventKind.STORED: pb.KV_EVENT_KIND_STORED,
    KvEventKind.REMOVED: pb.KV_EVENT_KIND_REMOVED,
    KvEventKind.CLEARED: pb.KV_EVENT_KIND_CLEARED,
}
_KIND_FROM_PB = {v: k for k, v in _KIND_TO_PB.items()}
_TIER_TO_PB = {KvTier.DEVICE: pb.KV_TIER_DEVICE, KvTier.HOST: pb.KV_TIER_HOST, KvTier.DISK: pb.KV_TIER_DISK}
_TIER_FROM_PB = {v: k for k, v in _TIER_TO_PB.items()}
_ROLE_TO_PB = {WorkerRole.PREFILL: pb.WORKER_ROLE_PREFILL, WorkerRole.DECODE: pb.WORKER_ROLE_DECODE}
_ROLE_FROM_PB = {v: k for k, v in _ROLE_TO_PB.items()}


def role_to_pb(role: WorkerRole) -> int:
    return _ROLE_TO_PB[role]


def role_from_pb(value: int) -> WorkerRole:
    """Raises ValueError for an unspecified or unknown role."""
    try:
        return _ROLE_FROM_PB[value]
    except KeyError:
        raise ValueError(f"worker role must be PREFILL or DECODE, got {value}") from None


def finish_to_pb(reason: FinishReason | None) -> int:
    return _FINISH_TO_PB[reason]


def finish_from_pb(value: int) -> FinishReason | None:
    return _FINISH_FROM_PB[value]


def params_to_pb(p: SamplingParams) -> pb.SamplingParams:
    msg = pb.SamplingParams(
        max_tokens=p.max_tokens,
        temperature=p.temperature,
        top_k=p.top_k,
        top_p=p.top_p,
        stop_token_ids=list(p.stop_token_ids),
        ignore_eos=p.ignore_eos,
        min_tokens=p.min_tokens,
        logprobs=p.logprobs,
        top_logprobs=p.top_logprobs,
        presence_penalty=p.presence_penalty,
        frequency_penalty=p.frequency_penalty,
        min_p=p.min_p,
        logit_bias=dict(p.logit_bias),
        cache_salt=p.cache_salt,
    )
    if p.seed is not None:
        msg.seed = p.seed
    if p.repetition_penalty != 1.0:
        msg.repetition_penalty = p.repetition_penalty
    if p.structured is not None:
        msg.structured.CopyFrom(
            pb.StructuredSpec(kind=p.structured.kind, value=p.structured.value, field=p.structured.field)
        )
    return msg


def params_from_pb(msg: pb.SamplingParams) -> SamplingParams:
    params = SamplingParams(
        max_tokens=msg.max_tokens,
        temperature=msg.temperature,
        top_k=msg.top_k,
        top_p=msg.top_p if msg.HasField("top_p") else 1.0,
        seed=msg.seed if msg.HasField("seed") else None,
        stop_token_ids=tuple(msg.stop_token_ids),
        ignore_eos=msg.ignore_eos,
        min_tokens=msg.min_tokens,
        logprobs=msg.logprobs,
        top_logprobs=msg.top_logprobs,
        presence_penalty=msg.presence_penalty,
        frequency_penalty=msg.frequency_penalty,
        repetition_penalty=msg.repetition_penalty if msg.HasField("repetition_penalty") else 1.0,
        min_p=msg.min_p,
        logit_bias=tuple(sorted(msg.logit_bias.items())),
        cache_salt=msg.cache_salt,
    )
    if msg.HasField("structured"):
        spec = StructuredSpec(msg.structured.kind, msg.structured.value, msg.structured.field)
        params = dataclasses.replace(params, structured=spec)
    return params


def logprob_to_pb(lp: TokenLogprob) -> pb.TokenLogprob:
    top = [pb.TopLogprob(token_id=t, logprob=v) for t, v in lp.top]
    return pb.TokenLogprob(token_id=lp.token_id, logprob=lp.logprob, top=top)


def logprob_from_pb(msg: pb.TokenLogprob) -> TokenLogprob:
    return TokenLogprob(msg.token_id, msg.logprob, tuple((t.token_id, t.logprob) for t in msg.top))


def layout_to_pb(layout: KvLayout) -> pb.KvLayout:
    return pb.KvLayout(
        num_layers=layout.num_layers,
        num_kv_heads=layout.num_kv_heads,
        head_dim=layout.head_dim,
        dtype=layout.dtype,
        block_size=layout.block_size,
    )


def layout_from_pb(msg: pb.KvLayout) -> KvLayout:
    return KvLayout(msg.num_layers, msg.num_kv_heads, msg.head_dim, msg.dtype, msg.block_size)


def load_to_pb(stats: EngineStats, max_num_seqs: int) -> pb.WorkerLoad:
    return pb.WorkerLoad(
        num_waiting=stats.num_waiting,
        num_running=stats.num_running,
        num_held=stats.num_held,
        num_blocks_used=stats.num_blocks_used,
        num_blocks_total=stats.num_blocks_total,
        max_num_seqs=max_num_seqs,
        prefix_hit_rate=stats.prefix_hit_rate,
        prefill_tokens_per_s=stats.prefill_tokens_per_s,
        kv_bytes_per_token=stats.kv_bytes_per_token,
        kv_host_bytes_per_s=stats.kv_host_bytes_per_s,
        kv_disk_bytes_per_s=stats.kv_disk_bytes_per_s,
    )


def kv_event_to_pb(e: KvEvent) -> pb.KvEvent:
    return pb.KvEvent(
        seq=e.seq,
        kind=_KIND_TO_PB[e.kind],
        parent_hash=e.parent_hash,
        block_hashes=list(e.block_hashes),
        tier=_TIER_TO_PB[e.tier],
    )


def kv_event_from_pb(msg: pb.KvEvent) -> KvEvent:
    """Raises ValueError for an unspecified kind or tier (a peer that is newer or broken)."""
    if msg.kind not in _KIND_FROM_PB or msg.tier not in _TIER_FROM_PB:
        raise ValueError(f"KV event {msg.seq} has an unknown kind {msg.kind} or tier {msg.tier}")
    return KvEvent(msg.seq, _KIND_FROM_PB[msg.kind], msg.parent_hash, tuple(msg.block_hashes), _TIER_FROM_PB[msg.tier])


def kv_events_to_pb(worker_id: str, events: list[KvEvent]) -> worker_pb2.KvEventBatch:
    return worker_pb2.KvEventBatch(worker_id=worker_id, events=[kv_event_to_pb(e) for e in events])


def kv_snapshot_to_pb(worker_id: str, snapshot: KvSnapshot) -> worker_pb2.KvEventBatch:
    """A snapshot on the wire: CLEARED, then the STORED events, every one carrying the snapshot's seq."""
    cleared = KvEvent(snapshot.seq, KvEventKind.CLEARED)
    return kv_events_to_pb(worker_id, [cleared, *snapshot.events])


def kv_batch_from_pb(msg: worker_pb2.KvEventBatch) -> list[KvEvent] | KvSnapshot:
    """Events to apply in order, or a snapshot to resync from (see `kv_snapshot_to_pb`).

    NOTE: a lone CLEARED event reads as an empty snapshot at its seq, which means the same thing."""
    events = [kv_event_from_pb(e) for e in msg.events]
    if events and events[0].kind is KvEventKind.CLEARED and all(e.seq == events[0].seq for e in events):
        return KvSnapshot(events[0].seq, tuple(events[1:]))
    return events


# -- the gateway's seams (services/common/domain.py) -----------------------------------------------
def route_request_to_pb(r: RouteRequest) -> router_pb2.RouteRequest:
    return router_pb2.RouteRequest(
        req_id=r.req_id,
        model=r.model,
        token_ids=r.token_ids,
        exclude_worker_ids=r.exclude_worker_ids,
        block_hashes=r.block_hashes,
        hash_block_size=r.block_size if r.block_hashes else 0,
        cache_salt=r.cache_salt,
    )


def route_from_pb(msg: router_pb2.RouteResponse) -> Route:
    prefill = WorkerRef(msg.prefill.worker_id, msg.prefill.address) if msg.HasField("prefill") else None
    return Route(WorkerRef(msg.decode.worker_id, msg.decode.address), prefill)


def prefilled_from_pb(msg: worker_pb2.PrefillResponse) -> Prefilled:
    logprob = logprob_from_pb(msg.first_logprob) if msg.HasField("first_logprob") else None
    return Prefilled(
        msg.first_token_id,
        logprob,
        finish_from_pb(msg.finish_reason),
        msg.num_cached_tokens,
        msg.kv if msg.HasField("kv") else None,
    )


def generate_request_to_pb(
    req_id: str, prompt: list[int], params: SamplingParams, kv: object | None = None, output_token_ids: list[int] = ()
) -> worker_pb2.GenerateRequest:
    return worker_pb2.GenerateRequest(
        req_id=req_id, token_ids=prompt, params=params_to_pb(params), kv=kv, output_token_ids=output_token_ids
    )


def delta_from_pb(msg: worker_pb2.GenerateResponse) -> TokenDelta:
    logprobs = tuple(logprob_from_pb(lp) for lp in msg.logprobs) if msg.logprobs else ()
    return TokenDelta(tuple(msg.token_ids), logprobs, finish_from_pb(msg.finish_reason), msg.num_cached_tokens)


def listed_workers_from_pb(msg: router_pb2.ListWorkersResponse) -> list[ListedWorker]:
    return [
        ListedWorker(
            _ROLE_FROM_PB.get(w.worker.role),
            w.worker.model,
            w.worker.max_model_len,
            w.worker.layout.block_size,
            w.lease_expires_in_s > 0,
        )
        for w in msg.workers
    ]


def prefill_request_to_pb(req_id: str, prompt: list[int], params: SamplingParams) -> worker_pb2.PrefillRequest:
    return worker_pb2.PrefillRequest(req_id=req_id, token_ids=prompt, params=params_to_pb(params))


def list_workers_request_to_pb() -> router_pb2.ListWorkersRequest:
    return router_pb2.ListWorkersRequest()


def failure_report_to_pb(report: FailureReport) -> router_pb2.ReportFailureRequest:
    return router_pb2.ReportFailureRequest(worker_id=report.worker_id, req_id=report.req_id, reason=report.reason)


def complete_request_to_pb(req_id: str) -> router_pb2.CompleteRequest:
    return router_pb2.CompleteRequest(req_id=req_id)


def abort_request_to_pb(req_id: str) -> worker_pb2.AbortRequest:
    return worker_pb2.AbortRequest(req_id=req_id)


def release_kv_request_to_pb(req_id: str) -> worker_pb2.ReleaseKvRequest:
    return worker_pb2.ReleaseKvRequest(req_id=req_id)
