"""A stopping worker drains: it waits until its engine holds no waiting, running or held (KV not yet pulled)
request, bounded by the drain time."""
from engines.base.types import EngineStats
from services.common.worker_base import wait_idle


class Engine:
    def __init__(self, loads: list[tuple[int, int, int]]):
        self.loads = loads  # (waiting, running, held) per stats() call; the last one repeats
        self.calls = 0

    def stats(self) -> EngineStats:
        waiting, running, held = self.loads[min(self.calls, len(self.loads) - 1)]
        self.calls += 1
        return EngineStats(waiting, running, held, num_blocks_total=64, num_blocks_used=8, num_blocks_cached_free=0,
                           block_size=16, max_model_len=512, prefix_queries=0, prefix_hits=0, num_preemptions=0,
                           num_prompt_tokens_computed=0, num_generated_tokens=0)


async def test_it_waits_for_running_requests_and_held_kv():
    engine = Engine([(1, 2, 0), (0, 1, 1), (0, 0, 1), (0, 0, 0)])
    assert await wait_idle(engine, timeout_s=5.0, poll_s=0.001) is True
    assert engine.calls == 4  # a prefill worker's held KV counts until it is pulled


async def test_it_gives_up_after_the_drain_time(caplog):
    engine = Engine([(0, 1, 0)])
    assert await wait_idle(engine, timeout_s=0.05, poll_s=0.01) is False
    assert "still held after" in caplog.text
