"""The Engine protocol: what a worker holds, whatever the backend."""
from collections.abc import AsyncIterator
from typing import Protocol, runtime_checkable

from engines.base.events import KvEvent, KvSnapshot
from engines.base.types import EngineRequest, EngineStats, KvExport, KvLayout, RequestOutput


@runtime_checkable
class Engine(Protocol):
    async def start(self) -> None:
        """Start the step loop. Idempotent."""

    async def shutdown(self) -> None:
        """Stop the step loop; live requests finish with FinishReason.ABORT."""

    def add_request(self, request: EngineRequest) -> AsyncIterator[RequestOutput]:
        """Validate and enqueue; raises InvalidRequestError at once for bad input.

        Returns the request's output stream of deltas, ending with the one that has a
        finish_reason.
        """

    async def abort(self, req_id: str) -> None:
        """Cancel a live request (its stream ends with ABORT) or drop held KV. Unknown ids are ignored."""

    def stats(self) -> EngineStats: ...

    @property
    def kv_layout(self) -> KvLayout:
        """The layout of this engine's KV blocks (what an import must match)."""

    async def export_kv(self, req_id: str) -> KvExport:
        """The KV of a finished request that was added with hold_kv=True."""

    async def release_kv(self, req_id: str) -> None:
        """Free the blocks held for a finished hold_kv request."""


@runtime_checkable
class KvEventSource(Protocol):
    """An optional capability: an engine that publishes its prefix cache's KV events (engines/base/events.py).
    A worker whose engine lacks it answers StreamKvEvents with UNIMPLEMENTED."""

    async def kv_events_since(self, after_seq: int) -> list[KvEvent] | None:
        """Events with seq > `after_seq`, or None when the reader must take `kv_snapshot` instead."""

    async def kv_snapshot(self) -> KvSnapshot:
        """Every block held now, as of the last event."""

    async def wait_kv_events(self, after_seq: int) -> None:
        """Return once an event with seq > `after_seq` exists (at once if one does)."""
