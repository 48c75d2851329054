"""SimWorker: the real scheduler and block manager priced by a profile, on hand-computed cases."""
from engines.base.events import KvEventKind
from engines.sim.profile import TimingProfile
from engines.sim.sim_core import SimWorker

# prefill ms = t + 10; decode ms = 5 (flat); 8 blocks of 4 tokens, 2 seqs, 8 tokens per step
PROFILE = TimingProfile("tiny", 4, 8, 2, 8, (0.0, 1.0, 10.0), (0.0, 0.0, 5.0))


def run(worker: SimWorker) -> list[tuple[float, str, int]]:
    """Step to the end; (virtual time, req_id, output tokens so far) per emitted token."""
    now, log = 0.0, []
    while worker.has_work:
        plan = worker.begin_step()
        now += plan.duration_s
        log += [(round(now, 9), s.req_id, s.num_output_tokens) for s in worker.end_step(plan).emitted]
    return log


def test_one_request_prefill_then_decodes():
    w = SimWorker("w", PROFILE)
    w.add(w.make_seq("a", list(range(8)), 3))
    assert run(w) == [(0.018, "a", 1), (0.023, "a", 2), (0.028, "a", 3)]
    assert w.num_steps == 3 and w.busy_s == 0.028


def test_chunked_prefill_and_mixed_step():
    w = SimWorker("w", PROFILE)
    w.add(w.make_seq("a", list(range(6)), 2))
    w.add(w.make_seq("b", list(range(100, 106)), 1))
    # step 1: a's 6 + b's first 2 tokens (budget 8) = 18 ms; a samples
    # step 2: a decodes (5 ms) + b's last 4 tokens (14 ms) = 19 ms; both sample, both finish
    assert run(w) == [(0.018, "a", 1), (0.037, "a", 2), (0.037, "b", 1)]


def test_prefix_hit_shortens_prefill_and_events_are_real():
    w = SimWorker("w", PROFILE)
    w.add(w.make_seq("a", list(range(9)), 1))
    assert run(w) == [(0.029, "a", 1)]  # 9 tokens > budget 8: chunks of 8 (18 ms) and 1 (11 ms)
    events = w.drain_events()
    assert w.event_log.last_seq >= 1
    w.add(w.make_seq("b", list(range(9)), 1))  # 8 of 9 tokens cached: prefill 1 token = 11 ms
    assert run(w) == [(0.011, "b", 1)]
    assert w.scheduler.prefix_hits == 8
    stored = [e for e in w.event_log.since(0) if e.kind is KvEventKind.STORED]
    assert sum(len(e.block_hashes) for e in stored) == 2  # a's two full blocks, each stored once
    assert events == []  # end_step drained them already
