"""The Engine protocol: what a worker holds, whatever the backend, and the capabilities it declares."""

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from engines.base.events import KvEvent, KvSnapshot
from engines.base.types import EngineRequest, EngineStats, KvExport, KvLayout, RequestOutput
from engines.transfer import transports


@dataclass(frozen=True, slots=True)
class EngineCapabilities:
    """What an engine supports beyond generating; a worker answers UNIMPLEMENTED for what it lacks."""

    kv_events: bool = False  # kv_events_since / kv_snapshot / wait_kv_events
    reset_prefix_cache: bool = False
    kv_export: bool = False  # export_kv: held KV can be pulled as bytes (PullKv)
    kv_transport: str = transports.BYTES  # how its KV moves to and from other engines: the worker's KvConnector


@runtime_checkable
class Engine(Protocol):
    capabilities: EngineCapabilities

    async def start(self) -> None:
        """Start the step loop. Idempotent."""

    async def shutdown(self) -> None:
        """Stop the step loop; live requests finish with FinishReason.ABORT."""

    def add_request(self, request: EngineRequest) -> AsyncIterator[RequestOutput]:
        """Validate and enqueue; raises InvalidRequestError at once for bad input.

        Returns the request's output stream of deltas, ending with the one that has a
        finish_reason (PREFILLED for a hold_kv request whose KV is held).
        """

    async def abort(self, req_id: str) -> None:
        """Cancel a live request (its stream ends with ABORT) or drop held KV. Unknown ids are ignored."""

    def stats(self) -> EngineStats: ...

    @property
    def kv_layout(self) -> KvLayout:
        """The layout of this engine's KV blocks (what an import must match)."""

    @property
    def max_model_len(self) -> int:
        """Prompt plus output tokens one request may hold: computed by the engine, reported by the worker."""

    async def export_kv(self, req_id: str, into: str = "", offset: int = 0) -> KvExport | bytes:
        """The KV of a prefilled request (added with hold_kv=True): as KvExport bytes; or, `into` the staging file
        of that path from `offset` on (an engine that loads KV, for the staging connector), the handle of what
        was written there (a STAGING descriptor, what a decode engine loads from)."""

    async def release_kv(self, req_id: str) -> None:
        """Free the blocks held for a prefilled request."""

    async def reset_prefix_cache(self) -> int:
        """Drop every cached prefix (EngineBusyError while requests hold blocks); how many blocks were dropped."""

    async def wait_failed(self) -> str:
        """Return, with the reason, once the engine can serve no more (e.g. its process died)."""

    async def kv_events_since(self, after_seq: int) -> list[KvEvent] | None:
        """Events with seq > `after_seq`, or None when the reader must take `kv_snapshot` instead."""

    async def kv_snapshot(self) -> KvSnapshot:
        """Every block held now, as of the last event."""

    async def wait_kv_events(self, after_seq: int) -> None:
        """Return once an event with seq > `after_seq` exists (at once if one does)."""
