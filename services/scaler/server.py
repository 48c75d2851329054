"""The scaler's HTTP shell: a bearer token, then the policy, then `docker compose`. The only tandem service that
mounts the Docker socket; it runs no command but the two in compose_cli, for the services its policy allows."""

import asyncio
import hmac
import logging
import os
import secrets
import sys
from pathlib import Path

import uvicorn
from fastapi import Depends, FastAPI, Header, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from services.common.settings import SettingsError
from services.scaler.compose_cli import ComposeError, ComposeProject, Runner, count, parse_ps, run_command
from services.scaler.policy import ScalePolicy, ScaleRefused
from services.scaler.settings import ScalerSettings, parse_args

log = logging.getLogger("tandem.scaler")
MAX_REPLICAS = 1024  # beyond any allow-list: the body itself is refused


class ScaleRequest(BaseModel):
    project: str = Field(max_length=128)
    service: str = Field(max_length=128)
    replicas: int = Field(ge=0, le=MAX_REPLICAS)


class Unauthorized(Exception):
    pass


def load_or_create_token(path: Path) -> str:
    """The token in `path`, or a new random one written there 0600 (first start of a fresh volume)."""
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(32) + "\n")
    token = path.read_text().strip()
    if len(token) < 16:
        raise SettingsError(f"{path}: the token is shorter than 16 characters")
    return token


def create_app(policy: ScalePolicy, project: ComposeProject, token: str, runner: Runner = run_command) -> FastAPI:
    app = FastAPI(title="tandem scaler", docs_url=None, redoc_url=None, openapi_url=None)
    lock = asyncio.Lock()  # one compose command at a time: two scalings of one service must not interleave

    def authorized(authorization: str = Header(default="")) -> None:
        scheme, _, given = authorization.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.encode(), token.encode()):
            raise Unauthorized()

    @app.exception_handler(Unauthorized)
    async def unauthorized(request: Request, exc: Unauthorized):
        log.warning("refused a call to %s from %s: no valid token", request.url.path, request.client)
        return _error(401, "a valid bearer token is required", "authentication_error")

    @app.exception_handler(ScaleRefused)
    async def refused(request: Request, exc: ScaleRefused):
        log.warning("refused %s: %s", request.url.path, exc)
        return _error(exc.status, str(exc), "permission_error" if exc.status == 403 else "invalid_request_error")

    @app.exception_handler(ComposeError)
    async def compose_failed(request: Request, exc: ComposeError):
        log.error("docker compose failed: %s", exc)
        return _error(502, str(exc), "compose_error")

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    @app.get("/v1/replicas", dependencies=[Depends(authorized)])
    async def replicas(project_name: str = Query(alias="project"), service: list[str] = Query()) -> dict:
        policy.check_project(project_name)
        for name in service:
            if name not in policy.allowed:
                raise ScaleRefused(f"service {name!r} is not in the scaler's allow-list")
        async with lock:
            containers = parse_ps(await asyncio.to_thread(runner, project.ps_argv(service)))
        return {"services": {name: _counts(containers, name) for name in service}}

    @app.post("/v1/scale", dependencies=[Depends(authorized)])
    async def scale(body: ScaleRequest) -> dict:
        policy.check_scale(body.project, body.service, body.replicas)
        log.info("scaling %s of project %s to %d", body.service, body.project, body.replicas)
        async with lock:
            await asyncio.to_thread(runner, project.scale_argv(body.service, body.replicas))
        return {"project": body.project, "service": body.service, "replicas": body.replicas}

    return app


def _counts(containers: list[dict], service: str) -> dict:
    c = count(containers, service)
    return {"ready": c.ready, "starting": c.starting, "draining": c.draining}


def _error(status: int, message: str, kind: str) -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": {"message": message, "type": kind}})


def main(argv: list[str] | None = None) -> int:
    from services.common.logs import setup_logging

    try:
        settings: ScalerSettings = parse_args(argv)
        setup_logging("scaler")
        logging.getLogger().setLevel(settings.log_level.upper())
        token = load_or_create_token(Path(settings.token_file))
    except (SettingsError, OSError) as exc:
        print(f"tandem scaler: error: {exc}", file=sys.stderr)
        return 2
    project = ComposeProject(settings.compose_command, settings.compose_file, settings.project)
    app = create_app(settings.policy, project, token)
    log.info(
        "scaler for project %s on %s:%d, allowing %s", settings.project, settings.host, settings.port, settings.services
    )
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level.lower(),
        log_config=None,
        access_log=False,
    )
    return 0
