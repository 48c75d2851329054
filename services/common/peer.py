"""Checks that need both the caller's certificate and the request body: a worker registers, heartbeats and
deregisters only as itself. Called by servicers; the role check before them is the interceptor's."""

import logging

import grpc

from services.common.identity import describe_peer, identity_of_auth_context
from services.common.tls import process_tls

log = logging.getLogger(__name__)


async def require_worker(context: grpc.aio.ServicerContext, worker_id: str, role: str = "") -> None:
    """Abort with PERMISSION_DENIED unless the caller's certificate names `worker_id` (or is role-wide) and, when
    given, `role`. Without mutual TLS nobody has an identity, and there is nothing to check."""
    if not process_tls().is_mutual:
        return
    identity = identity_of_auth_context(context.auth_context())
    if identity is not None and identity.may_act_as(worker_id) and role in ("", identity.role):
        return
    log.warning(
        "denied: %s (%s) acting as %s worker %r", describe_peer(identity), context.peer(), role or "a", worker_id
    )
    await context.abort(
        grpc.StatusCode.PERMISSION_DENIED, f"{describe_peer(identity)} may not act as {role or 'worker'} {worker_id!r}"
    )
