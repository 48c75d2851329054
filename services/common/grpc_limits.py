"""Per-service gRPC server limits: message sizes, sized to what each service's largest legitimate message is, and how
many calls one connection and the whole server may hold at once, sized far above legitimate concurrency (a bound on
what a certified but misbehaving peer can pin, not a load limit: admission is the gateway's). A table only;
grpc_server.GrpcServer applies it, nothing here opens a socket.

NOTE: one gateway multiplexes every stream to a worker over one connection, up to its --max-inflight (256 by default,
1024 in the chaos runs): the per-connection stream limit must stay above any gateway's, or its streams would queue
inside HTTP/2 instead of being refused by admission with a 429. An earlier attempt at 1024 coincided with flaky
connects in the cancellation tests on a loaded host; these values are 4x that."""

from dataclasses import dataclass

MIB = 1 << 20


@dataclass(frozen=True, slots=True)
class GrpcLimits:
    max_receive_bytes: int  # a larger request fails with RESOURCE_EXHAUSTED before it is parsed
    max_send_bytes: int
    max_streams_per_connection: int = 4096  # HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS: one peer's calls at once
    max_concurrent_rpcs: int = 16384  # every peer's: past it a new call gets RESOURCE_EXHAUSTED at once

    def options(self) -> list[tuple[str, int]]:
        return [
            ("grpc.max_receive_message_length", self.max_receive_bytes),
            ("grpc.max_send_message_length", self.max_send_bytes),
            ("grpc.max_concurrent_streams", self.max_streams_per_connection),
        ]


# NOTE: a request carries at most a prompt's token ids (< 5 bytes each as varints: 8 MiB is over a million tokens)
# and its block hashes; workers send large messages (PullKv chunks, a KV event snapshot of a whole cache)
LIMITS = {
    "router": GrpcLimits(max_receive_bytes=16 * MIB, max_send_bytes=8 * MIB),
    "decode": GrpcLimits(max_receive_bytes=8 * MIB, max_send_bytes=64 * MIB),
    "prefill": GrpcLimits(max_receive_bytes=8 * MIB, max_send_bytes=64 * MIB),
    # the planner's callers are the operator and its own scaler: a handful of calls
    "planner": GrpcLimits(
        max_receive_bytes=4 * MIB, max_send_bytes=4 * MIB, max_streams_per_connection=256, max_concurrent_rpcs=1024
    ),
}


def server_options(base: list[tuple[str, int]], service: str) -> list[tuple[str, int]]:
    """`base` with `service`'s limits in place of any shared value of the same name (one value per option)."""
    return list((dict(base) | dict(LIMITS[service].options())).items())


def max_concurrent_rpcs(service: str) -> int | None:
    """The server-wide call limit of `service` (None: grpc's default, unlimited)."""
    return LIMITS[service].max_concurrent_rpcs if service else None
