"""`tandem bench kv`: KV transfer between two worker processes at real sizes. A real prefill worker (sim engine
with a paged cache of `--kv-bytes-per-token`, no router needed) prefills `--tokens`-token prompts and holds their
KV; this process plays the decode worker and moves each request's KV the way a decode worker does: a NIXL READ
of the held blocks into its own registered cache (the KvMover a decode engine runs), and, beside it, the gRPC
fallback (PullKv streamed into a shared-memory staging region by the decode worker's KvPuller). With signing on,
the worker signs each handle and this side verifies it as a decode worker does before moving anything (`--signing
off,on` measures both in one run). Prints a table and writes JSON; the anchor is the target (>= 2 GB/s for NIXL
on CPU), and unsigned transfers when both are measured."""

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

TARGET_GB_S = 2.0


@dataclass(frozen=True)
class KvResult:
    transport: str
    is_signed: bool
    num_requests: int
    bytes_per_request: int
    seconds_p50: float
    gb_per_s: float  # all bytes over all seconds


def add_kv_command(sub) -> None:
    p = sub.add_parser("kv", help="KV transfer between two worker processes: NIXL vs the gRPC fallback")
    p.add_argument("--tokens", type=int, default=2000, help="prompt tokens per request")
    p.add_argument("--kv-bytes-per-token", type=int, default=131072, help="default: Llama-3.1-8B in bf16")
    p.add_argument("--num-requests", type=int, default=8)
    p.add_argument("--cache-mb", type=int, default=1024, help="each side's paged cache")
    p.add_argument("--transports", default="nixl,grpc")
    p.add_argument(
        "--signing",
        default="on",
        help="on (as deployed), off, or a list such as off,on,off,on to "
        "compare: signed and verified handles against unsigned ones",
    )
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    p.set_defaults(func=run_kv_bench)


def run_kv_bench(args: argparse.Namespace) -> int:
    modes = [{"on": True, "off": False}[m] for m in args.signing.split(",")]
    results = [asyncio.run(measure(args, t, signed)) for signed in modes for t in args.transports.split(",")]
    print(table(results))
    ratios = signed_ratios(results)
    if ratios:
        print("signed / unsigned GB/s: " + ", ".join(f"{t} {r:.3f}" for t, r in ratios.items()))
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                {
                    "target_gb_per_s": TARGET_GB_S,
                    "results": [asdict(r) for r in results],
                    "signed_over_unsigned": ratios,
                    "args": {k: str(v) for k, v in vars(args).items() if k != "func"},
                },
                indent=2,
            )
        )
    return 0


async def measure(args: argparse.Namespace, transport: str, is_signed: bool = True) -> KvResult:
    from engines.transfer.nixl_link import is_available

    if transport == "nixl" and not is_available():
        raise SystemExit("tandem bench kv: NIXL is not installed")
    with tempfile.TemporaryDirectory() as tmp:
        key = os.urandom(32) if is_signed else None
        worker, address = start_prefill_worker(args, transport, Path(tmp), key)
        try:
            return await transfer_all(args, transport, address, key)
        finally:
            worker.terminate()
            worker.wait(30)


def start_prefill_worker(args, transport: str, tmp: Path, key: bytes | None = None) -> tuple[subprocess.Popen, str]:
    from tandem.launcher import free_port
    from tandem.models.init import init_model

    model = init_model(tmp / "model", "llama", tiny=True, config_only=True)
    port = free_port()
    env = {
        **os.environ,
        "TANDEM_KV_TRANSPORT": transport,
        "TANDEM_WORKER_SIM_KV_CACHE_MB": str(args.cache_mb),
        "TANDEM_WORKER_SIM_KV_BYTES_PER_TOKEN": str(args.kv_bytes_per_token),
        "TANDEM_WORKER_KV_STAGING_MB": str(args.cache_mb),
    }
    env.pop("TANDEM_KV_SIGNING_KEY_FILE", None)
    if key is not None:
        (tmp / "kv-signing.key").write_text(key.hex())
        env["TANDEM_KV_SIGNING_KEY_FILE"] = str(tmp / "kv-signing.key")
    cmd = [
        sys.executable,
        "-m",
        "tandem.cli",
        "serve",
        "prefill",
        "--engine",
        "sim",
        "--model",
        str(model),
        "--port",
        str(port),
        "--router-address",
        f"127.0.0.1:{free_port()}",
        "--sim-time-factor",
        "0",
    ]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, f"127.0.0.1:{port}"


