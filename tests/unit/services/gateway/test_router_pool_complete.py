"""How the gateway tells a router that requests finished: on the next Route to the replica that routed them, or as
one batched Complete when no Route follows in time; held ones are sent again after a failed Route and on close."""

import asyncio

import grpc
import pytest

from services.gateway.router_pool import RouterPool
from tests.unit.services.gateway.test_router_pool import replicas, route


async def stop(servers) -> None:
    for server in servers:
        await server.stop(None)


async def test_a_finished_request_rides_on_the_next_route_to_its_replica():
    routers, servers, channels = await replicas(2)
    pool = RouterPool(channels, complete_delay_s=60)
    for i in range(2):
        await pool.route(route(f"r{i}"), timeout_s=5)  # r0 on replica 0, r1 on replica 1
    pool.complete("r1")
    await pool.route(route("r2"), timeout_s=5)  # replica 0: nothing of its own to carry
    await pool.route(route("r3"), timeout_s=5)  # replica 1: carries r1
    assert [list(r.completed_req_ids) for r in routers[1].routes] == [[], ["r1"]]
    assert [router.completed for router in routers] == [[], ["r1"]]
    assert [router.num_complete_calls for router in routers] == [0, 0]
    await stop(servers)


async def test_with_no_route_to_carry_them_they_go_as_one_complete():
    routers, servers, channels = await replicas(1)
    pool = RouterPool(channels, complete_delay_s=0.02)
    for i in range(3):
        await pool.route(route(f"r{i}"), timeout_s=5)
    for i in range(3):
        pool.complete(f"r{i}")
    assert routers[0].completed == []  # held for the delay
    for _ in range(200):
        if routers[0].completed:
            break
        await asyncio.sleep(0.01)
    assert (routers[0].completed, routers[0].num_complete_calls) == (["r0", "r1", "r2"], 1)
    pool.complete("r9")  # never routed: told to the first replica, in a flush of its own
    for _ in range(200):
        if routers[0].num_complete_calls == 2:
            break
        await asyncio.sleep(0.01)
    assert routers[0].completed == ["r0", "r1", "r2", "r9"]
    await stop(servers)


async def test_a_failed_route_keeps_them_to_send_again():
    routers, servers, channels = await replicas(1)
    pool = RouterPool(channels, complete_delay_s=60)
    await pool.route(route("r0"), timeout_s=5)
    pool.complete("r0")
    routers[0].route_error = grpc.StatusCode.RESOURCE_EXHAUSTED
    with pytest.raises(grpc.aio.AioRpcError):
        await pool.route(route("r1"), timeout_s=5)
    routers[0].route_error = None
    await pool.route(route("r2"), timeout_s=5)
    # NOTE: the fake took r0 before refusing, as a router might: sent again, harmless (Complete is idempotent)
    assert [list(r.completed_req_ids) for r in routers[0].routes] == [[], ["r0"], ["r0"]]
    assert routers[0].completed == ["r0", "r0"]
    await stop(servers)


async def test_close_sends_what_it_holds():
    routers, servers, channels = await replicas(1)
    pool = RouterPool(channels, complete_delay_s=60)
    await pool.route(route("r0"), timeout_s=5)
    pool.complete("r0")
    await asyncio.wait_for(pool.close(), timeout=5)
    assert (routers[0].completed, routers[0].num_complete_calls) == (["r0"], 1)
    await stop(servers)
