"""What every worker serves (the WorkerControl service: abort, stats, KV events, prefix-cache reset) and the serve
loop (engine process, gRPC server, router registration, health, drain on SIGTERM). Prefill and decode workers add
their own service; a worker whose engine died reports NOT_SERVING and leaves the router."""

import asyncio
import contextlib
import functools
import inspect
import logging
import sys
import time
from pathlib import Path

import grpc

from engines.base import Engine, EngineRequest, EngineUnavailableError, ModelNotFoundError, SamplingParams
from engines.base.block_hash import chain_root
from engines.transfer import transports
from services.common.convert import layout_to_pb, load_to_pb, role_to_pb
from services.common.drain import Drain
from services.common.engine_factory import make_engine
from services.common.errors import abort_with
from services.common.grpc_server import GrpcServer, run_until_signal
from services.common.kv_events import kv_event_batches, load_changes
from services.common.logs import request_id
from services.common.metrics import MetricsEndpoint, WorkerMetrics
from services.common.protos import common_pb2, router_pb2, worker_pb2, worker_pb2_grpc
from services.common.registration import Registrars
from services.common.roles import WorkerRole
from services.common.settings import SettingsError
from services.common.tls import process_tls
from services.common.worker_settings import WorkerSettings

log = logging.getLogger(__name__)
CONTROL_SERVICE = worker_pb2.DESCRIPTOR.services_by_name["WorkerControl"].full_name
SETTLE_S = 1.0  # after deregistering: longer than a route's way to the worker (not a long remote prefill)
HAND_BACK_GRACE_S = 2.0  # for the streams handed back to say so before the server closes
LOAD_STREAM_INTERVAL_S = 0.01  # StreamLoad: how often the load is compared with the last one sent
# per role: the observed RPCs and the KV transfer direction whose series exist (at 0) from start-up
_ZERO_SERIES = {
    WorkerRole.PREFILL: (("Prefill", "PullKv"), ("export",)),
    WorkerRole.DECODE: (("Generate",), ("import",)),
}


def _transport_label(role: WorkerRole, engine) -> str:
    """How this worker's KV transfers are labelled: a prefill worker serves PullKv ("grpc" through staging memory,
    "bytes" otherwise; NIXL READs are the decode worker's); a decode worker reads with its engine's transport."""
    transport = engine.capabilities.kv_transport
    if role is WorkerRole.PREFILL and transport == transports.NIXL:
        return transports.STAGING
    return transports.BYTES if transport == transports.TRTLLM else transport


