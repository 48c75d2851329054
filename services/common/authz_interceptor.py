"""Per-method authorization on a gRPC server under mutual TLS: the caller's role (its verified certificate's SAN URI)
against services/common/authz.py's table, before the servicer runs. A refusal is PERMISSION_DENIED, logged with the
caller's identity and counted. It decides nothing itself, and never reads request bodies (services/common/peer.py)."""

import inspect
import logging

import grpc
from prometheus_client import Counter

from services.common import authz
from services.common.identity import Identity, describe_peer, identity_of_auth_context

log = logging.getLogger(__name__)


class AuthzInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self):
        # NOTE: no registry of its own: each service adds it to the registry its /metrics serves
        self.denied = Counter(
            "tandem_grpc_denied",
            "gRPC calls refused for the caller's role (no: no certificate)",
            ["service", "method", "role"],
            registry=None,
        )

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or authz.is_open(method):
            return handler
        return _guarded(handler, lambda context: self._check(method, context))

    async def _check(self, method: str, context: grpc.aio.ServicerContext) -> None:
        identity = identity_of_auth_context(context.auth_context())
        if authz.is_allowed(method, identity):
            return
        service, name = authz.split_method(method)
        role = identity.role if identity is not None else "none"
        self.denied.labels(service or "unknown", name or method, role).inc()
        log.warning(
            "denied %s to %s (%s): allowed roles %s",
            method,
            describe_peer(identity),
            context.peer(),
            ", ".join(sorted(authz.allowed_roles(method))) or "none",
        )
        await context.abort(grpc.StatusCode.PERMISSION_DENIED, _refusal(method, identity))


def _refusal(method: str, identity: Identity | None) -> str:
    return f"{describe_peer(identity)} may not call {method}"


def _guarded(handler: grpc.RpcMethodHandler, check) -> grpc.RpcMethodHandler:
    """The same handler, its behaviour preceded by `check(context)` (which aborts the call to refuse it)."""
    kinds = [
        ("unary_unary", grpc.unary_unary_rpc_method_handler),
        ("unary_stream", grpc.unary_stream_rpc_method_handler),
        ("stream_unary", grpc.stream_unary_rpc_method_handler),
        ("stream_stream", grpc.stream_stream_rpc_method_handler),
    ]
    for attr, make in kinds:
        behavior = getattr(handler, attr)
        if behavior is not None:
            return make(
                _wrap(behavior, check),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
    return handler


def _wrap(behavior, check):
    # NOTE: a streaming servicer is either an async generator or a coroutine that writes through its context;
    # the wrapper keeps its kind, so grpc drives it the same way
    if inspect.isasyncgenfunction(behavior):

        async def stream(request, context):
            await check(context)
            async for item in behavior(request, context):
                yield item

        return stream

    async def call(request, context):
        await check(context)
        return await behavior(request, context)

    return call
