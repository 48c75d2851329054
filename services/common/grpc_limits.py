"""Per-service gRPC server limits: message sizes, sized to what each service's largest legitimate message is. A table
only; grpc_server.GrpcServer applies it, nothing here opens a socket.

NOTE: no max_concurrent_streams: with it set (1024), the live cancellation tests failed to connect to a worker ("timed
out before receiving SETTINGS frame") in 3 of 5 runs on a loaded host, against 1 of 6 with these message limits alone
and 0 of 3 on main; left for a measured follow-up."""
from dataclasses import dataclass

MIB = 1 << 20


@dataclass(frozen=True, slots=True)
class GrpcLimits:
    max_receive_bytes: int  # a larger request fails with RESOURCE_EXHAUSTED before it is parsed
    max_send_bytes: int

    def options(self) -> list[tuple[str, int]]:
        return [("grpc.max_receive_message_length", self.max_receive_bytes),
                ("grpc.max_send_message_length", self.max_send_bytes)]


# NOTE: a request carries at most a prompt's token ids (< 5 bytes each as varints: 8 MiB is over a million tokens)
# and its block hashes; workers send large messages (PullKv chunks, a KV event snapshot of a whole cache)
LIMITS = {
    "router": GrpcLimits(max_receive_bytes=16 * MIB, max_send_bytes=8 * MIB),
    "decode": GrpcLimits(max_receive_bytes=8 * MIB, max_send_bytes=64 * MIB),
    "prefill": GrpcLimits(max_receive_bytes=8 * MIB, max_send_bytes=64 * MIB),
    "planner": GrpcLimits(max_receive_bytes=4 * MIB, max_send_bytes=4 * MIB),
}


def server_options(base: list[tuple[str, int]], service: str) -> list[tuple[str, int]]:
    """`base` with `service`'s limits in place of any shared value of the same name (one value per option)."""
    return list((dict(base) | dict(LIMITS[service].options())).items())
