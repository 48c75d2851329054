"""What the planner sees of a simulated cluster each tick, as Prometheus would show it for a live one: arrivals
and their ISL, the OSL of finished requests, TTFT and per-request ITL quantiles, and the router's view of every
worker's load. Reads the simulator's records; changes nothing."""

import bisect
import itertools

import numpy as np

from services.planner.types import Observation, RequestOutcome, WorkerRole, WorkerSample
from tandem.bench.traces import TraceRow
from tandem.cluster.des import ClusterSim


class SimObserver:
    def __init__(self, sim: ClusterSim, rows: list[TraceRow], quantile: float = 0.95):
        self.sim, self.quantile = sim, quantile
        self._arrivals = [r.arrival_s for r in rows]
        self._isl_cum = np.concatenate([[0], np.cumsum([r.isl for r in rows])])
        self._pending: list[str] = []  # routed requests not finished at the last tick
        self._last_s = 0.0
        self._num_seen = 0
        self._generated = 0
        self._has_prefill = False  # the router's view has a prefill worker (at the last observation)

    def observe(self, now: float, replicas) -> Observation:
        window = max(now - self._last_s, 1e-9)
        first = bisect.bisect_right(self._arrivals, self._last_s)
        last = bisect.bisect_right(self._arrivals, now)
        num = last - first
        workers = tuple(self._sample(v) for v in self.sim.registry.views())
        self._has_prefill = any(w.role is WorkerRole.PREFILL for w in workers)
        ttfts, itls, osls, finished = self._finished_since(self._last_s, now)
        self._last_s = now
        generated = sum(w.num_generated_tokens for w in self.sim.workers.values())
        num_output, self._generated = generated - self._generated, generated
        return Observation(
            window_s=window,
            num_requests=num,
            mean_isl=float(self._isl_cum[last] - self._isl_cum[first]) / num if num else None,
            mean_osl=float(np.mean(osls)) if osls else None,
            num_output_tokens=num_output,
            ttft_s=self._quantile(ttfts),
            itl_s=self._quantile(itls),
            finished=tuple(finished),
            workers=workers,
            replicas=replicas,
        )

    def _sample(self, view) -> WorkerSample:
        """The router's view of a worker's load, with the worker's own busy-time counters (as its stats report)."""
        node = self.sim.workers.get(view.worker_id)
        counters = (node.busy_s, node.num_steps, node.num_generated_tokens) if node is not None else (None,) * 3
        return WorkerSample(
            view.worker_id,
            view.info.role,
            view.load.num_waiting,
            view.load.num_running,
            view.load.num_blocks_used,
            view.load.num_blocks_total,
            *counters,
        )

    def _finished_since(self, start: float, now: float) -> tuple[list, list, list, list[RequestOutcome]]:
        """TTFTs of first tokens in (start, now]; per-request ITL, OSL and outcome of requests finished in it."""
        records = self.sim.records
        self._pending.extend(itertools.islice(records, self._num_seen, None))  # NOTE: records keeps arrival order
        self._num_seen = len(records)
        ttfts, itls, osls, finished, still = [], [], [], [], []
        for req_id in self._pending:
            r = records[req_id]
            if start < r.first_token_s <= now:
                ttfts.append(r.first_token_s - r.arrival_s)
            if r.finish_s < 0:
                still.append(req_id)
                continue
            osls.append(r.num_output_tokens)
            itl = (r.finish_s - r.first_token_s) / (r.num_output_tokens - 1) if r.num_output_tokens > 1 else None
            if itl is not None:
                itls.append(itl)
            finished.append(self._outcome(r, itl))
        self._pending = still
        return ttfts, itls, osls, finished

    def _outcome(self, r, itl: float | None) -> RequestOutcome:
        """What the gateway knows of a finished request: its latencies and the route it took (a prompt long enough
        to disaggregate that went to a decode worker was overflowed by a saturated prefill pool)."""
        num_new = r.num_prompt_tokens - r.num_cached_tokens
        role = WorkerRole.PREFILL if r.prefill_worker_id else WorkerRole.DECODE
        is_overflow = role is WorkerRole.DECODE and self._has_prefill and num_new >= self.sim.config.disagg_min_tokens
        return RequestOutcome(num_new, r.first_token_s - r.arrival_s, itl, role, is_overflow, r.arrival_s)

    def _quantile(self, values: list[float]) -> float | None:
        return float(np.quantile(values, self.quantile)) if values else None