class WorkerService(worker_pb2_grpc.WorkerControlServicer):
    """The shared half; a subclass names its role and its own gRPC service (`service_name`, `add_to`)."""

    role: WorkerRole
    service_name = ""

    def __init__(self, settings: WorkerSettings, engine: Engine):
        self.settings, self.engine = settings, engine
        self.worker_id = ""
        self.address = ""  # as advertised to the router
        self.kv_bytes_exported = 0
        self.kv_bytes_imported = 0
        self.stopping = asyncio.Event()  # set at shutdown: ends the endless KV event streams
        self.drain = Drain()  # the token streams running now, handed back if SIGTERM's drain runs out
        # NOTE: model_name is the directory's name, as the gateway serves it unless told another name
        self.metrics = WorkerMetrics(
            lambda: self.engine.stats(),
            lambda: self.worker_id,
            self.role.value,
            model_name=Path(settings.model).name if settings is not None else "",
        )

    def hash_root(self, params: SamplingParams) -> int:
        """The first KV block's parent hash for a request: its tenant's salt keyed with the deployment secret."""
        return chain_root(params.cache_salt, self.settings.kv_hash_secret if self.settings is not None else "")

    @classmethod
    def add_to(cls, service, server: grpc.aio.Server) -> None:
        """Register the role's own gRPC service (Prefill or Decode) for `service`."""
        raise NotImplementedError

    def close(self) -> None:
        """Free what the service holds outside the engine (staging files); after the server stopped."""

    def kv_moved(self, direction: str, num_bytes: int, seconds: float, transport: str) -> None:
        """One request's KV sent ("export") or received ("import"): the worker's counter and its metrics."""
        if direction == "export":
            self.kv_bytes_exported += num_bytes
        else:
            self.kv_bytes_imported += num_bytes
        self.metrics.kv_transfer(direction, num_bytes, seconds, transport)

    async def Abort(self, request, context):
        await self.engine.abort(request.req_id)
        return worker_pb2.AbortResponse()

    async def ResetPrefixCache(self, request, context):
        if not self.engine.capabilities.reset_prefix_cache:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "this worker's engine has no prefix cache to reset")
        try:
            dropped = await self.engine.reset_prefix_cache()
        except Exception as exc:
            await abort_with(context, exc)
        log.info("prefix cache reset: %d cached blocks dropped", dropped)
        return worker_pb2.ResetPrefixCacheResponse(num_blocks_dropped=dropped)

    async def GetStats(self, request, context):
        s = self.engine.stats()
        return worker_pb2.WorkerStats(
            worker_id=self.worker_id,
            role=role_to_pb(self.role),
            load=self.load(),
            prefix_queries=s.prefix_queries,
            prefix_hits=s.prefix_hits,
            num_preemptions=s.num_preemptions,
            num_prompt_tokens_computed=s.num_prompt_tokens_computed,
            num_generated_tokens=s.num_generated_tokens,
            kv_bytes_exported=self.kv_bytes_exported,
            kv_bytes_imported=self.kv_bytes_imported,
            block_size=s.block_size,
            max_model_len=s.max_model_len,
        )

    async def StreamKvEvents(self, request, context):
        if not self.engine.capabilities.kv_events:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "this worker's engine publishes no KV events")
        async for batch in kv_event_batches(self.engine, self.worker_id, request.after_seq, self.stopping):
            yield batch

    async def StreamLoad(self, request, context):
        interval_s = request.interval_s if request.interval_s > 0 else LOAD_STREAM_INTERVAL_S
        async for load in load_changes(self._load_sample, interval_s, self.stopping):
            yield load

    def load(self) -> common_pb2.WorkerLoad:
        return load_to_pb(self.engine.stats(), self.settings.batch.max_num_seqs)

    def _load_sample(self) -> tuple[common_pb2.WorkerLoad, int]:
        stats = self.engine.stats()  # prefix_queries: prompt tokens admitted so far, so it grows with every admission
        return load_to_pb(stats, self.settings.batch.max_num_seqs), stats.prefix_queries

    def info(self, address: str) -> router_pb2.WorkerInfo:
        return router_pb2.WorkerInfo(
            worker_id=self.worker_id,
            role=role_to_pb(self.role),
            address=address,
            model=self.settings.model,
            layout=layout_to_pb(self.engine.kv_layout),
            max_num_seqs=self.settings.batch.max_num_seqs,
            max_model_len=self.engine.max_model_len,
        )


def observed(rpc: str):
    """Count the RPC by its final gRPC status, tag its log records with the request id, and log one
    info line when it ends. Works for unary methods and for response-streaming (async generator) ones."""

    def decorate(method):
        @contextlib.contextmanager
        def observing(self, request, context):
            token, start, exc = request_id.set(request.req_id), time.monotonic(), None
            try:
                yield
            except BaseException as e:
                exc = e
                raise
            finally:
                code = _status_name(context, exc)
                self.metrics.rpc_done(rpc, code)
                log.info(
                    "%s %s",
                    rpc,
                    code,
                    extra={"rpc": rpc, "code": code, "duration_s": round(time.monotonic() - start, 6)},
                )
                try:
                    request_id.reset(token)
                except ValueError:  # NOTE: a cancelled stream is closed from another task, whose context it is not
                    pass

        if inspect.isasyncgenfunction(method):

            @functools.wraps(method)
            async def stream(self, request, context):
                with observing(self, request, context):
                    async for reply in method(self, request, context):
                        yield reply

            return stream

        @functools.wraps(method)
        async def unary(self, request, context):
            with observing(self, request, context):
                return await method(self, request, context)

        return unary

    return decorate


def _status_name(context, exc: BaseException | None) -> str:
    code = context.code() if hasattr(context, "code") else None
    if isinstance(code, grpc.StatusCode):
        return code.name
    if exc is None:
        return "OK"
    if isinstance(exc, (asyncio.CancelledError, GeneratorExit)):
        return "CANCELLED"
    return "UNKNOWN"


def wall_clock():
    """Turns time.monotonic() readings into the epoch nanoseconds spans are stamped with; one offset for
    all, so intervals that touch stay touching."""
    offset_ns = time.time_ns() - int(time.monotonic() * 1e9)
    return lambda monotonic_s: offset_ns + int(monotonic_s * 1e9)


