"""The worker registry: leases renewed by heartbeats, the load they carry, in-flight requests, and quarantine
(a worker the gateway just saw fail is avoided for a while). A lapsed lease is not yet an eviction: the shell
probes the worker first and `extend`s a slow one's lease; an evicted worker that comes back gets its in-flight
requests back.

Pure: no I/O, no logging, no transport; time comes from an injected clock.
"""

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from services.router.load_arrays import GroupArrays, common_block_size
from services.router.types import WorkerInfo, WorkerLoad, WorkerRole, WorkerView

Clock = Callable[[], float]


class _Route(NamedTuple):  # NOTE: a tuple, not a frozen dataclass: one is built per Route, and cheaply
    seq: int  # the route sequence number
    num_tokens: int  # prompt tokens
    num_uncached: int  # of those, the tokens the worker must prefill: the KV the request adds to what it holds


@dataclass(slots=True)
class _Worker:
    info: WorkerInfo
    load: WorkerLoad
    expires_at: float
    load_seq: int  # the route sequence number when `load` was reported
    inflight: dict[str, _Route] = field(default_factory=dict)  # req_id -> route, oldest first
    # the sum of `inflight`'s num_uncached: the KV they added. NOTE: not their whole prompts: a cached prefix is
    # held once however many requests share it, and counting it per request made siblings of a busy tenant spill
    # to workers without its context, whose second copies overflowed the KV at high load (docs/llmd-replay.md)
    num_inflight_tokens: int = 0
    num_extensions: int = 0  # leases granted by a probe since the last heartbeat

    def add(self, req_id: str, route: _Route) -> None:
        self.inflight[req_id] = route
        self.num_inflight_tokens += route.num_uncached

    def pop(self, req_id: str) -> None:
        route = self.inflight.pop(req_id, None)
        if route is not None:
            self.num_inflight_tokens -= route.num_uncached

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


