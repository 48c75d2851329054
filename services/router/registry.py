"""The worker registry: leases renewed by heartbeats, the load they carry, and in-flight requests.

Pure: no I/O, no logging, no transport; time comes from an injected clock.
"""
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from services.router.types import WorkerInfo, WorkerLoad, WorkerRole, WorkerView

Clock = Callable[[], float]


@dataclass(frozen=True, slots=True)
class _Route:
    seq: int  # the route sequence number
    num_tokens: int  # prompt tokens: the KV the request holds on the worker
    num_uncached: int  # of those, the tokens the worker must prefill


@dataclass(slots=True)
class _Worker:
    info: WorkerInfo
    load: WorkerLoad
    expires_at: float
    load_seq: int  # the route sequence number when `load` was reported
    inflight: dict[str, _Route] = field(default_factory=dict)  # req_id -> route, oldest first
    num_inflight_tokens: int = 0  # the sum of `inflight`'s num_tokens

    def add(self, req_id: str, route: _Route) -> None:
        self.inflight[req_id] = route
        self.num_inflight_tokens += route.num_tokens

    def pop(self, req_id: str) -> None:
        route = self.inflight.pop(req_id, None)
        if route is not None:
            self.num_inflight_tokens -= route.num_tokens

    def queued_prefill(self) -> tuple[int, int]:
        """(routes since the last load report, uncached tokens of those and of the newest `num_waiting` before
        them): the prefill work the worker likely still has queued. NOTE: an estimate from route order."""
        num_unreflected = num_tokens = 0
        num_waiting = self.load.num_waiting
        for route in reversed(self.inflight.values()):
            if route.seq > self.load_seq:
                num_unreflected += 1
            elif num_waiting > 0:
                num_waiting -= 1
            else:
                break
            num_tokens += route.num_uncached
        return num_unreflected, num_tokens


@dataclass(frozen=True, slots=True)
class _InFlight:
    worker_ids: tuple[str, ...]
    started_at: float


