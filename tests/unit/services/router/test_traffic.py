"""Router.GetTraffic: cumulative routes, prompt tokens and completions, what the planner turns into rates."""

import grpc
import pytest

from services.common.protos import router_pb2
from tests.unit.services.router.test_server import clock, register_pool, route, service, stub  # noqa: F401


async def test_traffic_counts_routes_prompt_tokens_and_completions(stub):
    empty = await stub.GetTraffic(router_pb2.GetTrafficRequest())
    assert (empty.num_routed, empty.num_prompt_tokens, empty.num_completed) == (0, 0, 0)
    await register_pool(stub)
    for req_id in ("r1", "r2", "r3"):
        await route(stub, req_id)  # 32 prompt tokens each
    await stub.Complete(router_pb2.CompleteRequest(req_id="r1"))
    traffic = await stub.GetTraffic(router_pb2.GetTrafficRequest())
    assert (traffic.num_routed, traffic.num_prompt_tokens, traffic.num_completed) == (3, 96, 1)
    assert traffic.uptime_s > empty.uptime_s > 0


async def test_a_failed_route_is_not_traffic(stub):
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        await route(stub, "r1", model="nobody-serves-this")
    assert failed.value.code() is grpc.StatusCode.UNAVAILABLE  # no worker at all
    assert (await stub.GetTraffic(router_pb2.GetTrafficRequest())).num_routed == 0
