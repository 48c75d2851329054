"""Per-method authorization on a gRPC server under mutual TLS: the caller's role (its verified certificate's SAN URI)
against services/common/authz.py's table, before the servicer runs. Each method's handler is wrapped once, when it
is registered, not per call through grpc's interceptor chain. A refusal is PERMISSION_DENIED, logged with the
caller's identity and counted. It decides nothing itself, and never reads request bodies (services/common/peer.py)."""

import inspect
import logging
from collections.abc import Iterable, Mapping

import grpc
from prometheus_client import Counter

from services.common import authz
from services.common.identity import Identity, describe_peer, identity_of_auth_context

log = logging.getLogger(__name__)


class AuthzGuard:
    """Guards method handlers with the role table; `server(raw)` is what servicers register on."""

    def __init__(self):
        # NOTE: no registry of its own: each service adds it to the registry its /metrics serves
        self.denied = Counter(
            "tandem_grpc_denied",
            "gRPC calls refused for the caller's role (no: no certificate)",
            ["service", "method", "role"],
            registry=None,
        )

    def server(self, raw: grpc.aio.Server) -> "GuardedServer":
        return GuardedServer(raw, self)

    def guard(self, method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        """`handler` for the full method name `method`, its behaviour preceded by the check (open methods as they are)."""
        if authz.is_open(method):
            return handler

        async def check(context: grpc.aio.ServicerContext) -> None:
            await self._check(method, context)

        return _guarded(handler, check)

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


class GuardedServer:
    """The aio server as the generated `add_*Servicer_to_server` functions see it: every handler they register,
    registered or generic, is guarded first. Anything else is the server's own (ports, start, stop).
    NOTE: the one object servicers register on, so no handler can reach the server unguarded."""

    def __init__(self, raw: grpc.aio.Server, guard: AuthzGuard):
        self._raw = raw
        self._guard = guard

    def add_registered_method_handlers(self, service: str, handlers: Mapping[str, grpc.RpcMethodHandler]) -> None:
        guarded = {name: self._guard.guard(f"/{service}/{name}", h) for name, h in handlers.items()}
        self._raw.add_registered_method_handlers(service, guarded)

    def add_generic_rpc_handlers(self, handlers: Iterable[grpc.GenericRpcHandler]) -> None:
        self._raw.add_generic_rpc_handlers(tuple(_GuardedGeneric(h, self._guard) for h in handlers))

    def __getattr__(self, name: str):
        return getattr(self._raw, name)


class _GuardedGeneric(grpc.GenericRpcHandler):
    """A generic handler whose answers are guarded; each method's guarded handler is made once and kept."""

    def __init__(self, inner: grpc.GenericRpcHandler, guard: AuthzGuard):
        self._inner = inner
        self._guard = guard
        self._made: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    def service(self, handler_call_details):
        handler = self._inner.service(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        made = self._made.get(method)
        if made is None or made[0] is not handler:  # NOTE: only methods the inner handler knows are kept
            made = self._made[method] = (handler, self._guard.guard(method, handler))
        return made[1]


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
