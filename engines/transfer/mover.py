"""KvMover: a runner's KV transfers over its paged cache — describes held blocks for a decode engine (NIXL),
loads blocks from a NIXL descriptor or a staging file without blocking the step loop, and exports blocks into
a staging file for the gRPC fallback. The payload never passes through Python objects or the engine's pipe."""

import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol

import numpy as np

from engines.base.types import KvExport, KvLayout
from engines.core.loads import KvLoad, LoadDone
from engines.core.tiers.kv_tiers import TieredLoads
from engines.transfer import descriptor, transports
from engines.transfer.descriptor import NIXL, STAGING, DescriptorError, KvDescriptor
from engines.transfer.paged import Geometry, staging_nbytes, staging_view
from engines.transfer.staging import SHM_DIR, StagingReader

log = logging.getLogger(__name__)


class PagedCache(Protocol):
    geometry: Geometry

    def write_blocks(self, block_ids, src: np.ndarray) -> None: ...

    def read_blocks(self, block_ids, dst: np.ndarray) -> None: ...


class KvMover:
    def __init__(
        self,
        cache: PagedCache,
        layout: KvLayout,
        transport: str = transports.STAGING,
        verify: Callable[[KvLoad], str] | None = None,
    ):
        if transport not in transports.LOADING:
            raise ValueError(f"kv transport must be one of {transports.LOADING}, got {transport!r}")
        self.cache, self.layout, self.verify = cache, layout, verify
        self.link = None
        if transport == transports.NIXL:
            from engines.transfer.nixl_link import NixlLink

            self.link = NixlLink(cache.geometry)
        self.reader = StagingReader()
        self._copies = ThreadPoolExecutor(1, thread_name_prefix="kv-load")  # NOTE: off the step loop
        self._inflight: dict[str, tuple[KvLoad, object]] = {}  # req_id -> (load, NIXL transfer | copy Future)
        self._done: list[LoadDone] = []
        self.num_bytes_loaded = 0

    # -- the prefill side --------------------------------------------------------------------
    def describe(self, req_id: str, block_ids, token_ids: tuple[int, ...]) -> bytes:
        """A handle naming held blocks for a decode engine's NIXL READ, with metadata that exposes those blocks
        only (until `release`); b"" without NIXL (bytes are pulled)."""
        if self.link is None:
            return b""
        g = self.cache.geometry
        metadata = self.link.expose(req_id, block_ids)
        return descriptor.encode(
            KvDescriptor(
                NIXL,
                self.layout,
                tuple(token_ids),
                tuple(block_ids),
                self.link.name,
                metadata,
                g.base,
                g.num_blocks,
                g.mem,
                g.device_id,
            )
        )

    def release(self, req_id: str) -> None:
        if self.link is not None:
            self.link.conceal(req_id)

    def export_to(self, block_ids, token_ids: tuple[int, ...], path: str, offset: int) -> bytes:
        """Copy `block_ids` into a staging file at `offset`, in the KvExport byte order; the STAGING descriptor
        naming them there."""
        path = _staging_path(path)
        self.cache.read_blocks(block_ids, staging_view(self.reader.array(path), self.layout, offset, len(block_ids)))
        return descriptor.encode(KvDescriptor(STAGING, self.layout, tuple(token_ids), base=offset, path=path))

    # -- the decode side ---------------------------------------------------------------------
    def source(self, handle: bytes) -> KvDescriptor:
        """The descriptor in `handle`, checked against this cache; DescriptorError otherwise."""
        desc = descriptor.decode(handle)
        descriptor.check_layout(desc, self.layout)
        if desc.kind == NIXL and self.link is None:
            raise DescriptorError(
                "this engine has no NIXL agent (TANDEM_KV_TRANSPORT=grpc): it reads no NIXL descriptor"
            )
        if desc.kind == STAGING:
            size = self.reader.array(_staging_path(desc.path)).size
            if desc.base + staging_nbytes(self.layout, desc.num_blocks) > size:
                raise DescriptorError(f"staging region at {desc.base} runs past the end of {desc.path!r}")
        return desc

    def start_load(self, load: KvLoad) -> None:
        desc: KvDescriptor = load.source
        if desc.kind == NIXL:
            if _lapsed(desc):
                self._done.append(
                    LoadDone(load.req_id, False, "the source's lease on its blocks ended before the READ")
                )
                return
            handle = self.link.read(desc, load.block_ids)  # NOTE: a READ NIXL refuses ends as that load's ERR
        else:
            view = staging_view(self.reader.array(desc.path), self.layout, desc.base, len(load.block_ids))
            handle = self._copies.submit(self.cache.write_blocks, load.block_ids, view)
        self._inflight[load.req_id] = (load, handle)

    def poll_loads(self) -> list[LoadDone]:
        for req_id, (load, handle) in list(self._inflight.items()):
            state = _future_state(handle) if isinstance(handle, Future) else self.link.state(handle)
            if state == "PROC":
                continue
            del self._inflight[req_id]
            self._done.append(self._finished(load, state, getattr(handle, "error", "")))
        done, self._done = self._done, []
        return done

    def _finished(self, load: KvLoad, state: str, error: str = "") -> LoadDone:
        if state != "DONE":
            return LoadDone(load.req_id, False, error or f"{load.source.kind} transfer failed")
        if load.source.kind == NIXL and _lapsed(load.source):
            return LoadDone(load.req_id, False, "the source's lease ended during the READ: its blocks may be reused")
        error = self.verify(load) if self.verify is not None else ""
        if error:
            return LoadDone(load.req_id, False, error)
        self.num_bytes_loaded += staging_nbytes(self.layout, len(load.block_ids))
        return LoadDone(load.req_id, True)


