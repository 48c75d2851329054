"""The gateway under test: a real uvicorn server on a free port, dialing a fake router whose routes point at
fake prefill and decode workers, all on loopback; the tiny checkpoint's ChatML tokenizer."""

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import grpc
import httpx
import openai
import pytest
import uvicorn
from transformers import AutoTokenizer

from services.common.protos import router_pb2_grpc
from services.gateway.server import create_app
from services.gateway.settings import GatewaySettings
from tests.unit.services.gateway.fakes import FakeRouter, FakeWorker, add_worker, start_server

MODEL = "tiny-chat"
REPLY = "Hello world! 😀 中文 done."  # multi-byte characters split across byte-level BPE tokens


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    from tandem.models.init import init_model

    return init_model(tmp_path_factory.mktemp("gateway") / MODEL, "llama", tiny=True, config_only=True)


@pytest.fixture(scope="session")
def tokenizer(model_dir):
    return AutoTokenizer.from_pretrained(str(model_dir))


@pytest.fixture(scope="session")
def reply_ids(tokenizer) -> list[int]:
    return tokenizer.encode(REPLY, add_special_tokens=False)


@dataclass
class Stack:
    router: FakeRouter
    decode: FakeWorker
    prefill: FakeWorker
    base_url: str
    client: openai.AsyncOpenAI
    http: httpx.AsyncClient
    servers: dict[str, grpc.aio.Server]
    model_dir: str

    def disaggregate(self) -> None:
        self.router.prefill_address = self.prefill.address

    async def wait_for(self, condition, timeout_s: float = 5.0) -> None:
        """Poll until `condition()` holds (cleanup happens in background tasks)."""
        for _ in range(int(timeout_s / 0.01)):
            if condition():
                return
            await asyncio.sleep(0.01)
        raise AssertionError("condition not met in time")

    async def wait_until_idle(self, timeout_s: float = 5.0) -> None:
        """Until the gateway reports no request in flight."""
        for _ in range(int(timeout_s / 0.02)):
            if 'requests_in_flight{model="tiny-chat"} 0.0' in (await self.http.get("/metrics")).text:
                return
            await asyncio.sleep(0.02)
        raise AssertionError("requests still in flight")


@asynccontextmanager
async def serve_stack(model_dir, tokens: list[int], **overrides) -> AsyncIterator[Stack]:
    router, decode, prefill = FakeRouter(), FakeWorker(tokens), FakeWorker(tokens)
    servers = {}
    for name, add, servicer in (
        ("router", router_pb2_grpc.add_RouterServicer_to_server, router),
        ("decode", add_worker, decode),
        ("prefill", add_worker, prefill),
    ):
        servers[name], servicer.address = await start_server(add, servicer)
    router.decode_address = decode.address
    settings = GatewaySettings(model_dir=str(model_dir), router_address=router.address, **overrides)
    router.model = settings.router_model
    uv = uvicorn.Server(
        uvicorn.Config(create_app(settings), host="127.0.0.1", port=0, log_level="warning", timeout_graceful_shutdown=1)
    )
    task = asyncio.create_task(uv.serve())
    while not uv.started:
        await asyncio.sleep(0.01)
    base_url = f"http://127.0.0.1:{uv.servers[0].sockets[0].getsockname()[1]}"
    key = overrides.get("api_keys", ("unused",))[0]
    client = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key=key, max_retries=0, timeout=10)
    async with httpx.AsyncClient(base_url=base_url, timeout=10) as http:
        try:
            yield Stack(router, decode, prefill, base_url, client, http, servers, str(model_dir))
        finally:
            await client.close()
            uv.should_exit = True
            await task
            for server in servers.values():
                await server.stop(0)


@pytest.fixture
async def stack(model_dir, reply_ids) -> AsyncIterator[Stack]:
    async with serve_stack(model_dir, reply_ids, served_model_name=MODEL) as s:
        yield s


@pytest.fixture
def stack_with(model_dir, reply_ids):
    """A stack with other settings: `async with stack_with(max_inflight=1) as s:`."""
    return lambda **overrides: serve_stack(model_dir, reply_ids, **{"served_model_name": MODEL, **overrides})
