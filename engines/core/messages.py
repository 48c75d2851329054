"""The messages between an engine loop and its client, and their msgpack encoding for the process channel.

Client -> engine: Add, Abort, Call, Stop. Engine -> client: Ready or Failed once, then one StepOutputs per step
(every request's new tokens, the stats, the KV events) and a Reply per Call. KV bytes travel only in Add and
Reply, never in StepOutputs. Plain tuples on the hot path; no torch, no I/O.
"""
from dataclasses import dataclass, field

import msgpack

from engines.base import errors
from engines.base.events import KvEvent, KvEventKind, KvTier
from engines.base.structured import StructuredSpec
from engines.base.types import (EngineRequest, EngineStats, FinishReason, KvExport, KvLayout, RequestOutput,
                                SamplingParams, TokenLogprob)
from engines.core.runner import RunnerInfo


@dataclass(frozen=True, slots=True)
class Add:
    request: EngineRequest


@dataclass(frozen=True, slots=True)
class Abort:
    req_id: str


@dataclass(frozen=True, slots=True)
class Call:
    call_id: int
    name: str  # one of loop.CALLS
    arg: str | tuple | None = None  # a tuple is the method's arguments


@dataclass(frozen=True, slots=True)
class Stop:
    pass


@dataclass(frozen=True, slots=True)
class Ready:
    info: RunnerInfo
    stats: EngineStats  # before any step: what a worker's metrics show until its first request


@dataclass(frozen=True, slots=True)
class Failed:
    error: Exception


@dataclass(frozen=True, slots=True)
class StepOutputs:
    outputs: list[RequestOutput]
    stats: EngineStats
    events: list[KvEvent] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Reply:
    call_id: int
    value: object = None  # KvExport, int or None
    error: Exception | None = None


# -- encoding ------------------------------------------------------------------------------------
_KV_EXPORT, _ERROR = 1, 2  # msgpack extension codes for the values a Reply or Failed carries


def encode(message) -> bytes:
    return msgpack.packb(_ENCODERS[type(message)](message), default=_ext)


def decode(data: bytes):
    tag, *fields = msgpack.unpackb(data, use_list=False, ext_hook=_from_ext)
    return _DECODERS[tag](*fields)


def _layout(layout: KvLayout) -> tuple:
    return (layout.num_layers, layout.num_kv_heads, layout.head_dim, layout.dtype, layout.block_size)


def _kv(kv: KvExport | None) -> tuple | None:
    return None if kv is None else (_layout(kv.layout), kv.token_ids, kv.num_blocks, kv.data, kv.scales)


def _kv_from(t: tuple | None) -> KvExport | None:
    return None if t is None else KvExport(KvLayout(*t[0]), t[1], t[2], t[3], t[4])


# NOTE: the dataclass's field order is the wire order: one definition, a new field travels without an edit here
_PARAM_FIELDS = tuple(SamplingParams.__dataclass_fields__)
assert _PARAM_FIELDS[-1] == "structured", "SamplingParams.structured must stay its last field"


def _request(r: EngineRequest) -> tuple:
    # structured travels as a plain tuple (msgpack knows no dataclass); the assert above keeps it last
    params = tuple(getattr(r.params, f) for f in _PARAM_FIELDS[:-1]) + (_structured(r.params.structured),)
    return (r.req_id, r.prompt_token_ids, params, r.hold_kv, _kv(r.kv), r.output_token_ids, r.kv_params,
            r.hash_root)


def _request_from(req_id, prompt, params, hold_kv, kv, output_ids, kv_params, hash_root) -> EngineRequest:
    *plain, structured = params
    return EngineRequest(req_id, prompt, SamplingParams(*plain, _structured_from(structured)), hold_kv, _kv_from(kv),
                         output_ids, kv_params, hash_root)


def _structured(spec: StructuredSpec | None) -> tuple | None:
    return None if spec is None else (spec.kind, spec.value, spec.field)


def _structured_from(t: tuple | None) -> StructuredSpec | None:
    return None if t is None else StructuredSpec(*t)


def _output(o: RequestOutput) -> tuple:
    logprobs = tuple((lp.token_id, lp.logprob, lp.top) for lp in o.logprobs)
    return (o.req_id, o.new_token_ids, logprobs, o.finish_reason.value if o.finish_reason else None,
            o.num_prompt_tokens, o.num_cached_tokens, o.error, o.queue_s, o.kv_params)


def _output_from(t: tuple) -> RequestOutput:
    req_id, ids, logprobs, finish, num_prompt, num_cached, error, queue_s, kv_params = t
    lps = tuple(TokenLogprob(i, v, top) for i, v, top in logprobs)
    return RequestOutput(req_id, ids, lps, FinishReason(finish) if finish else None, num_prompt, num_cached, error,
                         queue_s, kv_params)


def _event(e: KvEvent) -> tuple:
    return (e.seq, e.kind.value, e.parent_hash, e.block_hashes, e.tier.value)


def _event_from(t: tuple) -> KvEvent:
    return KvEvent(t[0], KvEventKind(t[1]), t[2], t[3], KvTier(t[4]))


def _info(i: RunnerInfo) -> tuple:
    return (_layout(i.kv_layout), i.num_blocks, i.max_model_len, i.vocab_size, i.eos_token_ids, i.kv_transport,
            i.no_logits, i.can_constrain, i.can_speculate)


def _ext(value):
    if isinstance(value, KvExport):
        return msgpack.ExtType(_KV_EXPORT, msgpack.packb(_kv(value)))
    if isinstance(value, Exception):
        return msgpack.ExtType(_ERROR, msgpack.packb((type(value).__name__, str(value))))
    raise TypeError(f"cannot encode {type(value).__name__}")


def _from_ext(code: int, data: bytes):
    fields = msgpack.unpackb(data, use_list=False)
    if code == _KV_EXPORT:
        return _kv_from(fields)
    kind = getattr(errors, fields[0], None)  # NOTE: only engines.base.errors cross as themselves
    if isinstance(kind, type) and issubclass(kind, errors.EngineError):
        return kind(fields[1])
    return errors.EngineError(f"{fields[0]}: {fields[1]}")


_ENCODERS = {
    Add: lambda m: ("add", _request(m.request)),
    Abort: lambda m: ("abort", m.req_id),
    Call: lambda m: ("call", m.call_id, m.name, m.arg),
    Stop: lambda m: ("stop",),
    Ready: lambda m: ("ready", _info(m.info), _stats(m.stats)),
    Failed: lambda m: ("failed", m.error),
    StepOutputs: lambda m: ("step", [_output(o) for o in m.outputs], _stats(m.stats), [_event(e) for e in m.events]),
    Reply: lambda m: ("reply", m.call_id, m.value, m.error),
}


def _stats(s: EngineStats) -> tuple:
    return tuple(getattr(s, f) for f in EngineStats.__dataclass_fields__)


_DECODERS = {
    "add": lambda r: Add(_request_from(*r)),
    "abort": Abort,
    "call": Call,
    "stop": Stop,
    "ready": lambda i, stats: Ready(RunnerInfo(KvLayout(*i[0]), *i[1:]), EngineStats(*stats)),
    "failed": Failed,
    "step": lambda outs, stats, events: StepOutputs([_output_from(o) for o in outs], EngineStats(*stats),
                                                    [_event_from(e) for e in events]),
    "reply": Reply,
}
