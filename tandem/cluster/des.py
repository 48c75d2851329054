"""The cluster simulator: a discrete-event loop in virtual time over N engines (the one EngineCore over the sim
runner, whose step duration the loop reads instead of sleeping), each arrival routed by the router's real
RouterCore, Registry (on the virtual clock), policy and PrefixIndex (fed by the engines' KV events).

No gRPC, no sleeping, no wall clock: the same trace and seed give the same result.
"""

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field

from engines.base.types import EngineRequest, FinishReason, KvLayout, RequestOutput, SamplingParams
from engines.core.engine_core import EngineCore
from engines.core.runner import zero_kv_export
from engines.core.step import SchedulerOutput
from engines.sim.runner import sim_core
from engines.timing.profile import TimingProfile
from services.router.types import RouteInput, WorkerInfo, WorkerLoad, WorkerRole, tier_load
from tandem.bench.traces import TraceRow
from tandem.cluster.routers import SimRouters
from tandem.cluster.tokens import prompt_tokens

MODEL = "sim"


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
    kv_inflight_weight: float = 0.1  # KvPolicyConfig.inflight_weight (the router's default is 0.1)
    heartbeat_interval_s: float = 2.0  # as services/router/settings.py tells workers; 0 = after every change
    # prefill workers' load after every change, heartbeats or not (the live workers' load stream)
    prefill_load_stream: bool = True
    num_routers: int = 1  # router replicas, each deciding on its own view (tandem/cluster/routers.py)
    kv_host_gb: float = 0.0  # per worker: a host KV tier (and a disk tier under it), loading at the profile's
    kv_disk_gb: float = 0.0  # copy bandwidths


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


@dataclass(slots=True)
class SimNode:
    """One simulated worker: its engine and the virtual time it spent stepping."""

    core: EngineCore
    busy_s: float = 0.0
    num_steps: int = 0
    prompts: dict[str, list[int]] = field(default_factory=dict)  # prefill role: held until the hand-off

    @property
    def scheduler(self):
        return self.core.scheduler

    @property
    def block_manager(self):
        return self.core.block_manager

    @property
    def has_work(self) -> bool:
        return self.core.has_work

    @property
    def num_generated_tokens(self) -> int:
        return self.core.scheduler.num_generated_tokens


