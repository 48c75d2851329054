"""Coalescing an engine's output stream: while the consumer (a gRPC send, an SSE write) is busy,
the engine runs ahead, and the next message carries every delta that is ready. Per-message cost,
not per-token cost, is what a Python relay pays (bench/RESULTS.md, control-plane overhead)."""

import asyncio
from collections.abc import AsyncIterator

from engines.base.types import RequestOutput

_DONE = object()


async def coalesced(stream: AsyncIterator[RequestOutput]) -> AsyncIterator[RequestOutput]:
    """Yield merged deltas; closing this generator cancels the pump, which closes (aborts) `stream`."""
    ready: asyncio.Queue = asyncio.Queue()

    async def pump() -> None:
        try:
            async for out in stream:
                ready.put_nowait(out)
        except Exception as exc:  # surface the engine's failure to the consumer
            ready.put_nowait(exc)
        finally:
            ready.put_nowait(_DONE)

    task = asyncio.create_task(pump())
    try:
        while True:
            batch = [await ready.get()]
            while not ready.empty():
                batch.append(ready.get_nowait())
            done = batch[-1] is _DONE
            items = [b for b in batch if b is not _DONE]
            for item in items:
                if isinstance(item, Exception):
                    raise item
            if items:
                yield merge(items)
            if done:
                return
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def merge(outputs: list[RequestOutput]) -> RequestOutput:
    """One delta with every token of `outputs`, in order; the last one's status and counts."""
    if len(outputs) == 1:
        return outputs[0]
    last = outputs[-1]
    return RequestOutput(
        req_id=last.req_id,
        new_token_ids=tuple(t for o in outputs for t in o.new_token_ids),
        logprobs=tuple(lp for o in outputs for lp in o.logprobs),
        finish_reason=last.finish_reason,
        num_prompt_tokens=last.num_prompt_tokens,
        num_cached_tokens=last.num_cached_tokens,
        error=last.error,
        queue_s=next((o.queue_s for o in outputs if o.queue_s is not None), None),
    )
