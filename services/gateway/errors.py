"""The one place failures become OpenAI-style HTTP errors: the HTTP-only errors, the table for the one error
hierarchy (engines/base/errors.py), the gRPC status mapping, and the FastAPI exception handlers. No other module
builds an error body or picks a status."""

import asyncio
import json
import logging

import grpc
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from engines.base.errors import EngineError, InvalidRequestError, ModelNotFoundError
from engines.base.types import FinishReason
from services.common.errors import detail_of

log = logging.getLogger(__name__)
RETRY_AFTER_S = 1
CLIENT_CLOSED_STATUS = 499  # nginx's convention; only ever a metrics label, never sent


class GatewayError(Exception):
    """An error the client sees: HTTP status, OpenAI error type, and the offending parameter."""

    status = 500
    type = "server_error"
    code: str | None = None
    retry_after_s: int | None = None

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message, self.param = message, param
        if code is not None:
            self.code = code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after_s)} if self.retry_after_s is not None else {}


class AuthenticationError(GatewayError):
    status, type, code = 401, "authentication_error", "invalid_api_key"


class RouteNotFoundError(GatewayError):
    status, type, code = 404, "invalid_request_error", "not_found"


class MethodNotAllowedError(GatewayError):
    status, type, code = 405, "invalid_request_error", "method_not_allowed"


class RequestTooLargeError(GatewayError):
    status, type, code = 413, "invalid_request_error", "request_too_large"


class ContextLengthError(RequestTooLargeError):
    code = "context_length_exceeded"


class RateLimitError(GatewayError):
    status, type, code, retry_after_s = 429, "rate_limit_error", "rate_limit_exceeded", RETRY_AFTER_S


class NoWorkerError(GatewayError):
    status, type, code, retry_after_s = 503, "service_unavailable_error", "no_worker_available", RETRY_AFTER_S


class AllWorkersBusyError(NoWorkerError):
    code = "workers_busy"


class WorkerFailedError(GatewayError):
    status, type, code, retry_after_s = 503, "service_unavailable_error", "worker_failed", RETRY_AFTER_S


class GatewayTimeoutError(GatewayError):
    status, type, code = 504, "timeout_error", "timeout"


class ClientDisconnected(Exception):
    """The client went away; the work is cancelled and nothing is sent."""


# the one hierarchy's errors as the client sees them: (kind, HTTP status, OpenAI type, code), first match wins
_HTTP: list[tuple[type[EngineError], int, str, str | None]] = [
    (ModelNotFoundError, 404, "invalid_request_error", "model_not_found"),
    (InvalidRequestError, 400, "invalid_request_error", None),
]
_INVALID = (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.OUT_OF_RANGE)


def as_gateway_error(exc: BaseException) -> GatewayError | None:
    """The HTTP error `exc` is, when it is one the table or a GatewayError names; None otherwise."""
    if isinstance(exc, GatewayError):
        return exc
    for kind, status, error_type, code in _HTTP:
        if isinstance(exc, kind):
            err = GatewayError(str(exc), param=exc.param, code=code)
            err.status, err.type = status, error_type
            return err
    return None


_UNAVAILABLE = (
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.ABORTED,
)


def from_rpc_error(err: grpc.aio.AioRpcError, what: str) -> GatewayError:
    """Map a failed call to the router ("route") or a worker ("worker") to the client's error."""
    code, detail = err.code(), err.details() or err.code().name
    if code in _INVALID:  # the structured detail names the field at fault, when the server knew it
        return InvalidRequestError(detail, param=getattr(detail_of(err), "param", None))
    if what == "route" and code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return AllWorkersBusyError(f"every worker is busy: {detail}")
    if what == "route" and code == grpc.StatusCode.DEADLINE_EXCEEDED:  # the router stayed away that long
        return NoWorkerError(f"the router did not answer in time: {detail}")
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return GatewayTimeoutError(f"{what} timed out: {detail}")
    if code in _UNAVAILABLE:
        kind = NoWorkerError if what == "route" else WorkerFailedError
        return kind(f"{what} unavailable: {detail}")
    return GatewayError(f"{what} failed ({code.name}): {detail}")


def from_worker_finish(finish: FinishReason | None, detail: str = "") -> GatewayError:
    """A stream the worker ended with ABORT (it gave the request up: retry elsewhere) or ERROR; a failure with
    its reason crosses as a gRPC status instead (from_rpc_error)."""
    if finish == FinishReason.ABORT:
        return WorkerFailedError(f"the worker aborted the request{': ' + detail if detail else ''}")
    return GatewayError(f"the worker failed the request: {detail or 'unknown error'}")


def from_validation_errors(errors: list[dict]) -> InvalidRequestError:
    """The first pydantic error, worded like OpenAI's, naming the parameter it is about."""
    first = errors[0]
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    param, where = (loc[0] if loc else None), ".".join(loc)  # param: the top-level field, as OpenAI's
    if first.get("type") == "extra_forbidden":
        return InvalidRequestError(f"Unrecognized request argument supplied: {where}", param=param)
    if first.get("type") == "json_invalid":
        return InvalidRequestError("We could not parse the JSON body of your request.")
    message = first.get("msg", "invalid request")
    return InvalidRequestError(f"{where}: {message}" if where else message, param=param)


def response_for(exc: GatewayError | EngineError) -> JSONResponse:
    err = as_gateway_error(exc) or GatewayError("internal error")
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers())


def sse_error_data(exc: BaseException) -> str:
    """The `data:` payload of the last event of a stream that failed after it started."""
    return json.dumps((as_gateway_error(exc) or GatewayError("internal error")).body())


def status_of(exc: BaseException) -> int:
    err = as_gateway_error(exc)
    if err is not None:
        return err.status
    return CLIENT_CLOSED_STATUS if isinstance(exc, (ClientDisconnected, asyncio.CancelledError)) else 500


def install_handlers(app: FastAPI) -> None:
    app.add_exception_handler(GatewayError, _on_gateway_error)
    app.add_exception_handler(EngineError, _on_gateway_error)
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(HTTPException, _on_http_exception)
    app.add_exception_handler(ClientDisconnected, _on_client_gone)
    app.add_exception_handler(Exception, _on_unexpected)


async def _on_gateway_error(request: Request, exc: GatewayError | EngineError) -> JSONResponse:
    return response_for(exc)


async def _on_validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    return response_for(from_validation_errors(list(exc.errors())))


async def _on_http_exception(request: Request, exc: HTTPException) -> JSONResponse:
    if exc.status_code == 404:
        return response_for(RouteNotFoundError(f"no route {request.method} {request.url.path}"))
    if exc.status_code == 405:
        return response_for(MethodNotAllowedError(f"method {request.method} not allowed on {request.url.path}"))
    err = GatewayError(str(exc.detail))
    err.status = exc.status_code
    return response_for(err)


async def _on_client_gone(request: Request, exc: ClientDisconnected) -> Response:
    return Response(status_code=CLIENT_CLOSED_STATUS)  # nobody reads it; it only ends the ASGI cycle


async def _on_unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    return response_for(GatewayError("internal error"))
