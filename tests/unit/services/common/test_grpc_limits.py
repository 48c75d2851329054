"""Per-service gRPC limits: the table replaces the shared message sizes, and a live server refuses a request past
its service's receive limit with RESOURCE_EXHAUSTED before parsing it, and a call past its calls-at-once limit."""

import asyncio

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.common.grpc_limits import LIMITS, MIB, GrpcLimits, server_options
from services.common.grpc_server import SERVER_OPTIONS, GrpcServer


def test_each_service_gets_one_value_per_option():
    for service, limits in LIMITS.items():
        options = server_options(SERVER_OPTIONS, service)
        names = [name for name, _ in options]
        assert len(names) == len(set(names)), service
        assert dict(options)["grpc.max_receive_message_length"] == limits.max_receive_bytes
        assert dict(options)["grpc.max_send_message_length"] == limits.max_send_bytes
        assert dict(options)["grpc.max_concurrent_streams"] == limits.max_streams_per_connection
        assert dict(options)["grpc.http2.max_ping_strikes"] == 0  # the shared keepalive options stay


async def test_a_decode_server_refuses_a_request_past_its_receive_limit():
    server = GrpcServer("127.0.0.1:0", ["tandem.v1.DecodeWorker"], limits="decode")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(
            f"127.0.0.1:{server.port}", options=[("grpc.max_send_message_length", 64 * MIB)]
        ) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            ok = await stub.Check(health_pb2.HealthCheckRequest(service="tandem.v1.DecodeWorker"), timeout=5)
            assert ok.status == health_pb2.HealthCheckResponse.SERVING
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.Check(health_pb2.HealthCheckRequest(service="x" * (9 * MIB)), timeout=5)
            assert caught.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    finally:
        await server.stop(0)


def test_stream_limits_stay_above_the_largest_gateway_in_flight_limit():
    import dataclasses

    from services.gateway.settings import GatewaySettings
    from tandem.chaos.stack import Shape

    default = {f.name: f.default for f in dataclasses.fields(GatewaySettings)}["max_inflight"]
    for service in ("router", "decode", "prefill"):  # Shape: the most any stack here lets one gateway hold (1024)
        assert LIMITS[service].max_streams_per_connection >= 4 * max(Shape().max_inflight, default)
        assert LIMITS[service].max_concurrent_rpcs >= LIMITS[service].max_streams_per_connection


async def test_a_server_refuses_calls_past_its_calls_at_once_limit(monkeypatch):
    monkeypatch.setitem(
        LIMITS, "decode", GrpcLimits(8 * MIB, 8 * MIB, max_streams_per_connection=8, max_concurrent_rpcs=2)
    )
    server = GrpcServer("127.0.0.1:0", ["tandem.v1.DecodeWorker"], limits="decode")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            watches = [stub.Watch(health_pb2.HealthCheckRequest(service="")) for _ in range(2)]
            for watch in watches:  # both held open: the server's two calls
                assert (await watch.read()).status == health_pb2.HealthCheckResponse.SERVING
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
            assert caught.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
            for watch in watches:
                watch.cancel()
            await asyncio.sleep(0.2)
            ok = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)  # room again
            assert ok.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        await server.stop(0)
