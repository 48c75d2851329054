"""Where observations come from: the router's and workers' own figures (the default: Router.GetTraffic,
ListWorkers and each worker's GetStats), or Prometheus (the gateway's histograms add observed TTFT and ITL).
I/O only: each turns what it reads into an Observation; a read that fails is reported as missing."""

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import grpc
import httpx

from services.common.grpc_server import make_channel
from services.common.protos import router_pb2, router_pb2_grpc, worker_pb2, worker_pb2_grpc
from services.common.router_addresses import router_addresses
from services.planner import histograms
from services.planner.perf_model import Slo
from services.planner.types import Observation, Replicas, WorkerRole, WorkerSample
from services.router.convert import role_from_pb

log = logging.getLogger(__name__)
RPC_TIMEOUT_S = 2.0


@dataclass(frozen=True, slots=True)
class _Counters:
    at: float
    traffic: Mapping[str, router_pb2.Traffic]  # router address -> its counters (the replicas that answered)
    generated: Mapping[str, int]  # worker_id -> tokens generated so far


class RouterSource:
    """Arrivals and prompt tokens from every router replica (each counts only the routes it made), tokens generated
    from every worker, load from a router's registry (each replica holds every worker). No latency is observed: the
    core then judges SLOs by each worker's own load. `router_address` is a comma list or `dns:NAME:PORT`."""

    def __init__(self, router_address: str, clock=time.monotonic):
        self.addresses = router_addresses(router_address)
        self.channels = [make_channel(a) for a in self.addresses]
        self.routers = [router_pb2_grpc.RouterStub(c) for c in self.channels]
        self.clock = clock
        self._workers: dict[str, grpc.aio.Channel] = {}
        self._last: _Counters | None = None

    async def observe(self, replicas: Mapping[WorkerRole, Replicas]) -> Observation:
        try:
            now, counters, listing = await self._read()
        except grpc.aio.AioRpcError as exc:
            log.warning("no router reachable (%s): load unknown this tick", exc.code().name)
            return Observation(0.0, None, replicas=replicas)
        last, self._last = self._last, counters
        samples = tuple(
            WorkerSample(
                w.worker.worker_id,
                role_from_pb(w.worker.role),
                w.load.num_waiting,
                w.load.num_running,
                w.load.num_blocks_used,
                w.load.num_blocks_total,
            )
            for w in listing.workers
        )
        deltas = _traffic_deltas(last, counters)
        if not deltas:  # first read, or every replica new or restarted: nothing to difference yet
            return Observation(0.0, 0, workers=samples, replicas=replicas)
        assert last is not None  # NOTE: deltas come only from two reads
        routed = sum(d[0] for d in deltas)
        prompt = sum(d[1] for d in deltas)
        generated = sum(n - last.generated[w] for w, n in counters.generated.items() if w in last.generated)
        return Observation(
            now - last.at,
            routed,
            prompt / routed if routed else None,
            num_output_tokens=max(generated, 0),
            workers=samples,
            replicas=replicas,
        )

    async def _read(self) -> tuple[float, _Counters, router_pb2.ListWorkersResponse]:
        """Every replica's counters (those that answer) and one replica's worker listing; raises when none answers."""
        answers = await asyncio.gather(
            *(r.GetTraffic(router_pb2.GetTrafficRequest(), timeout=RPC_TIMEOUT_S) for r in self.routers),
            return_exceptions=True,
        )
        traffic = {a: t for a, t in zip(self.addresses, answers) if not isinstance(t, BaseException)}
        for address, error in zip(self.addresses, answers):
            if isinstance(error, grpc.aio.AioRpcError):
                log.warning(
                    "router %s unreachable (%s): its routes are not counted this tick", address, error.code().name
                )
            elif isinstance(error, BaseException):
                raise error
        if not traffic:
            raise next(a for a in answers if isinstance(a, grpc.aio.AioRpcError))
        router = self.routers[self.addresses.index(next(iter(traffic)))]
        listing = await router.ListWorkers(router_pb2.ListWorkersRequest(), timeout=RPC_TIMEOUT_S)
        stats = await asyncio.gather(*(self._generated(w.worker.address) for w in listing.workers))
        generated = {w.worker.worker_id: n for w, n in zip(listing.workers, stats) if n is not None}
        now = self.clock()
        return now, _Counters(now, traffic, generated), listing

    async def _generated(self, address: str) -> int | None:
        """A worker's tokens generated so far; None when it does not answer (leaving, or gone)."""
        channel = self._workers.get(address) or self._workers.setdefault(address, make_channel(address))
        try:
            stats = await worker_pb2_grpc.WorkerControlStub(channel).GetStats(
                worker_pb2.GetStatsRequest(), timeout=RPC_TIMEOUT_S
            )
        except grpc.aio.AioRpcError:
            return None
        return stats.num_generated_tokens

    async def close(self) -> None:
        for channel in [*self.channels, *self._workers.values()]:
            await channel.close()