class Registry:
    """Live workers by id. A worker whose lease has lapsed is invisible at once and removed by `expire`."""

    def __init__(self, clock: Clock, lease_ttl_s: float = 10.0, inflight_ttl_s: float = 600.0):
        self._clock = clock
        self.lease_ttl_s = lease_ttl_s
        self.inflight_ttl_s = inflight_ttl_s
        self._workers: dict[str, _Worker] = {}
        self._inflight: dict[str, _InFlight] = {}
        self._models: set[str] = set()  # every model ever registered: its absence later is UNAVAILABLE
        self._groups: dict[tuple[str, WorkerRole], list[_Worker]] | None = None  # by worker_id; None: stale
        self._seq = 0  # counts routes, so "routed after the last load report" is exact under any clock

    def __len__(self) -> int:
        """Workers held, including lapsed ones the next `expire` will remove."""
        return len(self._workers)

    # ---- leases ----

    def register(self, info: WorkerInfo, load: WorkerLoad) -> bool:
        """Add or replace a worker; True when it was not live before."""
        info.validate()
        old = self._live(info.worker_id)
        rec = _Worker(info, load, self._clock() + self.lease_ttl_s, self._seq)
        if old is not None:  # NOTE: a re-registering worker keeps requests the gateway owns
            rec.inflight, rec.num_inflight_tokens = old.inflight, old.num_inflight_tokens
        self._workers[info.worker_id] = rec
        self._models.add(info.model)
        self._groups = None
        return old is None

    def heartbeat(self, worker_id: str, load: WorkerLoad) -> bool:
        """Renew the lease and record the load; False when the worker must register again."""
        worker = self._live(worker_id)
        if worker is None:
            return False
        worker.load, worker.load_seq = load, self._seq
        worker.expires_at = self._clock() + self.lease_ttl_s
        return True

    def deregister(self, worker_id: str) -> bool:
        return self._remove(worker_id)

    def expire(self, now: float | None = None) -> list[str]:
        """Remove every worker whose lease has lapsed; returns their ids, sorted."""
        now = self._clock() if now is None else now
        lapsed = sorted(w for w, rec in self._workers.items() if rec.expires_at <= now)
        for worker_id in lapsed:
            self._remove(worker_id)
        return lapsed

    # ---- in-flight requests ----

    def add_inflight(self, req_id: str, worker_ids: Iterable[str], num_tokens: int = 0,
                     num_uncached: int = 0) -> None:
        """Count `req_id` (a prompt of `num_tokens`, `num_uncached` of them to prefill) against each worker until
        `complete`; a re-route replaces the old entry."""
        self.complete(req_id)
        self._seq += 1
        live = tuple(w for w in worker_ids if w in self._workers)
        route = _Route(self._seq, num_tokens, num_uncached)
        for worker_id in live:
            self._workers[worker_id].add(req_id, route)
        self._inflight[req_id] = _InFlight(live, self._clock())

    def complete(self, req_id: str) -> bool:
        entry = self._inflight.pop(req_id, None)
        if entry is None:
            return False
        for worker_id in entry.worker_ids:
            if worker_id in self._workers:
                self._workers[worker_id].pop(req_id)
        return True

    def expire_inflight(self, now: float | None = None) -> list[str]:
        """Drop in-flight entries older than the TTL, so a gateway that died leaves no phantom load."""
        now = self._clock() if now is None else now
        stale = sorted(r for r, e in self._inflight.items() if now - e.started_at >= self.inflight_ttl_s)
        for req_id in stale:
            self.complete(req_id)
        return stale

    def num_inflight(self) -> int:
        return len(self._inflight)

    # ---- views ----

    def views(self, model: str | None = None, role: WorkerRole | None = None) -> list[WorkerView]:
        """Live workers, sorted by worker_id, optionally of one model and role."""
        now = self._clock()
        if model is not None and role is not None:  # NOTE: the per-Route case: only that group, pre-sorted
            return [self._view(rec, now) for rec in self._group(model, role) if rec.expires_at > now]
        return [self._view(rec, now) for _, rec in sorted(self._workers.items())
                if rec.expires_at > now and (model is None or rec.info.model == model)
                and (role is None or rec.info.role == role)]

    def _group(self, model: str, role: WorkerRole) -> list[_Worker]:
        if self._groups is None:
            groups: dict[tuple[str, WorkerRole], list[_Worker]] = {}
            for _, rec in sorted(self._workers.items()):
                groups.setdefault((rec.info.model, rec.info.role), []).append(rec)
            self._groups = groups
        return self._groups.get((model, role), [])

    def has_model(self, model: str) -> bool:
        """True when some worker has ever served `model`, live or not."""
        return model in self._models

    def _view(self, rec: _Worker, now: float) -> WorkerView:
        unreflected, queued = rec.queued_prefill()
        return WorkerView(rec.info, rec.load, len(rec.inflight), unreflected, rec.expires_at - now,
                          rec.num_inflight_tokens, queued)

    def _live(self, worker_id: str) -> _Worker | None:
        rec = self._workers.get(worker_id)
        if rec is not None and rec.expires_at <= self._clock():
            self._remove(worker_id)  # lapsed but not yet swept: the same as gone
            return None
        return rec

    def _remove(self, worker_id: str) -> bool:
        rec = self._workers.pop(worker_id, None)
        if rec is None:
            return False
        self._groups = None
        for req_id in rec.inflight:
            self._forget_worker(req_id, worker_id)
        return True

    def _forget_worker(self, req_id: str, worker_id: str) -> None:
        entry = self._inflight.get(req_id)
        if entry is None:
            return
        rest = tuple(w for w in entry.worker_ids if w != worker_id)
        if rest:
            self._inflight[req_id] = _InFlight(rest, entry.started_at)
        else:
            del self._inflight[req_id]