class ClusterSim:
    def __init__(self, profile: TimingProfile, config: SimConfig, policy_name: str):
        self.profile, self.config = profile, config
        self.now = 0.0
        layout = KvLayout(32, 8, 128, "bfloat16", profile.block_size)  # NOTE: routing reads only block_size
        self.routers = SimRouters(
            config.num_routers,
            policy_name,
            lambda: self.now,
            layout,
            config.seed,
            config.kv_overlap_weight,
            config.kv_inflight_weight,
            config.disagg_min_tokens,
        )
        # the first replica: what one router sees (the planner and the observers read it)
        self.registry, self.index, self.core = self.routers.first
        self.policy = self.core.policy
        self.workers: dict[str, SimNode] = {}
        self.added_s: dict[str, float] = {}  # when each worker began serving (0: at the start)
        self._prefill_ids: set[str] = set()
        for role, count, prefix in (
            (WorkerRole.DECODE, config.num_workers, "decode"),
            (WorkerRole.PREFILL, config.num_prefill_workers, "prefill"),
        ):
            for i in range(count):
                self._add_worker(f"{prefix}-{i:03d}", role, layout)
        self.records: dict[str, RequestRecord] = {}
        self.num_routed = {w: 0 for w in self.workers}
        self._heap: list[tuple[float, int, str, object]] = []
        self._order = 0
        self._busy: set[str] = set()
        self._load_wakeups: set[tuple[str, float]] = set()  # (worker, time) of a load's end already on the heap
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
        self.routers.deregister(worker_id)

    def is_drained(self, worker_id: str) -> bool:
        """True once the worker holds no request (held KV included) and none is on its way to it (a KV hand-off,
        or a prefill elsewhere whose decode goes there)."""
        worker = self.workers[worker_id]
        if worker.has_work or worker.core.has_loads or worker.prompts or worker_id in self._busy:
            return False
        incoming = any(kind == "handoff" and payload[1] == worker_id for _, _, kind, payload in self._heap)
        prefilling = any(self.records[r].worker_id == worker_id for w in self.workers.values() for r in w.prompts)
        return not incoming and not prefilling

    def every(self, interval_s: float, hook: Callable[[float], None]) -> None:
        """Call `hook(now)` every `interval_s` of virtual time from the start of `run` until the trace is done."""
        self._hooks.append((interval_s, hook))

    def _add_worker(self, worker_id: str, role: WorkerRole, layout: KvLayout) -> None:
        core = sim_core(
            self.profile,
            time_factor=0.0,
            enable_prefix_caching=self.config.enable_prefix_caching,
            clock=lambda: self.now,
            kv_host_gb=self.config.kv_host_gb,
            kv_disk_gb=self.config.kv_disk_gb,
            load_time_factor=1.0,
        )
        self.workers[worker_id] = SimNode(core)
        self.added_s[worker_id] = self.now
        if role is WorkerRole.PREFILL:
            self._prefill_ids.add(worker_id)
        info = WorkerInfo(worker_id, role, f"sim://{worker_id}", MODEL, layout, self.profile.max_num_seqs)
        self.routers.register(info, self._load(worker_id))

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
            elif kind == "load":
                self._load_ended(*payload)
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
        decision = self.routers.route(RouteInput(req_id, MODEL, tuple(tokens)))
        record = RequestRecord(req_id, row.arrival_s, len(tokens), row.osl, decision.decode.worker_id)
        self.records[req_id] = record
        self.num_routed[record.worker_id] += 1
        request = EngineRequest(req_id, tuple(tokens), SamplingParams(max_tokens=row.osl, ignore_eos=True))
        if decision.prefill is None:
            self._submit(record.worker_id, request)
            return
        record.prefill_worker_id = decision.prefill.worker_id
        self.workers[record.prefill_worker_id].prompts[req_id] = tokens
        self._submit(
            record.prefill_worker_id, EngineRequest(req_id, request.prompt_token_ids, request.params, hold_kv=True)
        )

    def _submit(self, worker_id: str, request: EngineRequest) -> None:
        core = self.workers[worker_id].core
        core.add(request)
        if request.kv is not None:  # NOTE: a KvExport's load ends as it starts: the live loop's next poll applies it
            core.poll_loads()
        self._report(worker_id)
        self._maybe_start(worker_id)

    def _maybe_start(self, worker_id: str) -> None:
        worker = self.workers[worker_id]
        if worker_id in self._busy or not worker.has_work:
            return
        out = worker.core.schedule()
        self._wake_at_load_end(worker_id)
        if out is None:
            if worker.core.has_loads:  # NOTE: what waits is loading; the load's end starts it
                return
            raise SimStuckError(f"{worker_id} has work it cannot schedule at t={self.now:.3f}s")
        self._busy.add(worker_id)
        duration = worker.core.runner.step_duration(out)
        self._push(self.now + duration, "step", (worker_id, out, duration))

    def _end_step(self, worker_id: str, out: SchedulerOutput, duration: float) -> None:
        worker = self.workers[worker_id]
        self._busy.discard(worker_id)
        worker.busy_s += duration
        worker.num_steps += 1
        for output in worker.core.commit(out, worker.core.launch(out).wait()):
            record = self.records[output.req_id]
            if record.first_token_s < 0 and output.new_token_ids:
                record.first_token_s = self.now
                record.num_cached_tokens = output.num_cached_tokens
            if output.finished:
                self._finish(worker_id, output)
        if worker.core.scheduler.importing:  # NOTE: imports waiting for the blocks the step may have freed
            worker.core.poll_loads()
        self.routers.apply_events(worker_id, worker.core.drain_kv_events())
        self._report(worker_id)
        self._maybe_start(worker_id)

    def _wake_at_load_end(self, worker_id: str) -> None:
        tiers = self.workers[worker_id].core.runner.tiers
        due = tiers.next_due() if tiers is not None else None
        if due is not None and (worker_id, due) not in self._load_wakeups:
            self._load_wakeups.add((worker_id, due))
            self._push(due, "load", (worker_id, due))

    def _load_ended(self, worker_id: str, due: float) -> None:
        self._load_wakeups.discard((worker_id, due))
        worker = self.workers[worker_id]
        worker.core.poll_loads()
        self.routers.apply_events(worker_id, worker.core.drain_kv_events())
        self._wake_at_load_end(worker_id)
        self._report(worker_id)
        self._maybe_start(worker_id)

    def _finish(self, worker_id: str, output: RequestOutput) -> None:
        record = self.records[output.req_id]
        if output.finish_reason is FinishReason.PREFILLED:  # the KV travels, then the decode worker goes on
            arrive = self.now + self.profile.transfer_s(output.num_prompt_tokens)
            self._push(arrive, "handoff", (worker_id, record.worker_id, output.req_id, output.new_token_ids[-1]))
            return
        record.finish_s = self.now
        if worker_id == record.prefill_worker_id:  # NOTE: one token, the prefill's own: nothing travels on
            self.workers[worker_id].prompts.pop(output.req_id, None)
        self.routers.complete(output.req_id)

    def _hand_off(self, prefill_id: str, decode_id: str, req_id: str, first_token: int) -> None:
        prefill = self.workers[prefill_id]
        prompt = tuple(prefill.prompts.pop(req_id))
        kv = zero_kv_export(prefill.core.info.kv_layout, prefill.block_manager.num_blocks_for(len(prompt)), prompt)
        prefill.core.release_kv(req_id)  # NOTE: a completed pull ends the lease
        self._report(prefill_id)
        self._maybe_start(prefill_id)
        params = SamplingParams(max_tokens=self.records[req_id].num_output_tokens, ignore_eos=True)
        self._submit(decode_id, EngineRequest(req_id, prompt, params, kv=kv, output_token_ids=(first_token,)))

    def _load(self, worker_id: str) -> WorkerLoad:
        stats = self.workers[worker_id].core.stats()
        return WorkerLoad(
            num_waiting=stats.num_waiting,
            num_running=stats.num_running,
            num_held=stats.num_held,
            num_blocks_used=stats.num_blocks_used,
            num_blocks_total=stats.num_blocks_total,
            max_num_seqs=self.profile.max_num_seqs,
            **tier_load(stats),
        )

    def _report(self, worker_id: str) -> None:
        """With no heartbeat interval, the router sees each worker's load after every change; a prefill worker's
        too with the load stream on (live: `StreamLoad`), so the disaggregation check reads its real queue."""
        if self.config.heartbeat_interval_s <= 0 or (
            self.config.prefill_load_stream and worker_id in self._prefill_ids
        ):
            self.routers.heartbeat(worker_id, self._load(worker_id))

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
            self.routers.heartbeat(worker_id, self._load(worker_id))
        if more:
            self._push(self.now + self.config.heartbeat_interval_s, "beat", ())