def _traffic_deltas(last: _Counters | None, now: _Counters) -> list[tuple[int, int]]:
    """(routes, prompt tokens) since the last read, per replica read both times that did not restart between."""
    if last is None:
        return []
    return [
        (t.num_routed - before.num_routed, t.num_prompt_tokens - before.num_prompt_tokens)
        for address, t in now.traffic.items()
        if (before := last.traffic.get(address)) is not None and t.uptime_s >= before.uptime_s
    ]


class PrometheusSource:
    """The gateway's counters and latency histograms and the workers' gauges, over the last `range_s`."""

    def __init__(self, url: str, range_s: float, slo: Slo, quantile: float, client: httpx.AsyncClient | None = None):
        self.url, self.range_s, self.slo, self.quantile = url.rstrip("/"), range_s, slo, quantile
        self.client = client or httpx.AsyncClient(timeout=RPC_TIMEOUT_S)

    async def observe(self, replicas: Mapping[WorkerRole, Replicas]) -> Observation:
        r = f"{max(round(self.range_s), 1)}s"
        try:
            requests, prompt, completion = [
                await self._scalar(f"sum(increase(tandem_gateway_{m}_total[{r}]))")
                for m in ("requests", "prompt_tokens", "completion_tokens")
            ]
            ttft, itl = [
                await self._buckets(f"tandem_gateway_{m}_seconds_bucket", r)
                for m in ("time_to_first_token", "inter_token_latency")
            ]
            workers = await self._workers()
        except (httpx.HTTPError, ValueError, KeyError) as exc:
            log.warning("Prometheus query failed (%s): load unknown this tick", exc)
            return Observation(self.range_s, None, replicas=replicas)
        n = round(requests) if requests is not None else None
        return Observation(
            self.range_s,
            n,
            prompt / requests if requests and prompt is not None else None,
            num_output_tokens=round(completion) if completion is not None else None,
            ttft_s=histograms.quantile(self.quantile, ttft),
            itl_s=histograms.quantile(self.quantile, itl),
            attainment=_attainment(ttft, itl, self.slo),
            workers=workers,
            replicas=replicas,
        )

    async def _query(self, expr: str) -> list[dict]:
        reply = (await self.client.get(f"{self.url}/api/v1/query", params={"query": expr})).raise_for_status().json()
        if reply.get("status") != "success":
            raise ValueError(f"{expr}: {reply.get('error', reply)}")
        return reply["data"]["result"]

    async def _scalar(self, expr: str) -> float | None:
        result = await self._query(expr)
        return float(result[0]["value"][1]) if result else None

    async def _buckets(self, metric: str, r: str) -> list[tuple[float, float]]:
        result = await self._query(f"sum by (le) (increase({metric}[{r}]))")
        return [(float(s["metric"]["le"]), float(s["value"][1])) for s in result]

    async def _workers(self) -> tuple[WorkerSample, ...]:
        fields: dict[tuple[str, str], dict[str, Any]] = {}
        for name, metric in (
            ("num_waiting", "requests_waiting"),
            ("num_running", "requests_running"),
            ("num_blocks_used", "kv_blocks_used"),
            ("num_blocks_total", "kv_blocks_total"),
        ):
            for s in await self._query(f"tandem_worker_{metric}"):
                key = (s["metric"]["worker_id"], s["metric"]["role"])
                fields.setdefault(key, {})[name] = round(float(s["value"][1]))
        return tuple(WorkerSample(w, WorkerRole(role), **values) for (w, role), values in sorted(fields.items()))

    async def close(self) -> None:
        await self.client.aclose()


def _attainment(ttft: list, itl: list, slo: Slo) -> dict[str, float]:
    shares = {"ttft": histograms.share_within(slo.ttft_s, ttft), "itl": histograms.share_within(slo.itl_s, itl)}
    return {k: v for k, v in shares.items() if v is not None}
