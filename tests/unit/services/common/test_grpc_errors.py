"""Errors cross gRPC as a status code plus a structured detail, and the gateway reads the detail back."""

import grpc
import pytest
from grpc_status import rpc_status

from engines.base.errors import EngineDiedError, EngineError, InvalidRequestError
from services.common.errors import ErrorDetail, detail_of, status_of
from services.gateway import errors as http_errors


def _failed_call(status: grpc.Status) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(
        status.code, grpc.aio.Metadata(), grpc.aio.Metadata(*status.trailing_metadata), status.details
    )


@pytest.mark.parametrize(
    "exc,code,detail",
    [
        (
            InvalidRequestError("bad grammar", param="response_format"),
            grpc.StatusCode.INVALID_ARGUMENT,
            ErrorDetail("InvalidRequestError", "response_format"),
        ),
        (EngineDiedError("gone"), grpc.StatusCode.UNAVAILABLE, ErrorDetail("EngineDiedError")),
        (EngineError("engine blew up"), grpc.StatusCode.INTERNAL, ErrorDetail("EngineError")),
    ],
)
def test_a_typed_error_crosses_as_its_code_and_detail(exc, code, detail):
    call = _failed_call(rpc_status.to_status(status_of(exc)))
    assert (call.code(), call.details(), detail_of(call)) == (code, str(exc), detail)


def test_a_call_without_a_detail_has_none():
    call = grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), "reset")
    assert detail_of(call) is None


def test_the_gateway_names_the_field_the_worker_refused():
    call = _failed_call(rpc_status.to_status(status_of(InvalidRequestError("bad", param="response_format"))))
    err = http_errors.as_gateway_error(http_errors.from_rpc_error(call, "decode worker"))
    assert (err.status, err.type, err.param, err.message) == (400, "invalid_request_error", "response_format", "bad")
    internal = http_errors.from_rpc_error(
        _failed_call(rpc_status.to_status(status_of(EngineError("boom")))), "decode worker"
    )
    assert (internal.status, internal.message) == (500, "decode worker failed (INTERNAL): boom")
