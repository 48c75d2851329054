"""Container health check: exit 0 when a tandem service answers healthy, 1 otherwise (Docker's contract).

  healthcheck.py http  http://127.0.0.1:8000/ready      a 2xx answer
  healthcheck.py grpc  127.0.0.1:50051 [SERVICE]        grpc.health.v1 says SERVING ("" = the whole server)
It only asks; it never changes a service's state. gRPC goes over TLS when TANDEM_GRPC_TLS_* says so, as the
service's own channels do.
"""

import argparse
import sys
import urllib.error
import urllib.request


def check_http(url: str, timeout_s: float) -> str | None:
    """None when healthy, else why not."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as reply:
            return None if 200 <= reply.status < 300 else f"HTTP {reply.status}"
    except urllib.error.HTTPError as e:
        return f"HTTP {e.code}"
    except OSError as e:
        return f"{type(e).__name__}: {e}"


def check_grpc(address: str, service: str, timeout_s: float) -> str | None:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from services.common.grpc_server import make_sync_channel

    with make_sync_channel(address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=timeout_s
            )
        except grpc.RpcError as e:
            return f"{e.code().name}: {e.details()}"
    if reply.status != health_pb2.HealthCheckResponse.SERVING:
        return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--timeout", type=float, default=3.0, help="seconds")
    kinds = parser.add_subparsers(dest="kind", required=True)
    kinds.add_parser("http").add_argument("url")
    grpc_args = kinds.add_parser("grpc")
    grpc_args.add_argument("address")
    grpc_args.add_argument("service", nargs="?", default="")
    args = parser.parse_args(argv)
    if args.kind == "http":
        problem = check_http(args.url, args.timeout)
    else:
        problem = check_grpc(args.address, args.service, args.timeout)
    if problem is not None:
        print(f"unhealthy: {problem}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
