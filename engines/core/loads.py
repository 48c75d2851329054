"""KV loads: filling a request's allocated device blocks (KV imported from a prefill worker, as KvExport bytes or
named by a transfer descriptor; a prefix onboarded from a lower tier) while the batch keeps stepping. The records
the core keeps and the two things it asks a runner (`start_load`, `poll_loads`); the runner decides how bytes move.
No torch, no I/O."""

from dataclasses import dataclass, field
from typing import Protocol

from engines.base.errors import InvalidRequestError
from engines.base.types import KvExport
from engines.core.sequence import Sequence


class KvSource(Protocol):
    """Where an import's KV comes from, and the tokens it holds: a KvExport (its bytes) or what a runner's
    `kv_source` names."""

    @property
    def token_ids(self) -> tuple[int, ...]: ...


@dataclass(frozen=True, slots=True)
class KvLoad:
    req_id: str  # the load's id: the request that started it
    block_ids: tuple[int, ...]  # destination device blocks, in token order
    num_tokens: int  # tokens whose KV the load fills, from the first destination block's first slot on
    source: object  # runner-specific: where the KV comes from (a transfer descriptor, a tier's handle, ...)


@dataclass(frozen=True, slots=True)
class LoadDone:
    req_id: str
    ok: bool
    error: str = ""


@dataclass(slots=True)
class Loading:
    """A load in flight and the sequences waiting on it (several when they share its blocks)."""

    load: KvLoad
    start: int  # the sequences' num_computed_tokens when it started (a multiple of the block size)
    seqs: list[Sequence] = field(default_factory=list)


class BytesLoads:
    """For runners that move no KV asynchronously: a load from a KvExport is the runner's `import_kv`, done when it
    starts (it ends at the next poll); every other load is refused as bad input. Held KV is described by nothing
    (it is pulled as bytes) and exported as bytes only (`read_kv`)."""

    _imported: list[LoadDone] | None = None  # KvExport loads done, not yet polled

    def import_kv(self, block_ids: list[int], kv: KvExport) -> None:
        raise NotImplementedError  # NOTE: each runner writes KvExport bytes into its own cache

    def read_kv(self, block_ids: list[int], token_ids: tuple[int, ...]) -> KvExport:
        raise NotImplementedError  # NOTE: and reads them out of it

    def export_kv(
        self, block_ids: list[int], token_ids: tuple[int, ...], into: str = "", offset: int = 0
    ) -> KvExport | bytes:
        if into:  # NOTE: only a staging connector asks, and a worker builds one only for an engine that declares
            # a loading transport (engines/transfer/transports.py): this engine's KV leaves as bytes
            raise InvalidRequestError("this engine exports its KV as bytes, not into a staging file")
        return self.read_kv(block_ids, token_ids)

    def start_load(self, load: KvLoad) -> None:
        if not isinstance(load.source, KvExport):
            raise InvalidRequestError("this engine cannot load KV from elsewhere")
        self.import_kv(list(load.block_ids), load.source)
        self._imported = [*(self._imported or ()), LoadDone(load.req_id, True)]

    def poll_loads(self) -> list[LoadDone]:
        done, self._imported = self._imported or [], None
        return done

    def kv_source(self, handle: bytes) -> KvSource:
        raise InvalidRequestError("this engine reads no KV handle: its KV arrives as bytes")

    def describe_kv(self, req_id: str, block_ids: list[int], token_ids: tuple[int, ...]) -> bytes:
        return b""

    def release_described(self, req_id: str) -> None:
        pass
