"""The sim runner under the one EngineCore: the real scheduler and block manager priced by a profile, stepped in
virtual time as the cluster simulator steps it, on hand-computed cases."""

from engines.base.events import KvEventKind
from engines.base.types import EngineRequest, FinishReason, SamplingParams
from engines.core.sequence import Sequence
from engines.sim.runner import next_token, sim_core
from engines.timing.profile import TimingProfile

# prefill ms = t + 10; decode ms = 5 (flat); 8 blocks of 4 tokens, 2 seqs, 8 tokens per step
PROFILE = TimingProfile("tiny", 4, 8, 2, 8, (0.0, 1.0, 10.0), (0.0, 0.0, 5.0))


def request(req_id: str, tokens, max_tokens: int) -> EngineRequest:
    return EngineRequest(req_id, tuple(tokens), SamplingParams(max_tokens=max_tokens, ignore_eos=True))


def run(core) -> list[tuple[float, str, int]]:
    """Step to the end in virtual time; (time, req_id, output tokens so far) per emitted token."""
    now, log, counts = 0.0, [], {}
    while (out := core.schedule()) is not None:
        now += core.runner.step_duration(out)
        for output in core.commit(out, core.launch(out).wait()):
            counts[output.req_id] = counts.get(output.req_id, 0) + len(output.new_token_ids)
            log.append((round(now, 9), output.req_id, counts[output.req_id]))
    return log


def test_one_request_prefill_then_decodes():
    core = sim_core(PROFILE, time_factor=0.0)
    core.add(request("a", range(8), 3))
    assert run(core) == [(0.018, "a", 1), (0.023, "a", 2), (0.028, "a", 3)]


def test_chunked_prefill_and_mixed_step():
    core = sim_core(PROFILE, time_factor=0.0)
    core.add(request("a", range(6), 2))
    core.add(request("b", range(100, 106), 1))
    # step 1: a's 6 + b's first 2 tokens (budget 8) = 18 ms; a samples
    # step 2: a decodes (5 ms) + b's last 4 tokens (14 ms) = 19 ms; both sample, both finish
    assert run(core) == [(0.018, "a", 1), (0.037, "a", 2), (0.037, "b", 1)]


def test_prefix_hit_shortens_prefill_and_events_are_real():
    core = sim_core(PROFILE, time_factor=0.0)
    core.add(request("a", range(9), 1))
    assert run(core) == [(0.029, "a", 1)]  # 9 tokens > budget 8: chunks of 8 (18 ms) and 1 (11 ms)
    first = core.drain_kv_events()
    core.add(request("b", range(9), 1))  # 8 of 9 tokens cached: prefill 1 token = 11 ms
    assert run(core) == [(0.011, "b", 1)]
    assert core.scheduler.prefix_hits == 8
    stored = [e for e in first + core.drain_kv_events() if e.kind is KvEventKind.STORED]
    assert sum(len(e.block_hashes) for e in stored) == 2  # a's two full blocks, each stored once


def test_min_tokens_keeps_stop_tokens_out_until_reached():
    prompt = tuple(range(4))
    first = next_token(Sequence("probe", list(prompt), len(prompt), SamplingParams()))  # a 4-token prompt's first
    core = sim_core(PROFILE, time_factor=0.0)
    core.add(EngineRequest("stop", prompt, SamplingParams(max_tokens=4, stop_token_ids=(first,))))
    core.add(EngineRequest("min", prompt, SamplingParams(max_tokens=4, stop_token_ids=(first,), min_tokens=3)))
    tokens, reasons = {}, {}
    while (out := core.schedule()) is not None:
        for o in core.commit(out, core.launch(out).wait()):
            tokens.setdefault(o.req_id, []).extend(o.new_token_ids)
            reasons[o.req_id] = o.finish_reason
    assert tokens["stop"] == [first] and reasons["stop"] is FinishReason.STOP
    assert tokens["min"][0] == first + 1 and len(tokens["min"]) == 4  # the stop token was skipped, not sampled
    assert reasons["min"] is FinishReason.LENGTH
