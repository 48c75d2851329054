"""The KvConnector seam: how a worker moves one request's KV between a prefill and a decode engine, whichever the
transport (engines/transfer/transports.py). One connector per worker, chosen once at start-up from the transport
its engine declares. Only the contract lives here: no gRPC, no files, no engine calls."""

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from engines.base.types import KvExport


@dataclass(frozen=True, slots=True)
class Incoming:
    """What a decode engine's request carries from a verified handle (`EngineRequest.kv`): KV bytes to write, or a
    handle naming KV its engine loads itself; None: prefill locally. `land` is called once, with the seconds
    from the request's arrival to the engine's first output (or 0 when there was none): the transfer's last
    resources (a staging region, the source's blocks) go then."""

    kv: KvExport | bytes | None = None
    land: Callable[[float], None] | None = None

    def landed(self, seconds: float = 0.0) -> None:
        if self.land is not None:
            self.land(seconds)


class KvConnector(Protocol):
    """Both halves of one transport. A prefill worker's `export` streams what PullKv sends; a decode worker's
    `receive` turns a KvHandle the gate has verified into what its engine loads (never before that check)."""

    name: str  # a transports name

    def export(self, req_id: str, num_blocks: int | None, taken: Callable[[str], None]) -> AsyncIterator[Any]:
        """PullKv's chunks of a held request's KV; typed errors before the first chunk; `taken(req_id)` once the
        engine has handed the blocks over; the request's hold ends when the last chunk is out."""

    async def receive(self, handle: Any, token_ids: tuple[int, ...]) -> Incoming:
        """The handle's KV for a request of `token_ids`; Incoming() to prefill locally when a pull fails."""

    def close(self) -> None:
        """Free what the connector holds (staging memory)."""