async def serve_worker(settings: WorkerSettings, service_cls: type[WorkerService]) -> None:
    engine = make_engine(settings)
    service = service_cls(settings, engine)
    server = GrpcServer(
        f"{settings.host}:{settings.port}",
        [CONTROL_SERVICE, service_cls.service_name],
        service.metrics.registry,
        limits=settings.role.value,
    )
    worker_pb2_grpc.add_WorkerControlServicer_to_server(service, server.server)
    service_cls.add_to(service, server.server)
    service.worker_id = settings.resolved_worker_id(server.port)
    service.address = settings.advertised_address(server.port)
    service.metrics.start_at_zero(*_ZERO_SERIES[settings.role], _transport_label(settings.role, engine))
    registrar = Registrars(settings.router_address, service.info(service.address), service.load)
    endpoint: MetricsEndpoint | None = None
    watcher: asyncio.Task | None = None

    async def on_engine_failure() -> None:
        """A dead engine serves nothing: NOT_SERVING, out of the router's pool; the process stays to say so."""
        reason = await engine.wait_failed()
        log.error("engine failed (%s): this worker reports NOT_SERVING and leaves the router", reason)
        await server.set_serving(False)
        await registrar.stop()

    async def start() -> None:
        nonlocal endpoint, watcher
        await engine.start()
        if settings.device.startswith("cuda"):  # NOTE: kernels compiled before the router sends work
            await warm_up(engine)
        endpoint = MetricsEndpoint(service.metrics.registry, settings.host, settings.metrics_port)
        await server.start()
        registrar.start()
        watcher = asyncio.create_task(on_engine_failure(), name="engine-watcher")
        log.info(
            "%s worker %s ready on %s",
            settings.role.value,
            service.worker_id,
            service.address,
            extra={"metrics_port": endpoint.port},
        )

    async def stop() -> None:
        if watcher is not None:
            watcher.cancel()
        await registrar.stop()  # no new requests routed here
        # NOTE: still serving while it drains: requests routed just before the deregistration still arrive
        # (SETTLE_S), and a prefill worker's held KV is pulled by new PullKv calls
        await asyncio.sleep(min(SETTLE_S, settings.drain_s))
        if not await wait_idle(engine, settings.drain_s, drain=service.drain):
            await hand_back(service.drain)
        service.stopping.set()
        await server.stop(grace_s=1.0)  # the last messages of finished streams
        await engine.shutdown()
        service.close()
        if endpoint is not None:
            endpoint.close()

    await run_until_signal(start, stop)


async def warm_up(engine: Engine, num_prompt_tokens: int = 32) -> None:
    """A dummy prefill and a few decode steps through the real path (the engine loop, its kernels and graphs),
    so that the first user request does not pay for compiling them."""
    request = EngineRequest("warm-up", (1,) * num_prompt_tokens, SamplingParams(max_tokens=4, ignore_eos=True))
    start = time.monotonic()
    async for _ in engine.add_request(request):
        pass
    log.info("warmed up in %.2f s", time.monotonic() - start)


async def wait_idle(engine: Engine, timeout_s: float, poll_s: float = 0.05, drain: Drain | None = None) -> bool:
    """Until the engine holds no request (waiting, running, or prefilled KV not yet pulled) and no token stream
    runs; False on timeout."""

    def is_engine_idle() -> bool:
        s = engine.stats()
        return s.num_waiting + s.num_running + s.num_held == 0

    is_idle = await (drain or Drain()).wait_idle(timeout_s, is_engine_idle, poll_s)
    if not is_idle:
        log.warning("drain: requests still held after %.0f s", timeout_s)
    return is_idle


async def hand_back(drain: Drain) -> None:
    """The drain ran out: the token streams still running end with UNAVAILABLE, and the gateway continues them
    on another worker."""
    log.warning("drain: %d requests handed back to the gateway", drain.hand_back())
    await drain.wait_idle(HAND_BACK_GRACE_S)


def main_for(role: WorkerRole, service_cls: type[WorkerService], argv: list[str] | None) -> int:
    from services.common.logs import setup_logging
    from services.common.tracing import setup_tracing, shutdown_tracing
    from services.common.worker_settings import parse_worker_settings

    try:
        settings = parse_worker_settings(role, argv)
        # NOTE: a bad TANDEM_GRPC_TLS_* (or plaintext on a public address) fails here, in one line, before the model loads
        process_tls().check_bind(f"{settings.host}:{settings.port}")
        setup_logging(role.value)
        setup_tracing(role.value)
        try:
            asyncio.run(serve_worker(settings, service_cls))
        finally:
            shutdown_tracing()
    except (SettingsError, EngineUnavailableError, ModelNotFoundError) as exc:
        # NOTE: a worker that cannot start says why in one line (no traceback) and exits 2, as a bad flag does
        print(f"tandem serve {role.value}: error: {exc}", file=sys.stderr, flush=True)
        return 2
    return 0
