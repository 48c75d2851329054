"""The cluster simulator: a discrete-event loop in virtual time over N SimWorkers, each arrival routed by the
router's real RouterCore, Registry (on the virtual clock), policy and PrefixIndex (fed by KV events).

No gRPC, no sleeping, no wall clock: the same trace and seed give the same result.
"""
import heapq
from collections.abc import Callable
from dataclasses import dataclass

from engines.base.types import KvLayout
from engines.native.sequence import Sequence
from engines.sim.profile import TimingProfile
from engines.sim.sim_core import SimWorker, StepPlan
from services.router.core import RouterCore
from services.router.policy import DisaggregationPolicy
from services.router.registry import Registry
from services.router.types import RouteInput, WorkerInfo, WorkerLoad, WorkerRole
from tandem.bench.traces import TraceRow
from tandem.sim.policies import make_sim_policy
from tandem.sim.tokens import prompt_tokens

MODEL = "sim"
_FOREVER = 1e18  # leases and in-flight entries never lapse in a simulation


class SimStuckError(RuntimeError):
    """A worker holds work it can never schedule (e.g. a prompt larger than its whole KV cache)."""


@dataclass(frozen=True, slots=True)
class SimConfig:
    num_workers: int
    num_prefill_workers: int = 0
    seed: int = 0
    disagg_min_tokens: int = 512
    enable_prefix_caching: bool = True
    kv_overlap_weight: float = 1.0  # KvPolicyConfig.overlap_weight (the router's default is 1.0)
    heartbeat_interval_s: float = 2.0  # as services/router/settings.py tells workers; 0 = after every change


@dataclass(slots=True)
class RequestRecord:
    req_id: str
    arrival_s: float
    num_prompt_tokens: int
    num_output_tokens: int
    worker_id: str = ""
    prefill_worker_id: str = ""
    num_cached_tokens: int = 0
    first_token_s: float = -1.0
    finish_s: float = -1.0


