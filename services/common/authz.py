"""Who may call what: the one table from every tandem gRPC method to the roles whose certificates may call it.
Pure: no grpc, no I/O. services/common/authz_guard.py enforces it; a method missing here
is refused to everyone, and a unit test fails for any RPC in the protos without an entry."""

from services.common.identity import Identity

GATEWAY, ROUTER, PREFILL, DECODE, PLANNER, OPERATOR = "gateway", "router", "prefill", "decode", "planner", "operator"
WORKERS = frozenset({PREFILL, DECODE})
ADMINS = frozenset({PLANNER, OPERATOR})

# NOTE: worker_id binding (a worker registers only as itself) needs the request body: the router's servicer checks
# it (services/common/peer.py), this table only admits the role
TABLE: dict[str, dict[str, frozenset[str]]] = {
    "tandem.v1.Router": {
        "Register": WORKERS,
        "Heartbeat": WORKERS,
        "Deregister": WORKERS,
        "Route": frozenset({GATEWAY}),
        "Complete": frozenset({GATEWAY}),
        "ReportFailure": frozenset({GATEWAY}),
        "RouteStream": frozenset({GATEWAY}),  # the three above as messages: checked once, when the stream opens
        # the gateway's readiness, the planner's census, a worker's preStop drain (tandem worker drain)
        "ListWorkers": frozenset({GATEWAY, PREFILL, DECODE}) | ADMINS,
        "GetTraffic": ADMINS,
    },
    "tandem.v1.PrefillWorker": {
        "Prefill": frozenset({GATEWAY}),
        "PullKv": frozenset({DECODE}),
        "PullKvStream": frozenset({DECODE}),  # PullKv as messages: checked once, when the stream opens
        "ReleaseKv": frozenset({DECODE, GATEWAY}),  # the gateway releases the lease of a request it gave up
    },
    "tandem.v1.DecodeWorker": {
        "Generate": frozenset({GATEWAY}),
    },
    "tandem.v1.WorkerControl": {
        "Abort": frozenset({GATEWAY}) | ADMINS,  # the gateway aborts what a vanished client left running
        "GetStats": ADMINS,
        "StreamKvEvents": frozenset({ROUTER, OPERATOR}),
        "StreamLoad": frozenset({ROUTER, OPERATOR}),
        "ResetPrefixCache": ADMINS,
    },
    "tandem.v1.Planner": {
        "GetPlan": ADMINS,
    },
    "grpc.reflection.v1alpha.ServerReflection": {
        "ServerReflectionInfo": frozenset({OPERATOR}),
    },
}
# NOTE: open to every caller, certificate or not: orchestrators' probes (Docker, kubelet) carry none
OPEN_SERVICES = frozenset({"grpc.health.v1.Health"})


def split_method(full_method: str) -> tuple[str, str]:
    """ "/tandem.v1.Router/Register" -> ("tandem.v1.Router", "Register"); ("", "") for anything else."""
    parts = full_method.split("/")
    return (parts[1], parts[2]) if len(parts) == 3 and parts[0] == "" else ("", "")


def is_open(full_method: str) -> bool:
    return split_method(full_method)[0] in OPEN_SERVICES


def is_allowed(full_method: str, identity: Identity | None) -> bool:
    """Whether a caller holding `identity` (None: no tandem certificate) may call `full_method`."""
    service, method = split_method(full_method)
    if service in OPEN_SERVICES:
        return True
    if identity is None:
        return False
    return identity.role in TABLE.get(service, {}).get(method, frozenset())


def allowed_roles(full_method: str) -> frozenset[str]:
    service, method = split_method(full_method)
    return TABLE.get(service, {}).get(method, frozenset())
