"""Observation sources: the router source against a real Router service and a worker's GetStats over gRPC;
the Prometheus source's queries and parsing against canned answers of the Prometheus HTTP API; bucket maths."""

import asyncio
import math

import grpc
import httpx
import pytest

from services.common.protos import common_pb2, router_pb2, router_pb2_grpc, worker_pb2, worker_pb2_grpc
from services.planner import histograms
from services.planner.perf_model import Slo
from services.planner.sources import PrometheusSource, RouterSource
from services.planner.types import Replicas, WorkerRole
from services.router.server import RouterService
from services.router.settings import RouterSettings

REPLICAS = {WorkerRole.PREFILL: Replicas(1), WorkerRole.DECODE: Replicas(1)}


class StatsOnlyWorker(worker_pb2_grpc.WorkerControlServicer):
    def __init__(self):
        self.generated = 100

    async def GetStats(self, request, context):
        return worker_pb2.WorkerStats(worker_id="d1", num_generated_tokens=self.generated)


@pytest.fixture
async def router_and_worker():
    router = RouterService(RouterSettings(host="127.0.0.1", port=0))
    await router.start()
    worker = StatsOnlyWorker()
    server = grpc.aio.server()
    worker_pb2_grpc.add_WorkerControlServicer_to_server(worker, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{router.port}") as channel:
        stub = router_pb2_grpc.RouterStub(channel)
        info = router_pb2.WorkerInfo(
            worker_id="d1", role=common_pb2.WORKER_ROLE_DECODE, address=f"127.0.0.1:{port}", model="m", max_num_seqs=8
        )
        await stub.Register(
            router_pb2.RegisterRequest(
                worker=info,
                load=common_pb2.WorkerLoad(num_waiting=2, num_running=3, num_blocks_used=10, num_blocks_total=100),
            )
        )
        yield router, worker, stub
    await server.stop(0)
    await router.stop(0)


async def test_the_router_source_turns_counters_into_a_window(router_and_worker):
    router, worker, stub = router_and_worker
    clock = {"now": 0.0}
    source = RouterSource(f"127.0.0.1:{router.port}", clock=lambda: clock["now"])
    first = await source.observe(REPLICAS)
    assert (first.window_s, first.num_requests) == (0.0, 0) and first.workers[0].num_running == 3  # a baseline
    for i in range(4):
        await stub.Route(router_pb2.RouteRequest(req_id=f"r{i}", model="m", token_ids=range(50)))
    worker.generated += 800
    clock["now"] = 10.0
    obs = await source.observe(REPLICAS)
    assert (obs.window_s, obs.num_requests, obs.mean_isl, obs.num_output_tokens) == (10.0, 4, 50.0, 800)
    assert obs.ttft_s is None and obs.itl_s is None  # this source observes no latency
    assert [(w.worker_id, w.role, w.num_waiting, w.num_running) for w in obs.workers] == [
        ("d1", WorkerRole.DECODE, 2, 3)
    ]
    await source.close()


async def test_the_router_source_adds_up_every_replica_and_skips_one_that_is_down(router_and_worker):
    router, worker, stub = router_and_worker
    other = RouterService(RouterSettings(host="127.0.0.1", port=0))
    await other.start()
    clock = {"now": 0.0}
    source = RouterSource(f"127.0.0.1:{router.port},127.0.0.1:{other.port}", clock=lambda: clock["now"])
    async with grpc.aio.insecure_channel(f"127.0.0.1:{other.port}") as channel:
        stub2 = router_pb2_grpc.RouterStub(channel)
        await stub2.Register(
            router_pb2.RegisterRequest(
                worker=router_pb2.WorkerInfo(
                    worker_id="d1", role=common_pb2.WORKER_ROLE_DECODE, address="127.0.0.1:1", model="m", max_num_seqs=8
                )
            )
        )
        assert (await source.observe(REPLICAS)).num_requests == 0  # the baseline of both
        for i, replica in enumerate([stub, stub, stub, stub2, stub2]):  # each replica counts only its own routes
            await replica.Route(router_pb2.RouteRequest(req_id=f"r{i}", model="m", token_ids=range(10 * (i + 1))))
        clock["now"] = 10.0
        obs = await source.observe(REPLICAS)
        assert (obs.window_s, obs.num_requests, obs.mean_isl) == (10.0, 5, 30.0)
        await other.stop(0)
        await stub.Route(router_pb2.RouteRequest(req_id="r9", model="m", token_ids=range(50)))
        clock["now"] = 20.0
        obs = await asyncio.wait_for(source.observe(REPLICAS), 10)
        assert (obs.num_requests, obs.mean_isl) == (1, 50.0) and obs.workers  # the replica left counts alone
    await source.close()


async def test_an_unreachable_router_is_a_missing_observation():
    source = RouterSource("127.0.0.1:1")
    obs = await asyncio.wait_for(source.observe(REPLICAS), 10)
    assert obs.num_requests is None and obs.replicas == REPLICAS
    await source.close()


def prometheus(answers: dict[str, list], seen: list[str]) -> httpx.AsyncClient:
    def handle(request: httpx.Request) -> httpx.Response:
        expr = request.url.params["query"]
        seen.append(expr)
        for needle, result in answers.items():
            if needle in expr:
                return httpx.Response(
                    200, json={"status": "success", "data": {"resultType": "vector", "result": result}}
                )
        return httpx.Response(200, json={"status": "success", "data": {"resultType": "vector", "result": []}})

    return httpx.AsyncClient(transport=httpx.MockTransport(handle))


def vector(value: float, **labels) -> dict:
    return {"metric": labels, "value": [0, str(value)]}


async def test_the_prometheus_source_reads_the_gateway_and_the_workers():
    buckets = [vector(n, le=le) for le, n in (("0.05", 10), ("0.5", 90), ("1.0", 100), ("+Inf", 100))]
    answers = {
        "tandem_gateway_requests_total": [vector(120)],
        "prompt_tokens": [vector(120_000)],
        "completion_tokens": [vector(24_000)],
        "time_to_first_token": buckets,
        "inter_token_latency": [vector(1000, le="0.05"), vector(1000, le="+Inf")],
        "requests_waiting": [vector(4, worker_id="p0", role="prefill")],
        "requests_running": [vector(2, worker_id="p0", role="prefill")],
        "kv_blocks_used": [vector(5, worker_id="p0", role="prefill")],
        "kv_blocks_total": [vector(50, worker_id="p0", role="prefill")],
    }
    seen: list[str] = []
    source = PrometheusSource("http://prom:9090/", 30.0, Slo(0.5, 0.05), 0.95, prometheus(answers, seen))
    obs = await source.observe(REPLICAS)
    assert "sum(increase(tandem_gateway_requests_total[30s]))" in seen
    assert "sum by (le) (increase(tandem_gateway_time_to_first_token_seconds_bucket[30s]))" in seen
    assert (obs.window_s, obs.num_requests, obs.mean_isl, obs.num_output_tokens) == (30.0, 120, 1000.0, 24_000)
    assert obs.ttft_s == pytest.approx(0.5 + 0.5 * (95 - 90) / 10)  # inside the (0.5, 1.0] bucket
    assert obs.attainment == {"ttft": 0.9, "itl": 1.0}
    assert [(w.worker_id, w.role, w.num_waiting, w.num_running, w.num_blocks_total) for w in obs.workers] == [
        ("p0", WorkerRole.PREFILL, 4, 2, 50)
    ]


async def test_a_failing_prometheus_is_a_missing_observation():
    client = httpx.AsyncClient(transport=httpx.MockTransport(lambda r: httpx.Response(503, text="not ready")))
    obs = await PrometheusSource("http://prom:9090", 30.0, Slo(), 0.95, client).observe(REPLICAS)
    assert obs.num_requests is None and obs.replicas == REPLICAS


def test_bucket_quantiles_and_shares_follow_prometheus():
    b = [(0.1, 10.0), (0.2, 30.0), (math.inf, 40.0)]
    assert histograms.quantile(0.5, b) == pytest.approx(0.15)  # rank 20: half-way through (0.1, 0.2]
    assert histograms.quantile(0.99, b) == 0.2  # in +Inf: the highest finite bound, as Prometheus does
    assert histograms.share_within(0.15, b) == pytest.approx(20 / 40)
    assert histograms.share_within(0.3, b) == pytest.approx(30 / 40)  # beyond the last finite bound: no credit
    assert histograms.quantile(0.5, []) is None and histograms.share_within(0.1, [(math.inf, 0.0)]) is None
