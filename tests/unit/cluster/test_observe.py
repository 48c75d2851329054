"""What the planner is told of each finished request in the simulator is what a gateway knows from the route it
acted on: which pool computed the first token, and whether a long prompt was overflowed to a decode worker."""

from engines.timing.profile import load_profile
from services.planner.types import WorkerRole
from tandem.bench.traces import TraceRow
from tandem.cluster.des import ClusterSim, SimConfig
from tandem.cluster.observe import SimObserver

P, D = WorkerRole.PREFILL, WorkerRole.DECODE


def test_each_outcome_names_the_pool_that_computed_its_first_token():
    # 20 long prompts at once: the prefill worker queues 4 and the rest overflow; then 5 short ones, prefilled on
    # the decode worker by design (under the 512-token threshold)
    rows = [TraceRow(0.001 * i, 2048, 4, (7_000 + i,)) for i in range(20)]
    rows += [TraceRow(30.0 + i, 64, 4, (9_000 + i,)) for i in range(5)]
    sim = ClusterSim(load_profile(), SimConfig(1, num_prefill_workers=1, disagg_min_tokens=512), "least_loaded")
    records = sim.run(rows)
    observer = SimObserver(sim, rows)
    outcomes = observer.observe(1e6, {}).finished
    assert len(outcomes) == 25
    long, short = outcomes[:20], outcomes[20:]
    disaggregated = [bool(r.prefill_worker_id) for r in records[:20]]
    assert [o.first_token_role is P for o in long] == disaggregated
    assert [o.is_overflow for o in long] == [not d for d in disaggregated]
    assert 0 < sum(disaggregated) < 20  # both kinds are there
    assert all(o.first_token_role is D and not o.is_overflow for o in short)
