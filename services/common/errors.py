"""The one place engine and service errors become gRPC statuses: a status code plus a structured detail (a
google.rpc.ErrorInfo naming the error's class and the request field at fault), and where a caller reads it back."""

from dataclasses import dataclass

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from engines.base.errors import (
    EngineBusyError,
    EngineDiedError,
    EngineError,
    InvalidRequestError,
    KvLayoutMismatchError,
    ModelNotFoundError,
    NoWorkerAvailableError,
    RequestNotFoundError,
    UnknownModelError,
    UnsupportedArchitectureError,
    WorkersBusyError,
)
from engines.transfer.budget import StagingFull
from services.common.kv_signing import HandleInvalid, HandleNotTrusted

_CODES: list[tuple[type[Exception], grpc.StatusCode]] = [
    (HandleNotTrusted, grpc.StatusCode.PERMISSION_DENIED),  # forged, foreign, replayed, or from a stranger
    (HandleInvalid, grpc.StatusCode.INVALID_ARGUMENT),  # expired, or for other tokens
    (EngineDiedError, grpc.StatusCode.UNAVAILABLE),  # another worker can take it
    (NoWorkerAvailableError, grpc.StatusCode.UNAVAILABLE),
    (WorkersBusyError, grpc.StatusCode.RESOURCE_EXHAUSTED),  # shed load: retry later
    (StagingFull, grpc.StatusCode.RESOURCE_EXHAUSTED),  # no staging room for a pull in time: retry later
    (UnknownModelError, grpc.StatusCode.NOT_FOUND),
    (KvLayoutMismatchError, grpc.StatusCode.FAILED_PRECONDITION),
    (EngineBusyError, grpc.StatusCode.FAILED_PRECONDITION),
    (InvalidRequestError, grpc.StatusCode.INVALID_ARGUMENT),
    (RequestNotFoundError, grpc.StatusCode.NOT_FOUND),
    (ModelNotFoundError, grpc.StatusCode.NOT_FOUND),
    (UnsupportedArchitectureError, grpc.StatusCode.UNIMPLEMENTED),
    (EngineError, grpc.StatusCode.INTERNAL),
]


def status_for(exc: Exception) -> grpc.StatusCode:
    for kind, code in _CODES:
        if isinstance(exc, kind):
            return code
    return grpc.StatusCode.INTERNAL


DOMAIN = "tandem"  # ErrorInfo.domain of the errors tandem raises on purpose


@dataclass(frozen=True, slots=True)
class ErrorDetail:
    """What a failed call's structured detail says: the error's class name and the request field at fault."""

    kind: str
    param: str | None = None


def status_of(exc: Exception) -> status_pb2.Status:
    """`exc` as a rich status: its code and text, and an ErrorInfo detail with its kind (and param)."""
    param = getattr(exc, "param", None)
    info = error_details_pb2.ErrorInfo(
        reason=type(exc).__name__, domain=DOMAIN, metadata={"param": param} if param else {}
    )
    detail = any_pb2.Any()
    detail.Pack(info)
    return status_pb2.Status(code=status_for(exc).value[0], message=str(exc), details=[detail])


async def abort_with(context: grpc.aio.ServicerContext, exc: Exception):
    """End the RPC with the status that matches `exc`, its detail attached (raises grpc's AbortError)."""
    await context.abort_with_status(rpc_status.to_status(status_of(exc)))


def detail_of(err: grpc.RpcError) -> ErrorDetail | None:
    """The structured detail of a failed call; None when it carries none (a transport error, another server)."""
    try:
        status = rpc_status.from_call(err)
    except ValueError:  # NOTE: a detail whose code or text disagrees with the call's is not trusted
        return None
    info = error_details_pb2.ErrorInfo()
    for detail in status.details if status is not None else ():
        if detail.Unpack(info) and info.domain == DOMAIN:
            return ErrorDetail(info.reason, info.metadata.get("param") or None)
    return None
