"""The native engine under load: submit every request at once through the async Engine API and
stamp each delta as the client receives it. Knows the engine only through that API."""

import asyncio
import time
from collections.abc import Callable

from engines.base.block_hash import num_blocks_for
from engines.base.engine_configs import CacheConfig
from engines.base.types import EngineRequest, SamplingParams
from tandem.bench.stats import RequestTrace

BLOCK_SIZE = 16


def make_engine(model_dir, dtype: str, threads: int, max_num_seqs: int, max_len: int, speculative: str = ""):
    """A native engine (its loop on a thread) sized for the run: a KV cache of just enough blocks, not a share
    of all memory."""
    from engines.base.engine_configs import BatchConfig
    from engines.core.client import EngineClient
    from engines.native import native_spec
    from engines.native.config import EngineConfig, SpeculativeOptions

    blocks_per_seq = num_blocks_for(max_len, BLOCK_SIZE) + 1
    config = EngineConfig(
        model=str(model_dir),
        dtype=dtype,
        num_threads=threads,
        batch=BatchConfig(max_num_seqs, 4096),  # twice: finished warm-up blocks may linger as cache
        speculation=SpeculativeOptions(speculative),
        cache=CacheConfig(block_size=BLOCK_SIZE, num_blocks=2 * max_num_seqs * blocks_per_seq),
    )
    return EngineClient(native_spec(config))


async def run_requests(engine, prompts: list[list[int]], osl: int, prefix: str = "r") -> list[RequestTrace]:
    """All prompts submitted back to back; each must yield exactly `osl` tokens."""
    params = SamplingParams(max_tokens=osl, ignore_eos=True)  # greedy by default
    traces = [RequestTrace(0.0) for _ in prompts]
    streams = []
    for i, prompt in enumerate(prompts):
        traces[i].submit_s = time.perf_counter()
        streams.append(engine.add_request(EngineRequest(f"{prefix}{i}", tuple(prompt), params)))
    await asyncio.gather(*(_drain(s, t, time.perf_counter) for s, t in zip(streams, traces)))
    for i, trace in enumerate(traces):
        if trace.num_tokens != osl:
            raise RuntimeError(f"native request {prefix}{i} made {trace.num_tokens} tokens, wanted {osl}")
    return traces


async def _drain(stream, trace: RequestTrace, clock: Callable[[], float]) -> None:
    async for out in stream:
        trace.add_arrival(clock(), len(out.new_token_ids))
        if out.error is not None:
            raise RuntimeError(f"native request {out.req_id} failed: {out.error}")