async def transfer_all(args, transport: str, address: str, key: bytes | None = None) -> KvResult:
    import grpc

    from services.common.grpc_server import make_channel
    from services.common.protos import common_pb2, worker_pb2, worker_pb2_grpc

    channel = make_channel(address)
    await asyncio.wait_for(channel.channel_ready(), 120)
    stub = worker_pb2_grpc.PrefillWorkerStub(channel)
    side = DecodeSide(args, transport, key)
    seconds, num_bytes = [], 0
    try:
        for i in range(args.num_requests):
            tokens = [(i * 7919 + j * 31) % 500 + 10 for j in range(args.tokens)]
            reply = await stub.Prefill(
                worker_pb2.PrefillRequest(
                    req_id=f"kv{i}", token_ids=tokens, params=common_pb2.SamplingParams(max_tokens=2)
                ),
                timeout=120,
            )
            # NOTE: a decode worker's request holds the prompt and the first token the prefill worker sampled
            took, n = await side.move(reply.kv, tuple(tokens), (*tokens, reply.first_token_id))
            seconds.append(took)
            num_bytes += n
            await stub.ReleaseKv(worker_pb2.ReleaseKvRequest(req_id=f"kv{i}"), timeout=10)
    except grpc.aio.AioRpcError as exc:
        raise SystemExit(f"tandem bench kv: the prefill worker failed: {exc.code().name} {exc.details()}") from exc
    finally:
        side.close()
        await channel.close()
    seconds.sort()
    return KvResult(
        transport,
        key is not None,
        len(seconds),
        num_bytes // len(seconds),
        seconds[len(seconds) // 2],
        num_bytes / sum(seconds) / 1e9,
    )


class DecodeSide:
    """What a decode worker runs to receive KV: its engine's mover (NIXL) or its front's puller (gRPC)."""

    def __init__(self, args, transport: str, key: bytes | None = None):
        from engines.sim.kv_payload import SimKvCache, payload_layout
        from engines.transfer.budget import StagingBudget
        from engines.transfer.mover import KvMover
        from services.common.kv_signing import KvVerifier
        from services.decode.kv_gate import KvGate
        from services.decode.kv_import import KvPuller

        self.transport = transport
        # NOTE: no router here; a decode worker's registry check is a set lookup (ListWorkers is cached)
        self.gate = KvGate(KvVerifier(key), None) if key is not None else None
        layout = payload_layout(args.kv_bytes_per_token, 64)
        num_blocks = (args.cache_mb << 20) // (args.kv_bytes_per_token * 64)
        if transport == "nixl":
            self.cache = SimKvCache(layout, num_blocks, prefault=True)
            self.mover = KvMover(self.cache, layout, "nixl")
        else:
            self.staging, self.puller = StagingBudget(args.cache_mb << 20, "tandem-kv-bench"), KvPuller()

    async def move(self, handle, tokens: tuple[int, ...], request_tokens: tuple[int, ...]) -> tuple[float, int]:
        """(seconds, bytes) to bring one request's KV here: `tokens` the prompt the handle signs, `request_tokens`
        what the decode worker's request holds (the prompt and the first token)."""
        from engines.core.loads import KvLoad
        from engines.core.loop import LOAD_WAIT_S
        from engines.transfer.paged import staging_nbytes
        from services.common.convert import layout_from_pb

        num_bytes = staging_nbytes(layout_from_pb(handle.layout), handle.num_blocks)
        start = time.perf_counter()
        if self.gate is not None:
            await self.gate.admit(handle, tokens)
        if self.transport == "nixl":
            source = self.mover.source(handle.engine_params)
            self.mover.start_load(KvLoad(handle.req_id, tuple(range(handle.num_blocks)), handle.num_tokens, source))
            while not (done := self.mover.poll_loads()):
                await asyncio.sleep(LOAD_WAIT_S)  # NOTE: as often as an engine loop with only loads polls them
            if not done[0].ok:
                raise SystemExit(f"tandem bench kv: NIXL READ failed: {done[0].error}")
            return time.perf_counter() - start, num_bytes
        offset = await self.staging.acquire(layout_from_pb(handle.layout), handle.num_blocks, 30)
        try:
            await self.puller.pull_staged(handle, request_tokens, self.staging, offset)
        finally:
            self.staging.release(offset)
        return time.perf_counter() - start, num_bytes

    def close(self) -> None:
        if self.transport != "nixl":
            self.staging.close()


def signed_ratios(results: list[KvResult]) -> dict[str, float]:
    """Per transport measured both ways: mean signed GB/s over mean unsigned GB/s (the anchor); `--signing
    off,on,off,on` alternates the two, so a change in the host's load weighs on both."""
    by: dict[tuple[str, bool], list[float]] = {}
    for r in results:
        by.setdefault((r.transport, r.is_signed), []).append(r.gb_per_s)
    mean = {k: sum(v) / len(v) for k, v in by.items()}
    return {t: mean[(t, True)] / mean[(t, False)] for t, signed in mean if signed and (t, False) in mean}


def table(results: list[KvResult]) -> str:
    lines = [
        f"{'transport':<10}{'signed':>7}{'requests':>9}{'MB/request':>12}{'p50 s':>9}{'GB/s':>8}  target >= {TARGET_GB_S} GB/s (NIXL)"
    ]
    for r in results:
        verdict = ("meets" if r.gb_per_s >= TARGET_GB_S else "below") if r.transport == "nixl" else ""
        lines.append(
            f"{r.transport:<10}{'yes' if r.is_signed else 'no':>7}{r.num_requests:>9}{r.bytes_per_request / 1e6:>12.1f}{r.seconds_p50:>9.3f}"
            f"{r.gb_per_s:>8.2f}  {verdict}"
        )
    return "\n".join(lines)
