"""CPU cost of one gRPC unary call and of one server-streamed message on loopback, mutual TLS against plaintext
(issue 24's relay ratio: which calls carry the secure stack's extra CPU). A bytes echo server runs in a child process;
both processes' CPU time is read around each phase. Measures only: run it under the bench lock for figures.
With `--authz`, two more mTLS modes: the handlers guarded once at registration (services/common/authz_guard.py, what
tandem runs) and the same check made through a grpc server interceptor, per call (what tandem ran before).

    python bench/grpc_call_cost.py --calls 4000 --messages 40000 --json bench/results/grpc_call_cost.json
"""

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc

SERVICE = "bench.Echo"
PAYLOAD = b"x" * 48  # about one GenerateResponse carrying a token, or a small unary request
CONCURRENCY = 16
MODES_NO_CHECK = ("mtls", "plain")


def _handlers() -> grpc.GenericRpcHandler:
    async def unary(request: bytes, context) -> bytes:
        return request

    async def stream(request: bytes, context):
        for _ in range(int(request)):
            yield PAYLOAD

    async def cpu(request: bytes, context) -> bytes:
        return str(time.process_time()).encode()

    return grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "Unary": grpc.unary_unary_rpc_method_handler(unary),
            "Stream": grpc.unary_stream_rpc_method_handler(stream),
            "Cpu": grpc.unary_unary_rpc_method_handler(cpu),
        },
    )


class _PerCallInterceptor(grpc.aio.ServerInterceptor):
    """The check through grpc's interceptor chain: a guarded handler made for every call."""

    def __init__(self, guard):
        self.guard = guard

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        return None if handler is None else self.guard.guard(handler_call_details.method, handler)


def _server(authz: str):
    """The echo server: plain, or with the authorization check `authz` ("guard" or "interceptor")."""
    if not authz:
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((_handlers(),))
        return server
    from services.common import authz as table
    from services.common.authz_guard import AuthzGuard

    table.TABLE[SERVICE] = {
        method: frozenset({"gateway"}) for method in ("Unary", "Stream", "Cpu")
    }  # the client's role
    guard = AuthzGuard()
    if authz == "interceptor":
        server = grpc.aio.server(interceptors=[_PerCallInterceptor(guard)])
        server.add_generic_rpc_handlers((_handlers(),))
        return server
    server = grpc.aio.server()
    guard.server(server).add_generic_rpc_handlers((_handlers(),))
    return server


async def serve(port_file: str, certs: str, authz: str) -> None:
    server = _server(authz)
    if certs:
        d = Path(certs)
        creds = grpc.ssl_server_credentials(
            [((d / "server.key").read_bytes(), (d / "server.crt").read_bytes())],
            root_certificates=(d / "ca.crt").read_bytes(),
            require_client_auth=True,
        )
        port = server.add_secure_port("127.0.0.1:0", creds)
    else:
        port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    Path(port_file).write_text(str(port))
    await server.wait_for_termination()


def write_certs(directory: Path) -> None:
    """A CA and two ECDSA P-256 leaves, as tandem's own certificates (tandem/certs/pki.py)."""
    from services.common.identity import Identity
    from tandem.certs import pki

    authority = pki.new_authority()
    (directory / "ca.crt").write_bytes(authority.cert_pem)
    for name, role in (("server", "router"), ("client", "gateway")):
        cert, key = pki.issue(authority, Identity(role, f"{role}-0"))
        (directory / f"{name}.crt").write_bytes(cert)
        (directory / f"{name}.key").write_bytes(key)


def _channel(port: int, certs: str) -> grpc.aio.Channel:
    if not certs:
        return grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    d = Path(certs)
    creds = grpc.ssl_channel_credentials(
        (d / "ca.crt").read_bytes(), (d / "client.key").read_bytes(), (d / "client.crt").read_bytes()
    )
    return grpc.aio.secure_channel(f"127.0.0.1:{port}", creds, options=[("grpc.ssl_target_name_override", "tandem")])