class MovedLoads(TieredLoads):
    """Runner methods for a runner whose paged cache has a KvMover (`mover`; None: KV moves as KvExport bytes):
    other engines' KV named by a descriptor loads through it, KvExport bytes and onboarding loads as TieredLoads."""

    mover: KvMover | None = None

    def kv_source(self, handle: bytes):
        return self.mover.source(handle) if self.mover else super().kv_source(handle)

    def describe_kv(self, req_id: str, block_ids: list[int], token_ids: tuple[int, ...]) -> bytes:
        return self.mover.describe(req_id, block_ids, token_ids) if self.mover else b""

    def release_described(self, req_id: str) -> None:
        if self.mover is not None:
            self.mover.release(req_id)

    def export_kv(
        self, block_ids: list[int], token_ids: tuple[int, ...], into: str = "", offset: int = 0
    ) -> KvExport | bytes:
        if not into or self.mover is None:  # an FP8 cache or transports.BYTES: its KV leaves as KvExport bytes
            return super().export_kv(block_ids, token_ids, into, offset)
        return self.mover.export_to(block_ids, token_ids, into, offset)

    def start_load(self, load: KvLoad) -> None:
        if self.mover is None or not isinstance(load.source, KvDescriptor):  # KvExport bytes, a tier's Onboard
            return super().start_load(load)
        return self.mover.start_load(load)

    def poll_loads(self) -> list[LoadDone]:
        return super().poll_loads() + (self.mover.poll_loads() if self.mover else [])


def _lapsed(desc: KvDescriptor) -> bool:
    return bool(desc.expires_unix_s) and time.time() > desc.expires_unix_s


def _future_state(future: Future) -> str:
    if not future.done():
        return "PROC"
    if future.exception() is not None:
        log.warning("staging copy failed: %r", future.exception())
        return "ERR"
    return "DONE"


def _staging_path(path: str) -> str:
    """Only this machine's staging files are mapped (a descriptor names no other file)."""
    real = os.path.realpath(path)
    if os.path.dirname(real) != os.path.realpath(SHM_DIR) or not os.path.basename(real).startswith("tandem-kv-"):
        raise DescriptorError(f"{path!r} is not a KV staging file")
    if not os.path.exists(real):
        raise DescriptorError(f"KV staging file {path!r} does not exist")
    return real