class ClusterSim:
    def __init__(self, profile: TimingProfile, config: SimConfig, policy_name: str):
        self.profile, self.config = profile, config
        self.now = 0.0
        self.registry = Registry(lambda: self.now, lease_ttl_s=_FOREVER, inflight_ttl_s=_FOREVER)
        layout = KvLayout(32, 8, 128, "bfloat16", profile.block_size)  # NOTE: routing reads only block_size
        self.policy, self.index = make_sim_policy(policy_name, lambda: self.now, layout, config.seed,
                                                    config.kv_overlap_weight)
        self.core = RouterCore(self.registry, self.policy, DisaggregationPolicy(config.disagg_min_tokens))
        self.workers: dict[str, SimWorker] = {}
        for role, count, prefix in ((WorkerRole.DECODE, config.num_workers, "decode"),
                                    (WorkerRole.PREFILL, config.num_prefill_workers, "prefill")):
            for i in range(count):
                self._add_worker(f"{prefix}-{i:03d}", role, layout)
        self.records: dict[str, RequestRecord] = {}
        self.num_routed = {w: 0 for w in self.workers}
        self._heap: list[tuple[float, int, str, object]] = []
        self._order = 0
        self._busy: set[str] = set()
        self._live: dict[str, int] = {}  # req_id -> decode tokens still to come after a prefill hand-off
        self._hooks: list[tuple[float, Callable[[float], None]]] = []
        self._layout = layout

    # -- scaling: what the planner's virtual connector calls ---------------------------------
    def add_worker(self, role: WorkerRole) -> str:
        """A new worker of `role`, routable from now on; returns its id."""
        prefix = "prefill" if role is WorkerRole.PREFILL else "decode"
        worker_id = f"{prefix}-{sum(w.startswith(prefix) for w in self.workers):03d}"
        self._add_worker(worker_id, role, self._layout)
        self.num_routed[worker_id] = 0
        return worker_id

    def remove_worker(self, worker_id: str) -> None:
        """Stop routing to `worker_id`; it keeps what it holds and finishes it (see `is_drained`)."""
        self.registry.deregister(worker_id)

    def is_drained(self, worker_id: str) -> bool:
        """True once the worker holds no request and none is on its way to it (a KV hand-off)."""
        if self.workers[worker_id].has_work or worker_id in self._busy:
            return False
        incoming = any(kind == "handoff" and payload[0] == worker_id for _, _, kind, payload in self._heap)
        return not incoming and not any(self.records[r].worker_id == worker_id for r in self._live)

    def every(self, interval_s: float, hook: Callable[[float], None]) -> None:
        """Call `hook(now)` every `interval_s` of virtual time from the start of `run` until the trace is done."""
        self._hooks.append((interval_s, hook))

    def _add_worker(self, worker_id: str, role: WorkerRole, layout: KvLayout) -> None:
        self.workers[worker_id] = SimWorker(worker_id, self.profile, self.config.enable_prefix_caching)
        info = WorkerInfo(worker_id, role, f"sim://{worker_id}", MODEL, layout, self.profile.max_num_seqs)
        self.registry.register(info, self._load(worker_id))

    # -- the loop ----------------------------------------------------------------------------
    def run(self, rows: list[TraceRow]) -> list[RequestRecord]:
        """Replay `rows` (sorted by arrival) to the end; every request's timing, in arrival order."""
        i = 0
        if self.config.heartbeat_interval_s > 0:
            self._push(self.config.heartbeat_interval_s, "beat", ())
        for interval_s, hook in self._hooks:
            self._push(interval_s, "hook", (interval_s, hook))
        while i < len(rows) or self._heap:
            if i < len(rows) and (not self._heap or rows[i].arrival_s < self._heap[0][0]):
                self.now = max(self.now, rows[i].arrival_s)
                self._arrive(rows[i], i)
                i += 1
                continue
            self.now, _, kind, payload = heapq.heappop(self._heap)
            if kind == "step":
                self._end_step(*payload)
            elif kind == "beat":
                self._beat(more=i < len(rows) or self._has_work())
            elif kind == "hook":
                self._hook(*payload, more=i < len(rows) or self._has_work())
            else:
                self._hand_off(*payload)
        return list(self.records.values())

    def _push(self, at: float, kind: str, payload: object) -> None:
        self._order += 1
        heapq.heappush(self._heap, (at, self._order, kind, payload))

    # -- events ------------------------------------------------------------------------------
    def _arrive(self, row: TraceRow, index: int) -> None:
        req_id = f"req-{index:06d}"
        tokens = prompt_tokens(row, index)
        decision = self.core.route(RouteInput(req_id, MODEL, tuple(tokens)))
        record = RequestRecord(req_id, row.arrival_s, len(tokens), row.osl, decision.decode.worker_id)
        self.records[req_id] = record
        self.num_routed[record.worker_id] += 1
        if decision.prefill is None:
            self._submit(record.worker_id, req_id, tokens, row.osl)
            return
        record.prefill_worker_id = decision.prefill.worker_id
        self._live[req_id] = row.osl - 1
        self._submit(record.prefill_worker_id, req_id, tokens, 1)

    def _submit(self, worker_id: str, req_id: str, tokens: list[int], max_tokens: int,
                num_imported: int = 0) -> None:
        worker = self.workers[worker_id]
        seq = worker.make_seq(req_id, tokens, max_tokens)
        if num_imported:
            worker.import_kv(seq, num_imported)
        worker.add(seq)
        self._report(worker_id)
        self._maybe_start(worker_id)

    def _maybe_start(self, worker_id: str) -> None:
        worker = self.workers[worker_id]
        if worker_id in self._busy or not worker.has_work:
            return
        plan = worker.begin_step()
        if plan is None:
            raise SimStuckError(f"{worker_id} has work it cannot schedule at t={self.now:.3f}s")
        self._busy.add(worker_id)
        self._push(self.now + plan.duration_s, "step", (worker_id, plan))

    def _end_step(self, worker_id: str, plan: StepPlan) -> None:
        worker = self.workers[worker_id]
        self._busy.discard(worker_id)
        result = worker.end_step(plan)
        for seq in result.emitted:
            record = self.records[seq.req_id]
            if record.first_token_s < 0:
                record.first_token_s = self.now
                record.num_cached_tokens = seq.num_cached_tokens
        for seq in result.finished:
            self._finish(worker_id, seq)
        if self.index is not None and result.events:
            self.index.apply(worker_id, result.events)
        self._report(worker_id)
        self._maybe_start(worker_id)

    def _finish(self, worker_id: str, seq: Sequence) -> None:
        record = self.records[seq.req_id]
        remaining = self._live.pop(seq.req_id, 0) if worker_id == record.prefill_worker_id else 0
        if remaining > 0:  # prefilled elsewhere: the KV travels, then the decode worker takes over
            arrive = self.now + self.profile.transfer_s(seq.num_prompt_tokens)
            self._push(arrive, "handoff", (record.worker_id, seq.req_id, seq.token_ids, seq.num_prompt_tokens,
                                           remaining))
            return
        record.finish_s = self.now
        self.registry.complete(seq.req_id)

    def _hand_off(self, worker_id: str, req_id: str, tokens: list[int], num_kv: int, remaining: int) -> None:
        self._submit(worker_id, req_id, tokens, remaining, num_imported=num_kv)

    def _load(self, worker_id: str) -> WorkerLoad:
        worker = self.workers[worker_id]
        sched, bm = worker.scheduler, worker.block_manager
        return WorkerLoad(num_waiting=len(sched.waiting), num_running=len(sched.running),
                          num_blocks_used=bm.num_blocks - bm.num_free_blocks, num_blocks_total=bm.num_blocks,
                          max_num_seqs=self.profile.max_num_seqs)

    def _report(self, worker_id: str) -> None:
        """With no heartbeat interval, the router sees each worker's load after every change."""
        if self.config.heartbeat_interval_s <= 0:
            self.registry.heartbeat(worker_id, self._load(worker_id))

    def _has_work(self) -> bool:
        """Events other than the periodic ones are pending (each periodic event must not keep the other alive)."""
        return any(kind not in ("beat", "hook") for _, _, kind, _ in self._heap)

    def _hook(self, interval_s: float, hook: Callable[[float], None], more: bool) -> None:
        hook(self.now)
        if more:
            self._push(self.now + interval_s, "hook", (interval_s, hook))

    def _beat(self, more: bool) -> None:
        """Every worker reports its load, as live workers do each heartbeat interval."""
        for worker_id in self.workers:
            self.registry.heartbeat(worker_id, self._load(worker_id))
        if more:
            self._push(self.now + self.config.heartbeat_interval_s, "beat", ())
