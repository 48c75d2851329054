"""Domain types of the gateway's gRPC seams: what it asks (a route, a failure report) and what it reads (a route, a
prefill's outcome, a listed worker, a token delta). services/common/convert.py turns them into protobuf and back at
the boundary; nothing here knows a protobuf message."""

from collections.abc import Sequence
from dataclasses import dataclass

import msgspec

from engines.base.types import FinishReason, TokenLogprob
from services.common.roles import WorkerRole


@dataclass(frozen=True, slots=True)
class WorkerRef:
    worker_id: str
    address: str


# NOTE: a msgspec struct, not a frozen dataclass: built once per request, it costs ~0.1 µs instead of ~0.8
class RouteRequest(msgspec.Struct, frozen=True):
    """What the gateway asks the router. The sequences are the caller's own (never copied on the way to the wire)."""

    req_id: str
    model: str
    token_ids: Sequence[int]  # the prompt, plus the tokens already streamed when a request migrates
    exclude_worker_ids: Sequence[str] = ()  # workers that already failed this request
    block_hashes: Sequence[int] = ()  # the prompt's chained block hashes, when the workers' block size is known
    block_size: int = 0  # the block size of `block_hashes`
    cache_salt: str = ""


class FailureReport(msgspec.Struct, frozen=True):
    """A worker that failed a request, told to the router so it stops routing there at once."""

    worker_id: str
    req_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class Route:
    """The router's decision: the decode worker, and the prefill worker when disaggregation pays."""

    decode: WorkerRef
    prefill: WorkerRef | None = None


@dataclass(frozen=True, slots=True)
class Prefilled:
    """A prefill worker's answer: the first token and, unless it already finished the request, the KV handle."""

    first_token_id: int
    logprob: TokenLogprob | None = None
    finish_reason: FinishReason | None = None
    num_cached_tokens: int = 0
    # NOTE: opaque to the gateway: handed back to the decode worker as it came (its signature covers its fields)
    kv: object | None = None


@dataclass(frozen=True, slots=True)
class ListedWorker:
    """One worker of the router's list, as the gateway reads it."""

    role: WorkerRole | None  # None: a role this gateway does not know
    model: str
    max_model_len: int
    block_size: int
    is_live: bool  # its lease has not run out


@dataclass(frozen=True, slots=True)
class TokenDelta:
    token_ids: tuple[int, ...]
    logprobs: tuple[TokenLogprob, ...] = ()
    finish_reason: FinishReason | None = None  # STOP or LENGTH; the pipeline raises on ERROR and ABORT
    num_cached_tokens: int = 0  # prompt tokens the worker that prefilled found cached (read on the first delta)
