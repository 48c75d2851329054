"""The one place engine and service errors become gRPC status codes."""
import grpc

from engines.base.errors import (EngineBusyError, EngineDiedError, EngineError, InvalidRequestError,
                                 KvLayoutMismatchError, ModelNotFoundError, NoWorkerAvailableError,
                                 RequestNotFoundError, UnknownModelError, UnsupportedArchitectureError,
                                 WorkersBusyError)
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


async def abort_with(context: grpc.aio.ServicerContext, exc: Exception):
    """End the RPC with the status that matches `exc` (raises grpc's AbortError)."""
    await context.abort(status_for(exc), str(exc))