async def _phase(channel: grpc.aio.Channel, kind: str, total: int) -> None:
    """`total` unary calls, or `total` streamed messages, spread over CONCURRENCY concurrent callers."""
    unary = channel.unary_unary(f"/{SERVICE}/Unary")
    stream = channel.unary_stream(f"/{SERVICE}/Stream")
    per_caller = total // CONCURRENCY

    async def caller() -> None:
        if kind == "unary":
            for _ in range(per_caller):
                await unary(PAYLOAD)
        else:  # streams of 128 messages, as a request's output
            for _ in range(per_caller // 128):
                async for _msg in stream(b"128"):
                    pass

    await asyncio.gather(*(caller() for _ in range(CONCURRENCY)))


async def measure(port: int, certs: str, calls: int, messages: int) -> dict[str, float]:
    channel = _channel(port, certs)
    cpu = channel.unary_unary(f"/{SERVICE}/Cpu")
    await _phase(channel, "unary", 256)  # warm-up: the handshake and the first calls out of the figures
    result = {}
    for kind, total in (("unary", calls), ("stream", messages)):
        server_before, client_before, wall_before = float(await cpu(b"")), time.process_time(), time.perf_counter()
        await _phase(channel, kind, total)
        wall, client = time.perf_counter() - wall_before, time.process_time() - client_before
        server = float(await cpu(b"")) - server_before
        done = (
            total // CONCURRENCY * CONCURRENCY if kind == "unary" else total // CONCURRENCY // 128 * 128 * CONCURRENCY
        )
        result[f"{kind}_client_us"] = client / done * 1e6
        result[f"{kind}_server_us"] = server / done * 1e6
        result[f"{kind}_wall_us"] = wall / done * 1e6
    await channel.close()
    return result


def run_mode(certs: str, calls: int, messages: int, authz: str = "") -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        port_file = Path(tmp) / "port"
        serve_args = ["--serve", str(port_file), "--certs", certs, "--serve-authz", authz]
        child = subprocess.Popen([sys.executable, __file__, *serve_args])
        try:
            deadline = time.monotonic() + 30
            while not port_file.exists() or not port_file.read_text():
                if time.monotonic() > deadline or child.poll() is not None:
                    raise RuntimeError("echo server did not start")
                time.sleep(0.05)
            return asyncio.run(measure(int(port_file.read_text()), certs, calls, messages))
        finally:
            child.terminate()
            child.wait(10)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=4000)
    parser.add_argument("--messages", type=int, default=40960)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", default="")
    parser.add_argument("--serve", default="", help=argparse.SUPPRESS)
    parser.add_argument("--authz", action="store_true", help="also mTLS with the check: guarded handlers, interceptor")
    parser.add_argument("--certs", default="", help=argparse.SUPPRESS)
    parser.add_argument("--serve-authz", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(serve(args.serve, args.certs, args.serve_authz))
        return 0
    modes = ("mtls", "guard", "interceptor", "plain") if args.authz else ("mtls", "plain")
    with tempfile.TemporaryDirectory() as certs:
        write_certs(Path(certs))
        rounds = [
            {
                mode: run_mode(
                    "" if mode == "plain" else certs, args.calls, args.messages, "" if mode in MODES_NO_CHECK else mode
                )
                for mode in (modes if r % 2 == 0 else modes[::-1])
            }
            for r in range(args.rounds)
        ]
    report = {
        "calls": args.calls,
        "messages": args.messages,
        "concurrency": CONCURRENCY,
        "payload_bytes": len(PAYLOAD),
        "rounds": rounds,
        "median": _medians(rounds),
    }
    _print(report["median"])
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0


def _medians(rounds: list[dict]) -> dict[str, dict[str, float]]:
    def median(values: list[float]) -> float:
        values = sorted(values)
        mid = len(values) // 2
        return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2

    return {mode: {key: median([r[mode][key] for r in rounds]) for key in rounds[0][mode]} for mode in rounds[0]}


def _print(median: dict[str, dict[str, float]]) -> None:
    print("| per | CPU us client, mTLS / plain | CPU us server, mTLS / plain | both, extra under mTLS |")
    print("|---|---|---|---|")
    for kind, label in (("unary", "unary call"), ("stream", "streamed message")):
        m, p = median["mtls"], median["plain"]
        extra = m[f"{kind}_client_us"] + m[f"{kind}_server_us"] - p[f"{kind}_client_us"] - p[f"{kind}_server_us"]
        print(
            f"| {label} | {m[f'{kind}_client_us']:.1f} / {p[f'{kind}_client_us']:.1f} | "
            f"{m[f'{kind}_server_us']:.1f} / {p[f'{kind}_server_us']:.1f} | {extra:+.1f} |"
        )
    for mode in ("guard", "interceptor"):
        if mode in median:
            extra = {k: median[mode][f"{k}_server_us"] - median["mtls"][f"{k}_server_us"] for k in ("unary", "stream")}
            print(
                f"server CPU over mTLS alone, {mode}: {extra['unary']:+.1f} us a call, {extra['stream']:+.1f} a message"
            )


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
