"""The one place engine and service errors become gRPC status codes."""
import grpc

from engines.base.errors import (EngineBusyError, EngineDiedError, EngineError, InvalidRequestError,
                                 KvLayoutMismatchError, ModelNotFoundError, RequestNotFoundError,
                                 UnsupportedArchitectureError)


class ServiceError(Exception):
    """An error a servicer raises on purpose, with the status it should carry."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code = code


class NoWorkerError(ServiceError):
    def __init__(self, message: str):
        super().__init__(grpc.StatusCode.UNAVAILABLE, message)


_CODES: list[tuple[type[Exception], grpc.StatusCode]] = [
    (EngineDiedError, grpc.StatusCode.UNAVAILABLE),  # another worker can take it
    (KvLayoutMismatchError, grpc.StatusCode.FAILED_PRECONDITION),
    (EngineBusyError, grpc.StatusCode.FAILED_PRECONDITION),
    (InvalidRequestError, grpc.StatusCode.INVALID_ARGUMENT),
    (RequestNotFoundError, grpc.StatusCode.NOT_FOUND),
    (ModelNotFoundError, grpc.StatusCode.NOT_FOUND),
    (UnsupportedArchitectureError, grpc.StatusCode.UNIMPLEMENTED),
    (EngineError, grpc.StatusCode.INTERNAL),
]


def status_for(exc: Exception) -> grpc.StatusCode:
    if isinstance(exc, ServiceError):
        return exc.code
    named = getattr(exc, "grpc_status", None)  # pure domain errors name their status (router)
    if named is not None:
        return grpc.StatusCode[named]
    for kind, code in _CODES:
        if isinstance(exc, kind):
            return code
    return grpc.StatusCode.INTERNAL


async def abort_with(context: grpc.aio.ServicerContext, exc: Exception):
    """End the RPC with the status that matches `exc` (raises grpc's AbortError)."""
    await context.abort(status_for(exc), str(exc))