class _InFlight(NamedTuple):
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
        self._arrays: dict[tuple[str, WorkerRole], GroupArrays] = {}  # the groups as arrays (built on demand)
        self._dirty: set[str] = set()  # workers whose rows in `_arrays` are out of date
        self._seq = 0  # counts routes, so "routed after the last load report" is exact under any clock
        self._quarantined: dict[str, float] = {}  # worker_id -> until
        self._evicted: dict[str, dict[str, _Route]] = {}  # worker_id -> its in-flight routes when it was evicted

    def __len__(self) -> int:
        """Workers held, including lapsed ones the next `expire` will remove."""
        return len(self._workers)

    # ---- leases ----

    def register(self, info: WorkerInfo, load: WorkerLoad) -> bool:
        """Add or replace a worker; True when it was not live before. A worker that registers is serving now: it
        leaves quarantine, and one that was evicted gets back the requests still counted against it."""
        info.validate()
        old = self._live(info.worker_id)
        rec = _Worker(info, load, self._clock() + self.lease_ttl_s, self._seq)
        if old is not None:  # NOTE: a re-registering worker keeps requests the gateway owns
            rec.inflight, rec.num_inflight_tokens = old.inflight, old.num_inflight_tokens
        for req_id, route in self._evicted.pop(info.worker_id, {}).items():
            rec.add(req_id, route)
        self._workers[info.worker_id] = rec
        self._quarantined.pop(info.worker_id, None)
        self._models.add(info.model)
        self._groups, self._arrays = None, {}
        return old is None

    def heartbeat(self, worker_id: str, load: WorkerLoad) -> bool:
        """Renew the lease and record the load; False when the worker must register again. A lapsed lease not yet
        swept is renewed too: the worker was slow, not gone."""
        worker = self._workers.get(worker_id)
        if worker is None:
            return False
        worker.load, worker.load_seq, worker.num_extensions = load, self._seq, 0
        worker.expires_at = self._clock() + self.lease_ttl_s
        self._dirty.add(worker_id)
        return True

    def report_load(self, worker_id: str, load: WorkerLoad) -> bool:
        """A load the worker streamed between heartbeats: recorded as a heartbeat's is (routes before it count as
        reflected), but it renews no lease. False for a worker not held."""
        worker = self._workers.get(worker_id)
        if worker is None:
            return False
        worker.load, worker.load_seq = load, self._seq
        self._dirty.add(worker_id)
        return True

    def deregister(self, worker_id: str) -> bool:
        return self._remove(worker_id)

    def lapsed(self, now: float | None = None) -> list[str]:
        """Workers whose lease has run out (invisible to routing already), sorted; `extend` or `evict` each."""
        now = self._clock() if now is None else now
        return sorted(w for w, rec in self._workers.items() if rec.expires_at <= now)

    def is_lapsed(self, worker_id: str) -> bool:
        rec = self._workers.get(worker_id)
        return rec is not None and rec.expires_at <= self._clock()

    def info(self, worker_id: str) -> WorkerInfo | None:
        """A held worker's registration, lapsed or not."""
        rec = self._workers.get(worker_id)
        return rec.info if rec is not None else None

    def extend(self, worker_id: str, max_extensions: int) -> bool:
        """One more lease for a lapsed worker that still answers (a probe said so); False when it has had
        `max_extensions` since its last heartbeat, or is gone."""
        rec = self._workers.get(worker_id)
        if rec is None or rec.num_extensions >= max_extensions:
            return False
        rec.num_extensions += 1
        rec.expires_at = self._clock() + self.lease_ttl_s
        self._dirty.add(worker_id)
        return True

    def evict(self, worker_id: str) -> bool:
        """Remove a worker whose lease lapsed; its in-flight requests wait for it to register again."""
        rec = self._workers.get(worker_id)
        if rec is None:
            return False
        self._evicted[worker_id] = dict(rec.inflight)
        return self._remove(worker_id, forget_inflight=False)

    def expire(self, now: float | None = None) -> list[str]:
        """Evict every worker whose lease has lapsed, probing none; returns their ids, sorted."""
        lapsed = self.lapsed(now)
        for worker_id in lapsed:
            self.evict(worker_id)
        return lapsed

    # ---- quarantine ----

    def quarantine(self, worker_id: str, duration_s: float) -> bool:
        """Avoid a worker for `duration_s` (a gateway saw it fail); False for a worker not held."""
        if worker_id not in self._workers:
            return False
        self._quarantined[worker_id] = max(self._quarantined.get(worker_id, 0.0), self._clock() + duration_s)
        return True

    def quarantine_left_s(self, worker_id: str) -> float:
        until = self._quarantined.get(worker_id)
        if until is None:
            return 0.0
        left = until - self._clock()
        if left <= 0:
            del self._quarantined[worker_id]
        return max(left, 0.0)

    # ---- in-flight requests ----

    def add_inflight(self, req_id: str, worker_ids: Iterable[str], num_tokens: int = 0, num_uncached: int = 0) -> None:
        """Count `req_id` (a prompt of `num_tokens`, `num_uncached` of them to prefill) against each worker until
        `complete`; a re-route replaces the old entry."""
        if req_id in self._inflight:
            self.complete(req_id)
        self._seq += 1
        workers = self._workers
        live = tuple(w for w in worker_ids if w in workers)
        route = _Route(self._seq, num_tokens, num_uncached)
        for worker_id in live:
            workers[worker_id].add(req_id, route)
        self._dirty.update(live)
        self._inflight[req_id] = _InFlight(live, self._clock())

    def complete(self, req_id: str) -> bool:
        entry = self._inflight.pop(req_id, None)
        if entry is None:
            return False
        for worker_id in entry.worker_ids:
            if worker_id in self._workers:
                self._workers[worker_id].pop(req_id)
                self._dirty.add(worker_id)
            elif worker_id in self._evicted:
                self._evicted[worker_id].pop(req_id, None)
                if not self._evicted[worker_id]:
                    del self._evicted[worker_id]
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
        return [
            self._view(rec, now)
            for _, rec in sorted(self._workers.items())
            if rec.expires_at > now
            and (model is None or rec.info.model == model)
            and (role is None or rec.info.role == role)
        ]

    def _group(self, model: str, role: WorkerRole) -> list[_Worker]:
        if self._groups is None:
            groups: dict[tuple[str, WorkerRole], list[_Worker]] = {}
            for _, rec in sorted(self._workers.items()):
                groups.setdefault((rec.info.model, rec.info.role), []).append(rec)
            self._groups = groups
            self._arrays = {}
        return self._groups.get((model, role), [])

    def arrays(self, model: str, role: WorkerRole) -> GroupArrays:
        """The group's workers (lapsed ones too: compare `expires_at` with the clock) as arrays, rows by worker_id."""
        key = (model, role)
        group = self._arrays.get(key)
        if group is None:
            recs = self._group(model, role)
            group = self._arrays[key] = GroupArrays.empty(
                [rec.info.worker_id for rec in recs],
                common_block_size([rec.info.layout.block_size if rec.info.layout else 0 for rec in recs]),
            )
            for row, rec in enumerate(recs):
                self._fill(group, row, rec)
        for worker_id in self._dirty:
            dirty = self._workers.get(worker_id)
            if dirty is not None and (arrays := self._arrays.get((dirty.info.model, dirty.info.role))) is not None:
                self._fill(arrays, arrays.row_of[worker_id], dirty)
        self._dirty.clear()
        return group

    def view(self, worker_id: str) -> WorkerView | None:
        """One held worker's view (what `views` would say of it)."""
        rec = self._workers.get(worker_id)
        return self._view(rec, self._clock()) if rec is not None else None

    def has_quarantine(self) -> bool:
        """Some worker may be quarantined (an entry past its time is dropped when next asked about)."""
        return bool(self._quarantined)

    @staticmethod
    def _fill(group: GroupArrays, row: int, rec: _Worker) -> None:
        unreflected, queued = rec.queued_prefill()
        load = rec.load
        kv_used = load.num_blocks_used / load.num_blocks_total if load.num_blocks_total else 0.0
        group.set_row(
            row,
            rec.expires_at,
            rec.num_inflight_tokens,
            queued,
            load.num_running + load.num_waiting + unreflected,
            rec.info.max_num_seqs or load.max_num_seqs or 1,
            kv_used,
        )

    def now(self) -> float:
        """The registry's clock (what `GroupArrays.expires_at` is compared with)."""
        return self._clock()

    def has_model(self, model: str) -> bool:
        """True when some worker has ever served `model`, live or not."""
        return model in self._models

    def _view(self, rec: _Worker, now: float) -> WorkerView:
        unreflected, queued = rec.queued_prefill()
        return WorkerView(
            rec.info, rec.load, len(rec.inflight), unreflected, rec.expires_at - now, rec.num_inflight_tokens, queued
        )

    def _live(self, worker_id: str) -> _Worker | None:
        rec = self._workers.get(worker_id)
        if rec is not None and rec.expires_at <= self._clock():
            self.evict(worker_id)  # lapsed but not yet swept: the same as gone
            return None
        return rec

    def _remove(self, worker_id: str, forget_inflight: bool = True) -> bool:
        rec = self._workers.pop(worker_id, None)
        if rec is None:
            return False
        self._groups, self._arrays = None, {}
        self._quarantined.pop(worker_id, None)
        if forget_inflight:
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
