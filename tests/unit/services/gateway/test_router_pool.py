"""Router replicas seen from the gateway: Route calls spread over them in turn, a dead replica is skipped, a
router's refusal is not retried elsewhere, and Complete and failure reports go to the replica that routed the
request; the pool speaks domain types; router addresses as a comma list or every record of a DNS name."""

import asyncio
import socket

import grpc
import pytest

from services.common.domain import FailureReport, ListedWorker, Route, RouteRequest, WorkerRef
from services.common.protos import router_pb2_grpc
from services.common.roles import WorkerRole
from services.common.router_addresses import RouterAddressError, router_addresses
from services.gateway.router_pool import RouterPool
from tests.unit.services.gateway.fakes import FakeRouter, start_server


async def replicas(n: int):
    routers, servers, channels = [], [], []
    for _ in range(n):
        router = FakeRouter()
        server, address = await start_server(router_pb2_grpc.add_RouterServicer_to_server, router)
        routers.append(router), servers.append(server), channels.append(grpc.aio.insecure_channel(address))
    return routers, servers, channels


def route(req_id: str) -> RouteRequest:
    return RouteRequest(req_id, "m", [1, 2, 3])


async def test_routes_spread_and_complete_where_routed():
    routers, servers, channels = await replicas(3)
    for router in routers:
        router.decode_address = "d:1"
    pool = RouterPool(channels)
    for i in range(6):
        assert await pool.route(route(f"r{i}"), timeout_s=5) == Route(WorkerRef("d0", "d:1"))
    assert [[r.req_id for r in router.routes] for router in routers] == [["r0", "r3"], ["r1", "r4"], ["r2", "r5"]]
    await pool.report_failure(FailureReport("d0", "r4", "UNAVAILABLE"), timeout_s=5)
    await pool.complete("r4", timeout_s=5)
    await pool.complete("r4", timeout_s=5)  # forgotten once completed: a second goes to the first replica
    assert [router.reported for router in routers] == [[], [("d0", "r4")], []]
    assert [router.completed for router in routers] == [["r4"], ["r4"], []]
    for server in servers:
        await server.stop(None)


async def test_a_dead_replica_is_skipped_and_a_refusal_is_final():
    routers, servers, channels = await replicas(2)
    await servers[0].stop(None)  # killed: its calls fail UNAVAILABLE
    pool = RouterPool(channels)
    for i in range(4):
        await pool.route(route(f"r{i}"), timeout_s=5)
    assert [r.req_id for r in routers[1].routes] == ["r0", "r1", "r2", "r3"]
    await pool.complete("r0", timeout_s=5)
    assert routers[1].completed == ["r0"]
    routers[1].model, routers[1].block_size = "m", 16
    assert await pool.list_workers(timeout_s=5) == [ListedWorker(WorkerRole.DECODE, "m", 512, 16, True)]
    routers[1].route_error = grpc.StatusCode.RESOURCE_EXHAUSTED  # busy: the other replica would say the same
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await pool.route(route("r9"), timeout_s=5)
    assert err.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    await servers[1].stop(None)


def test_addresses_from_a_list_and_from_dns():
    assert router_addresses("a:1, b:2,a:1") == ["a:1", "b:2"]

    def fake_dns(host, port, type):
        assert (host, port, type) == ("routers.ns.svc", 50051, socket.SOCK_STREAM)
        return [(0, 0, 0, "", ("10.0.0.9", port)), (0, 0, 0, "", ("10.0.0.2", port)), (0, 0, 0, "", ("fd00::1", port))]

    assert router_addresses("dns:///routers.ns.svc:50051", fake_dns) == [
        "10.0.0.2:50051",
        "10.0.0.9:50051",
        "[fd00::1]:50051",
    ]
    with pytest.raises(RouterAddressError, match="no router address"):
        router_addresses(" , ")
    with pytest.raises(RouterAddressError, match="expected dns:NAME:PORT"):
        router_addresses("dns:routers")


async def test_replicas_named_by_dns_are_looked_up_again_when_one_fails():
    routers, servers, addresses = [], [], []
    for _ in range(3):
        router = FakeRouter()
        server, address = await start_server(router_pb2_grpc.add_RouterServicer_to_server, router)
        routers.append(router), servers.append(server), addresses.append(address)
    answers = [addresses[:2]]  # what the name resolves to: replicas 0 and 1, later 1 and 2
    pool = RouterPool(
        [grpc.aio.insecure_channel(a) for a in addresses[:2]],
        lambda: answers[-1],
        grpc.aio.insecure_channel,
        addresses[:2],
        min_resolve_interval_s=0,
    )
    await servers[0].stop(None)  # its pod is replaced: the name now lists replica 2 instead
    answers.append(addresses[1:])
    for i in range(4):  # replica 0 fails, another answers, and the name is looked up again meanwhile
        await pool.route(route(f"r{i}"), timeout_s=5)
    await asyncio.wait_for(pool._refreshing, 5)
    assert list(pool.channels) == addresses[1:]
    for i in range(4, 8):
        await pool.route(route(f"r{i}"), timeout_s=5)
    late = [[r.req_id for r in router.routes if r.req_id in ("r4", "r5", "r6", "r7")] for router in routers]
    assert [len(ids) for ids in late] == [0, 2, 2]  # in turn over the replicas the name lists now
    assert len(routers[1].routes) + len(routers[2].routes) == 8
    await pool.close()
    for server in servers[1:]:
        await server.stop(None)


async def test_a_single_replica_that_moved_is_found_again():
    routers, servers, addresses = [], [], []
    for _ in range(2):
        router = FakeRouter()
        server, address = await start_server(router_pb2_grpc.add_RouterServicer_to_server, router)
        routers.append(router), servers.append(server), addresses.append(address)
    answers = [addresses[:1]]
    pool = RouterPool(
        [grpc.aio.insecure_channel(addresses[0])],
        lambda: answers[-1],
        grpc.aio.insecure_channel,
        addresses[:1],
        min_resolve_interval_s=0,
    )
    await servers[0].stop(None)
    answers.append(addresses[1:])
    await pool.route(route("r0"), timeout_s=1)  # waits for the old one, looks the name up, asks the new one
    assert [r.req_id for r in routers[1].routes] == ["r0"] and list(pool.channels) == addresses[1:]
    await pool.close()
    await servers[1].stop(None)
