"""What every engine checks and does the same way: request validation, KV import checks and the
per-request output stream fed through an asyncio queue. Imports no torch."""

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Container, Sequence

from engines.base.errors import InvalidRequestError, KvLayoutMismatchError
from engines.base.types import EngineRequest, KvExport, KvLayout, RequestOutput

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "float8_e4m3fn": 1, "uint8": 1}
FP8_KV_DTYPE = "float8_e4m3fn"


def validate_request(request: EngineRequest, max_model_len: int, live_ids: Container[str] = ()) -> None:
    """Raise InvalidRequestError for an empty or too long prompt, bad sampling, or a reused id."""
    prompt, tokens = request.prompt_token_ids, request.all_token_ids
    if not prompt:
        raise InvalidRequestError("prompt is empty")
    if len(tokens) >= max_model_len:
        what = "prompt and output tokens fill the context:" if request.output_token_ids else "prompt has"
        raise InvalidRequestError(
            f"{what} {len(tokens)} tokens; the context holds {max_model_len} (prompt plus at least one generated token)"
        )
    request.params.validate()
    if len(request.output_token_ids) >= request.params.max_tokens:
        raise InvalidRequestError(
            f"output_token_ids already hold {len(request.output_token_ids)} tokens of "
            f"max_tokens {request.params.max_tokens}"
        )
    if request.req_id in live_ids:
        raise InvalidRequestError(f"request id {request.req_id!r} is already in use")


def check_token_ids(token_ids: tuple[int, ...], vocab_size: int) -> None:
    if min(token_ids) < 0 or max(token_ids) >= vocab_size:
        raise InvalidRequestError(f"prompt token ids must be in [0, {vocab_size})")


def check_importable(layout: KvLayout, kv: KvExport) -> None:
    """Raise KvLayoutMismatchError unless `kv` is exactly what this layout's cache can take."""
    if kv.layout != layout:
        raise KvLayoutMismatchError(f"KV layout {kv.layout} does not match this engine's {layout}")
    num_blocks = -(-kv.num_tokens // layout.block_size)
    itemsize = DTYPE_BYTES[layout.dtype]
    expected = layout.num_layers * 2 * num_blocks * layout.block_size * layout.num_kv_heads * layout.head_dim
    if kv.num_blocks != num_blocks or len(kv.data) != expected * itemsize:
        raise KvLayoutMismatchError(
            f"KV export holds {kv.num_blocks} blocks / {len(kv.data)} bytes; "
            f"{kv.num_tokens} tokens need {num_blocks} blocks / {expected * itemsize} bytes"
        )
    num_scales = 2 * layout.num_layers if layout.dtype == FP8_KV_DTYPE else 0
    if len(kv.scales) != num_scales:
        raise KvLayoutMismatchError(f"KV export carries {len(kv.scales)} scales; this cache needs {num_scales}")


def check_kv_prefix(kv_token_ids: Sequence[int], token_ids: Sequence[int]) -> None:
    """KV computed elsewhere (an export, a load's source) must cover a strict prefix of the request's tokens: one
    token is left to compute. NOTE: the one owner of this rule; engines and workers all call it."""
    n = len(kv_token_ids)
    if not 0 < n < len(token_ids) or tuple(token_ids[:n]) != tuple(kv_token_ids):
        raise InvalidRequestError("imported KV must cover a strict prefix of the request's tokens")


async def queue_stream(
    req_id: str, queue: asyncio.Queue, on_done: Callable[[], object], abort: Callable[[str], Awaitable[None]]
) -> AsyncIterator[RequestOutput]:
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
