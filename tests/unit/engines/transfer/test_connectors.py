"""Each KvConnector on its own, over a fake engine and a fake puller: what PullKv streams (export), what a decode
engine's request carries from a verified handle (receive), when a transfer's resources go (landed), and that the
connector is the one the engine declares."""

import time

import numpy as np
import pytest

from engines.base.engine import EngineCapabilities
from engines.base.errors import RequestNotFoundError
from engines.base.types import KvExport, KvLayout
from engines.transfer import descriptor, transports
from engines.transfer.budget import StagingBudget
from engines.transfer.descriptor import NIXL, STAGING, KvDescriptor
from engines.transfer.paged import staging_nbytes
from services.common.convert import layout_to_pb
from services.common.kv_connectors import (
    BytesConnector,
    NixlConnector,
    StagingConnector,
    TrtllmConnector,
    make_connector,
)
from services.common.protos import common_pb2
from services.decode.kv_import import assemble

LAYOUT = KvLayout(2, 1, 4, "float32", 4)  # 64 bytes per block and plane, 4 planes
TOKENS = tuple(range(10, 19))  # 9 tokens: the handle covers 8 of them, in 2 blocks


class FakeEngine:
    def __init__(self, transport: str = transports.BYTES):
        self.capabilities = EngineCapabilities(kv_transport=transport)
        self.kv_layout = LAYOUT
        self.calls: list[tuple] = []
        self.data = np.arange(staging_nbytes(LAYOUT, 2), dtype=np.uint32).astype(np.uint8)

    async def export_kv(self, req_id: str, into: str = "", offset: int = 0) -> KvExport | bytes:
        self.calls.append(("export_kv", req_id, into))
        if req_id != "held":
            raise RequestNotFoundError(f"no KV held for request {req_id!r}")
        if not into:
            return KvExport(LAYOUT, TOKENS[:8], 2, self.data.tobytes())
        with open(into, "r+b") as f:
            f.seek(offset)
            f.write(self.data.tobytes())
        return descriptor.encode(KvDescriptor(STAGING, LAYOUT, TOKENS[:8], base=offset, path=into))

    async def release_kv(self, req_id: str) -> None:
        self.calls.append(("release_kv", req_id))

    async def abort(self, req_id: str) -> None:
        self.calls.append(("abort", req_id))


class FakePuller:
    timeout_s = 0.05

    def __init__(self, kv: KvExport | None = None, error: Exception | None = None):
        self.kv, self.error, self.released, self.pulls = kv, error, [], 0

    async def pull(self, handle, num_tokens: int) -> KvExport:
        self.pulls += 1
        if self.error is not None:
            raise self.error
        return self.kv

    async def pull_staged(self, handle, token_ids, staging, offset: int) -> bytes:
        self.pulls += 1
        if self.error is not None:
            raise self.error
        return b"staged@%d" % offset

    async def release(self, handle) -> None:
        self.released.append(handle.req_id)


def handle(engine_params: bytes = b"") -> common_pb2.KvHandle:
    return common_pb2.KvHandle(
        worker_id="p0",
        address="127.0.0.1:1",
        req_id="held",
        layout=layout_to_pb(LAYOUT),
        num_tokens=8,
        num_blocks=2,
        lease_expires_unix_s=time.time() + 60,
        engine_params=engine_params,
    )


class Moves(list):
    def __call__(self, direction: str, num_bytes: int, seconds: float, transport: str) -> None:
        self.append((direction, num_bytes, transport))


@pytest.fixture
def staging():
    budget = StagingBudget(staging_nbytes(LAYOUT, 2), "tandem-kv-test")
    yield budget
    budget.close()


async def drain(connector, req_id: str, num_blocks):
    taken: list[str] = []
    chunks = [c async for c in connector.export(req_id, num_blocks, taken.append)]
    return chunks, taken


async def test_bytes_export_streams_the_held_kv_then_ends_the_hold():
    engine, moves = FakeEngine(), Moves()
    chunks, taken = await drain(BytesConnector(engine, moves), "held", None)
    kv = assemble(chunks)
    assert kv.data == engine.data.tobytes() and kv.token_ids == TOKENS[:8] and taken == ["held"]
    assert engine.calls == [("export_kv", "held", ""), ("release_kv", "held")]
    assert moves == [("export", engine.data.nbytes, transports.BYTES)]


async def test_bytes_export_of_nothing_held_raises_before_any_chunk():
    with pytest.raises(RequestNotFoundError):
        await drain(BytesConnector(FakeEngine(), Moves()), "gone", None)


