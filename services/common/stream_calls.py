"""What the long-lived call-carrying streams (Router.RouteStream, PrefillWorker.PullKvStream) share: a call's status
as a `CallStatus` message and back into the `AioRpcError` the unary call would have raised, and ending a server's
open streams when it stops. No stream logic of its own."""

import asyncio

import grpc
from grpc_status import rpc_status

from services.common.errors import status_of
from services.common.protos import router_pb2

_CODES = {code.value[0]: code for code in grpc.StatusCode}


def code_of(value: int) -> grpc.StatusCode:
    return _CODES.get(value, grpc.StatusCode.UNKNOWN)


def refusal(code: grpc.StatusCode, message: str) -> router_pb2.CallStatus:
    """A stream's own refusal of one call (a malformed message, too many calls)."""
    return router_pb2.CallStatus(code=code.value[0], message=message)


def failure(exc: Exception) -> router_pb2.CallStatus:
    """The very status (code, text and rich detail) the unary call would end with for `exc` (services/common/errors.py)."""
    status = status_of(exc)
    return router_pb2.CallStatus(code=status.code, message=status.message, status_details=status.SerializeToString())


def as_rpc_error(status: router_pb2.CallStatus) -> grpc.aio.AioRpcError:
    """The error the unary call would have raised: the same code, text and rich detail."""
    trailing = (
        grpc.aio.Metadata((rpc_status.GRPC_DETAILS_METADATA_KEY, status.status_details))
        if status.status_details
        else grpc.aio.Metadata()
    )
    return grpc.aio.AioRpcError(code_of(status.code), grpc.aio.Metadata(), trailing, details=status.message)


async def end_all(serving: dict[asyncio.Task, grpc.aio.ServicerContext], why: str) -> None:
    """End every open stream now with UNAVAILABLE (the server is stopping): a stream held open would keep the server's
    stop waiting its whole grace period, and the client goes unary.

    NOTE: a status sent first, then the task cancelled: a cancelled handler alone leaves the call open in grpc."""
    for task, context in list(serving.items()):
        try:
            await context.abort(grpc.StatusCode.UNAVAILABLE, why)
        except Exception:  # NOTE: abort raises to its caller by design (grpc's AbortError)
            pass
        task.cancel()


async def refused_opening(call: grpc.aio.StreamStreamCall, timeout_s: float) -> tuple[grpc.StatusCode, str] | None:
    """None once the server has accepted `call` (its initial metadata came: authorized, and the method exists); else
    why not, as (code, details), the call cancelled."""
    try:
        await asyncio.wait_for(call.initial_metadata(), timeout_s)
        if call.done():  # NOTE: refused or unimplemented: the call ended before any metadata
            return await call.code(), await call.details()
    except (TimeoutError, grpc.aio.AioRpcError) as exc:
        call.cancel()
        return getattr(exc, "code", lambda: grpc.StatusCode.DEADLINE_EXCEEDED)(), "not accepted in time"
    return None
