"""The gateway's FastAPI app (routes only; the work is in serving.py) and `main`, which runs it under
uvicorn — what `tandem serve gateway` calls."""

import logging
import sys
import time
from contextlib import asynccontextmanager

import grpc
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from services.common.grpc_server import make_channel
from services.common.logs import setup_logging
from services.common.settings import SettingsError
from services.common.tls import process_tls
from services.common.tracing import setup_tracing, shutdown_tracing
from services.gateway import errors
from services.gateway.admission import Admission, Inflight
from services.gateway.metrics import GatewayMetrics
from services.gateway.model_info import load_model_info
from services.gateway.openai_protocol import ChatCompletionRequest, CompletionRequest
from services.gateway.openapi import build_schema
from services.gateway.pipeline import Pipeline
from services.gateway.responses_api import add_routes as add_responses_routes
from services.gateway.responses_api import make_api as make_responses_api
from services.gateway.router_pool import RouterPool
from services.gateway.serving import REQUEST_ID, Serving
from services.gateway.settings import GatewaySettings, parse_args
from services.gateway.tenancy import KeyLimits

log = logging.getLogger(__name__)
OPENAPI_VERSION = "1.0.0"  # of the HTTP API this document describes


def create_app(
    settings: GatewaySettings,
    *,
    router_channel: grpc.aio.Channel | list[grpc.aio.Channel] | None = None,
    inflight: Inflight | None = None,
) -> FastAPI:
    """The app; it dials `settings.router_address` at start-up unless a channel is handed in (tests). `inflight`
    is the count the in-flight limit applies to (the supervisor's shared one under several processes)."""
    model = load_model_info(settings.model_dir, settings.model_name, int(time.time()))
    if not settings.kv_hash_secret:
        log.warning(
            "TANDEM_KV_HASH_SECRET is unset: KV block hashes and tenant ids are not keyed (docs/security-tenants.md)"
        )
    admission = Admission(
        max_inflight=settings.max_inflight,
        api_keys=settings.api_keys,
        inflight=inflight,
        limits=KeyLimits(settings.max_inflight_per_key, settings.tokens_per_minute_per_key),
        secret=settings.kv_hash_secret,
    )
    metrics = GatewayMetrics(slo_ttft_s=settings.slo_ttft_s, slo_itl_s=settings.slo_itl_s)
    metrics.start_at_zero(model.name)
    serving = Serving(settings, model, admission, metrics)
    responses = make_responses_api(serving)

    def attach(channel: grpc.aio.Channel | list[grpc.aio.Channel] | RouterPool) -> Pipeline:
        serving.pipeline = Pipeline(
            channel,
            model=settings.router_model,
            request_timeout_s=settings.request_timeout_s,
            route_timeout_s=settings.route_timeout_s,
            max_migrations=settings.max_migrations,
            on_migration=lambda: metrics.migrated(model.name),
            kv_hash_secret=settings.kv_hash_secret,
        )
        return serving.pipeline

    if router_channel is not None:
        attach(router_channel)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        # NOTE: several router replicas (a comma list, or dns:NAME:PORT for all of a name's records, looked up again
        # when one fails): one channel each
        owned = RouterPool.from_addresses(settings.router_address, make_channel) if router_channel is None else None
        if owned is not None:
            attach(owned)
        log.info("gateway for %s, router at %s", model.name, settings.router_address)
        yield
        await serving.close()
        await responses.close()
        if owned is not None:
            await owned.close()

    app = FastAPI(title="tandem gateway", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url="/openapi.json")
    schema = build_schema(app.title, OPENAPI_VERSION)  # written out: the routes take raw Requests, so FastAPI
    app.openapi = lambda: schema  # could infer neither their bodies nor their error answers
    app.state.serving = serving
    errors.install_handlers(app)
    app.add_middleware(EchoRequestId)
    _add_routes(app, serving)
    add_responses_routes(app, responses)
    if setup_tracing("gateway"):  # a no-op unless OTEL_* says where traces go
        from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

        FastAPIInstrumentor.instrument_app(app, excluded_urls="health,ready,metrics")
    return app


def _add_routes(app: FastAPI, serving: Serving) -> None:
    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await serving.handle(request, "/v1/chat/completions", ChatCompletionRequest)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await serving.handle(request, "/v1/completions", CompletionRequest)

    @app.get("/v1/models")
    async def list_models(request: Request) -> dict:
        serving.admission.check_key(request.headers.get("authorization"))
        return {"object": "list", "data": [await _model_card(serving)]}

    @app.get("/v1/models/{name:path}")
    async def get_model(name: str, request: Request) -> dict:
        serving.admission.check_key(request.headers.get("authorization"))
        serving.check_model(name)
        return await _model_card(serving)

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    @app.get("/ready")
    async def ready() -> JSONResponse:
        if serving.pipeline is None:
            return JSONResponse({"status": "unavailable", "reason": "not started"}, status_code=503)
        is_ready, reason = await serving.pipeline.is_ready()
        return JSONResponse(
            {"status": "ready" if is_ready else "unavailable", "reason": reason}, status_code=200 if is_ready else 503
        )

    @app.get("/metrics")
    async def metrics() -> Response:
        body, content_type = serving.metrics.render()
        return Response(body, media_type=content_type)


class EchoRequestId:
    """ASGI middleware: a client's x-request-id comes back on the response (whole, streamed or an error) when it
    is one the gateway accepts as a request id."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        value = _header(scope, b"x-request-id") if scope["type"] == "http" else None
        if value is None or not REQUEST_ID.fullmatch(value):
            return await self.app(scope, receive, send)

        async def send_with_id(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), (b"x-request-id", value.encode())]}
            await send(message)

        return await self.app(scope, receive, send_with_id)


def _header(scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return value.decode("latin-1")
    return None


async def _model_card(serving: Serving) -> dict:
    model = serving.model
    card = {"id": model.name, "object": "model", "created": model.created, "owned_by": "tandem"}
    try:
        card["max_model_len"] = await serving.max_model_len()
    except errors.GatewayError:  # no live worker yet: the context is unknown, the model still is
        pass
    return card


def main(argv: list[str] | None = None) -> int:
    try:
        settings = parse_args(argv)
        process_tls()
        setup_logging("gateway")
        logging.getLogger().setLevel(settings.log_level.upper())
        if settings.num_workers > 1:  # checked here once, so a bad model is one clear line, not N dying processes
            load_model_info(settings.model_dir, settings.model_name, 0)
        else:
            app = create_app(settings)
    except SettingsError as exc:
        print(f"tandem gateway: error: {exc}", file=sys.stderr)
        return 2
    if settings.num_workers > 1:
        from services.gateway.supervisor import run_supervisor

        return run_supervisor(settings, create_app)
    try:
        uvicorn.run(
            app,
            host=settings.host,
            port=settings.port,
            log_level=settings.log_level.lower(),
            timeout_graceful_shutdown=settings.drain_timeout_s,
            log_config=None,  # NOTE: keep our JSON log handler
            access_log=False,
        )  # RequestTimer.finish logs one line per request already
    finally:
        shutdown_tracing()
    return 0