async def test_bytes_receive_pulls_an_export_that_covers_a_prefix():
    kv = KvExport(LAYOUT, TOKENS[:8], 2, b"x")
    moves = Moves()
    incoming = await BytesConnector(FakeEngine(), moves, FakePuller(kv)).receive(handle(), TOKENS)
    assert incoming.kv is kv and moves == [("import", 1, transports.BYTES)]


@pytest.mark.parametrize(
    "puller",
    [
        FakePuller(KvExport(LAYOUT, (1,) * 8, 2, b"x")),  # other tokens
        FakePuller(KvExport(LAYOUT, TOKENS, 3, b"x")),  # not a strict prefix
        FakePuller(error=ValueError("too many bytes")),
    ],
)
async def test_bytes_receive_falls_back_to_a_local_prefill(puller):
    incoming = await BytesConnector(FakeEngine(), Moves(), puller).receive(handle(), TOKENS)
    assert incoming.kv is None and puller.pulls == 1


async def test_bytes_and_trtllm_hand_engine_params_to_the_engine_without_a_pull():
    for kind in (BytesConnector, TrtllmConnector):
        puller = FakePuller()
        incoming = await kind(FakeEngine(), Moves(), puller).receive(handle(b"opaque"), TOKENS)
        assert incoming.kv == b"opaque" and puller.pulls == 0


async def test_staging_export_copies_through_a_region_that_is_freed_after(staging):
    engine, moves = FakeEngine(transports.STAGING), Moves()
    connector = StagingConnector(engine, moves, staging)
    chunks, taken = await drain(connector, "held", 2)
    got = np.concatenate([np.frombuffer(c.data, np.uint8).reshape(4, c.num_blocks, 64) for c in chunks], axis=1)
    assert got.tobytes() == engine.data.tobytes() and taken == ["held"]
    assert engine.calls == [("export_kv", "held", staging.path), ("abort", "held")]
    assert moves == [("export", engine.data.nbytes, transports.STAGING)]
    assert await staging.acquire(LAYOUT, 2, 0.01) == 0  # the region went back


async def test_staging_export_without_a_held_request_is_not_found(staging):
    with pytest.raises(RequestNotFoundError):
        await drain(StagingConnector(FakeEngine(transports.STAGING), Moves(), staging), "gone", None)


async def test_staging_receive_holds_its_region_until_landed(staging):
    connector = StagingConnector(FakeEngine(transports.STAGING), Moves(), staging, FakePuller())
    incoming = await connector.receive(handle(), TOKENS)
    assert incoming.kv == b"staged@0"
    assert (await connector.receive(handle(), TOKENS)).kv is None  # the budget is full: prefill locally
    incoming.landed(0.5)
    incoming.landed(0.5)  # NOTE: once only; a second release would free another request's region
    assert (await connector.receive(handle(), TOKENS)).kv == b"staged@0"


async def test_staging_receive_frees_the_region_when_the_pull_fails(staging):
    connector = StagingConnector(FakeEngine(transports.STAGING), Moves(), staging, FakePuller(error=ValueError("x")))
    assert (await connector.receive(handle(), TOKENS)).kv is None
    assert await staging.acquire(LAYOUT, 2, 0.01) == 0


async def test_nixl_receive_names_the_source_with_its_lease_and_releases_it_once_landed(staging):
    params = descriptor.encode(KvDescriptor(NIXL, LAYOUT, TOKENS[:8], (3, 4), "agent", b"md", 0, 8))
    puller, moves = FakePuller(), Moves()
    connector = NixlConnector(FakeEngine(transports.NIXL), moves, staging, puller)
    h = handle(params)
    incoming = await connector.receive(h, TOKENS)
    assert descriptor.decode(incoming.kv).expires_unix_s == h.lease_expires_unix_s and puller.pulls == 0
    incoming.landed(0.25)
    incoming.landed(0.25)
    for task in list(connector._tasks):
        await task
    assert puller.released == ["held"] and moves == [("import", staging_nbytes(LAYOUT, 2), transports.NIXL)]


async def test_nixl_receive_pulls_through_staging_from_a_source_without_nixl(staging):
    connector = NixlConnector(FakeEngine(transports.NIXL), Moves(), staging, FakePuller())
    assert (await connector.receive(handle(), TOKENS)).kv == b"staged@0"


@pytest.mark.parametrize(
    "transport, kind",
    [
        (transports.BYTES, BytesConnector),
        (transports.STAGING, StagingConnector),
        (transports.NIXL, NixlConnector),
        (transports.TRTLLM, TrtllmConnector),
    ],
)
def test_the_connector_is_the_one_the_engine_declares(transport, kind):
    connector = make_connector(FakeEngine(transport), Moves(), staging_nbytes(LAYOUT, 2), "tandem-kv-test")
    try:
        assert type(connector) is kind and connector.name == transport
    finally:
        connector.close()
