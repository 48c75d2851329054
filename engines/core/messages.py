"""The messages between an engine loop and its client: msgspec structs that are their own wire format.

Client -> engine: Add, Abort, Call, Stop. Engine -> client: Ready or Failed once, then one StepOutputs per step
(every request's new tokens, the stats, the KV events) and a Reply per Call. KV bytes travel only in Add and
Reply, never in StepOutputs. Each message is defined once, here; the domain dataclasses it carries encode by
their own field names, so a new field travels without an edit here. No torch, no I/O.
"""

from typing import cast

import msgspec

from engines.base import errors
from engines.base.events import KvEvent
from engines.base.types import EngineRequest, EngineStats, KvExport, RequestOutput
from engines.core.runner import RunnerInfo


class Add(msgspec.Struct, frozen=True, array_like=True, tag="add"):
    request: EngineRequest


class Abort(msgspec.Struct, frozen=True, array_like=True, tag="abort"):
    req_id: str


class Call(msgspec.Struct, frozen=True, array_like=True, tag="call"):
    call_id: int
    name: str  # one of loop.CALLS
    arg: str | tuple | None = None  # a tuple is the method's arguments


class Stop(msgspec.Struct, frozen=True, array_like=True, tag="stop"):
    pass


class Ready(msgspec.Struct, frozen=True, array_like=True, tag="ready"):
    info: RunnerInfo
    stats: EngineStats  # before any step: what a worker's metrics show until its first request


class Failed(msgspec.Struct, frozen=True, array_like=True, tag="failed"):
    error: Exception


class StepOutputs(msgspec.Struct, frozen=True, array_like=True, tag="step"):
    outputs: list[RequestOutput]
    stats: EngineStats
    events: list[KvEvent] = []


class Reply(msgspec.Struct, frozen=True, array_like=True, tag="reply"):
    call_id: int
    value: KvExport | bytes | int | None = None  # bytes: a handle (export_kv into a staging file)
    error: Exception | None = None


Message = Add | Abort | Call | Stop | Ready | Failed | StepOutputs | Reply


def _enc_hook(value: object) -> object:
    if isinstance(value, Exception):  # NOTE: an error crosses as its class name and text, never pickled
        return (type(value).__name__, str(value))
    raise NotImplementedError(f"cannot encode {type(value).__name__}")


def _dec_hook(kind: type, value: object) -> object:
    if kind is Exception:
        name, text = cast(tuple[str, str], value)  # NOTE: `_enc_hook` wrote the pair
        return _error_from(name, text)
    raise NotImplementedError(f"cannot decode {kind.__name__}")


def _error_from(name: str, text: str) -> errors.EngineError:
    kind = getattr(errors, name, None)  # NOTE: only engines.base.errors cross as themselves
    if isinstance(kind, type) and issubclass(kind, errors.EngineError):
        return kind(text)
    return errors.EngineError(f"{name}: {text}")


_encoder = msgspec.msgpack.Encoder(enc_hook=_enc_hook)
_decoder = msgspec.msgpack.Decoder(Message, dec_hook=_dec_hook)


def encode(message: Message) -> bytes:
    return _encoder.encode(message)


def decode(data: bytes) -> Message:
    return _decoder.decode(data)
