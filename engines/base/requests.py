"""What every engine checks and does the same way: request validation and the per-request
output stream fed through an asyncio queue. Imports no torch."""
import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Container

from engines.base.errors import InvalidRequestError
from engines.base.types import EngineRequest, RequestOutput


def validate_request(request: EngineRequest, max_model_len: int, live_ids: Container[str] = ()) -> None:
    """Raise InvalidRequestError for an empty or too long prompt, bad sampling, or a reused id."""
    prompt = request.prompt_token_ids
    if not prompt:
        raise InvalidRequestError("prompt is empty")
    if len(prompt) >= max_model_len:
        raise InvalidRequestError(f"prompt has {len(prompt)} tokens; the context holds {max_model_len} "
                                  "(prompt plus at least one generated token)")
    request.params.validate()
    if request.req_id in live_ids:
        raise InvalidRequestError(f"request id {request.req_id!r} is already in use")


async def queue_stream(req_id: str, queue: asyncio.Queue, on_done: Callable[[], None],
                       abort: Callable[[str], Awaitable[None]]) -> AsyncIterator[RequestOutput]:
    """Deltas from `queue` until the finished one; a consumer that leaves early aborts the request."""
    finished = False
    try:
        while not finished:
            out = await queue.get()
            finished = out.finished
            yield out
    finally:
        on_done()
        if not finished:
            await abort(req_id)
