"""ZeroCostEngine: the Engine protocol with no model behind it. Every token costs nothing, so a
benchmark through gateway -> router -> workers measures the services alone. Tokens are a
deterministic walk over the vocabulary; KV exports carry one tiny block per 16 tokens."""
import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

from engines.base.events import KvEvent, KvEventLog, KvSnapshot
from engines.base.errors import EngineError, RequestNotFoundError
from engines.base.requests import validate_request
from engines.base.types import (EngineRequest, EngineStats, FinishReason, KvExport, KvLayout,
                                RequestOutput)


class ZeroCostEngine:
    def __init__(self, model_dir: str, block_size: int = 16, max_model_len: int = 8192):
        config = Path(model_dir) / "config.json"
        self.vocab_size = json.loads(config.read_text())["vocab_size"] if config.is_file() else 32000
        self.kv_layout = KvLayout(1, 1, 1, "float32", block_size)
        self.max_model_len = max_model_len
        self._live: set[str] = set()
        self._held: dict[str, tuple[int, ...]] = {}
        self._aborted: set[str] = set()
        self._counts = {"prompt": 0, "generated": 0}
        self._started = False
        self._kv_events = KvEventLog()  # NOTE: no cache, so never an event: routers fall back to their own

    async def start(self) -> None:
        self._started = True

    async def shutdown(self) -> None:
        self._started = False

    def add_request(self, request: EngineRequest) -> AsyncIterator[RequestOutput]:
        if not self._started:
            raise EngineError("engine is not started")
        validate_request(request, self.max_model_len, self._live)
        self._live.add(request.req_id)
        return self._generate(request)

    async def _generate(self, request: EngineRequest) -> AsyncIterator[RequestOutput]:
        prompt, n = request.prompt_token_ids, request.params.max_tokens
        cached = request.kv.num_tokens if request.kv else 0
        self._counts["prompt"] += len(prompt) - cached
        try:
            for i in range(n):
                if request.req_id in self._aborted:
                    yield RequestOutput(request.req_id, (), finish_reason=FinishReason.ABORT)
                    return
                token = (prompt[-1] + 1 + i) % self.vocab_size
                self._counts["generated"] += 1
                done = FinishReason.LENGTH if i == n - 1 else None
                yield RequestOutput(request.req_id, (token,), finish_reason=done,
                                    num_prompt_tokens=len(prompt), num_cached_tokens=cached)
                await asyncio.sleep(0)  # let other streams interleave, as a batch would
        finally:
            self._live.discard(request.req_id)
            self._aborted.discard(request.req_id)
            if request.hold_kv:
                self._held[request.req_id] = prompt

    async def abort(self, req_id: str) -> None:
        if req_id in self._live:
            self._aborted.add(req_id)
        self._held.pop(req_id, None)

    def stats(self) -> EngineStats:
        return EngineStats(
            num_waiting=0, num_running=len(self._live), num_held=len(self._held), num_blocks_total=1 << 20,
            num_blocks_used=0, num_blocks_cached_free=0, block_size=self.kv_layout.block_size,
            max_model_len=self.max_model_len, prefix_queries=0, prefix_hits=0, num_preemptions=0,
            num_prompt_tokens_computed=self._counts["prompt"], num_generated_tokens=self._counts["generated"],
        )

    async def export_kv(self, req_id: str) -> KvExport:
        if req_id not in self._held:
            raise RequestNotFoundError(f"no KV held for request {req_id!r}")
        tokens = self._held[req_id]
        num_blocks = -(-len(tokens) // self.kv_layout.block_size)
        data = bytes(2 * num_blocks * self.kv_layout.block_size * 4)  # [1, 2, n, bs, 1, 1] float32 zeros
        return KvExport(self.kv_layout, tokens, num_blocks, data)

    async def release_kv(self, req_id: str) -> None:
        if self._held.pop(req_id, None) is None:
            raise RequestNotFoundError(f"no KV held for request {req_id!r}")

    async def kv_events_since(self, after_seq: int) -> list[KvEvent] | None:
        return self._kv_events.since(after_seq)

    async def kv_snapshot(self) -> KvSnapshot:
        return self._kv_events.snapshot()

    async def wait_kv_events(self, after_seq: int) -> None:
        await asyncio.Event().wait()  # no event ever comes
