"""TensorRT-LLM's iteration stats (the dicts LLM.get_stats returns) + the adapter's own counts -> EngineStats,
the figures tandem's worker gauges and the router's load view read. Pure.

What TensorRT-LLM does not report is counted by the adapter from the requests it streams (prompt tokens
computed, tokens generated, prefix lookups and hits in tokens, from each request's reused-block count), or is
0 and documented: preemptions (its default capacity scheduler never evicts a started request) and free blocks
still holding a prefix (its stats do not tell them apart)."""

from dataclasses import dataclass

from engines.base.types import EngineStats


@dataclass(slots=True)
class Counts:
    prompt_tokens_computed: int = 0
    generated_tokens: int = 0
    prefix_queries: int = 0  # prompt tokens looked up in the prefix cache
    prefix_hits: int = 0  # of which served from it

    def request_started(self, num_prompt_tokens: int, num_cached_tokens: int, imported: bool) -> None:
        if not imported:  # a generation-only request computes no prompt: its KV came from the prefill worker
            self.prompt_tokens_computed += num_prompt_tokens - num_cached_tokens
            self.prefix_queries += num_prompt_tokens
            self.prefix_hits += num_cached_tokens


def engine_stats(
    stat: dict, counts: Counts, *, block_size: int, max_model_len: int, num_held: int, num_live: int
) -> EngineStats:
    """`stat`: the latest iteration's dict ({} before the first). TensorRT-LLM reports nothing while idle, so
    its last figures go stale: the requests the adapter streams (`num_live`) bound its queued and active
    counts, and with nothing live or held no block is in use."""
    kv = stat.get("kvCacheStats") or {}
    batching = stat.get("inflightBatchingStats") or {}
    waiting = stat.get("numQueuedRequests", 0) + batching.get("numPausedRequests", 0)
    running = stat.get("numActiveRequests", 0)
    total = kv.get("maxNumBlocks", 0)
    used = kv.get("usedNumBlocks", total - kv.get("freeNumBlocks", total)) if num_live or num_held else 0
    return EngineStats(
        num_waiting=min(waiting, num_live),
        num_running=min(running, num_live),
        num_held=num_held,
        num_blocks_total=total,
        num_blocks_used=used,
        num_blocks_cached_free=0,
        block_size=block_size,
        max_model_len=max_model_len,
        prefix_queries=counts.prefix_queries,
        prefix_hits=counts.prefix_hits,
        num_preemptions=0,
        num_prompt_tokens_computed=counts.prompt_tokens_computed,
        num_generated_tokens=counts.generated_tokens,
    )
