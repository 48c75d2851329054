"""A whole decode worker (services/common/worker_base.serve_worker, real gRPC server and health service) over a
TrtllmEngine on the fake: it serves, and once TensorRT-LLM's executor dies it reports NOT_SERVING, as a worker
whose native engine process died does. Only the engine factory and the signal wait are replaced."""

import asyncio
import dataclasses
import socket

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from engines.base.engine_configs import CacheConfig
from engines.trtllm import TrtllmConfig, TrtllmEngine
from engines.trtllm import engine as trtllm_engine
from services.common import worker_base
from services.common.worker_settings import parse_worker_settings
from services.decode.server import DecodeService
from tests.unit.engines.trtllm import fake_trtllm
from tests.unit.engines.trtllm.fake_trtllm import fake_api


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def health(port: int) -> int:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        try:
            reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1)
        except grpc.aio.AioRpcError:
            return health_pb2.HealthCheckResponse.UNKNOWN
        return reply.status


async def until(port: int, status: int, timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while await health(port) != status:
        assert asyncio.get_running_loop().time() < deadline, (
            f"health never became {health_pb2.HealthCheckResponse.ServingStatus.Name(status)}"
        )
        await asyncio.sleep(0.02)


async def test_a_worker_whose_executor_dies_reports_not_serving(tiny_llama, monkeypatch):
    fake_trtllm.LLM.instances.clear()
    monkeypatch.setattr(trtllm_engine, "HEALTH_POLL_S", 0.01)
    settings = parse_worker_settings("decode", ["--model", str(tiny_llama), "--engine", "trtllm", "--device", "cuda"])
    port = free_port()
    settings = dataclasses.replace(settings, port=port, router_address=f"127.0.0.1:{free_port()}")  # no router
    monkeypatch.setattr(
        worker_base,
        "make_engine",
        lambda s: TrtllmEngine(
            TrtllmConfig(model=s.model, device="cuda", cache=CacheConfig(num_blocks=64)), api=fake_api()
        ),
    )
    signalled = asyncio.Event()

    async def until_signalled(start, stop):
        await start()
        await signalled.wait()
        await stop()

    monkeypatch.setattr(worker_base, "run_until_signal", until_signalled)
    worker = asyncio.ensure_future(worker_base.serve_worker(settings, DecodeService))
    try:
        await until(port, health_pb2.HealthCheckResponse.SERVING)  # after the warm-up request on the fake
        fake_trtllm.LLM.instances[0].fail()
        await until(port, health_pb2.HealthCheckResponse.NOT_SERVING, timeout_s=5.0)
    finally:
        signalled.set()
        await asyncio.wait_for(worker, 30)
