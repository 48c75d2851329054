"""The gRPC fallback's staging budget: regions of one shared-memory file, a bounded wait for room, chunk copies."""

import asyncio

import numpy as np
import pytest

from engines.base.types import KvLayout
from engines.transfer.budget import StagingBudget, StagingFull
from engines.transfer.paged import staging_nbytes

LAYOUT = KvLayout(2, 1, 4, "float32", 4)  # 64 bytes per block and plane, 4 planes


@pytest.fixture
def budget():
    b = StagingBudget(staging_nbytes(LAYOUT, 3), "tandem-kv-test")
    yield b
    b.close()


async def test_a_full_budget_waits_then_refuses_and_a_release_lets_the_next_in(budget):
    first = await budget.acquire(LAYOUT, 2, timeout_s=0.1)
    with pytest.raises(StagingFull, match="no room"):
        await budget.acquire(LAYOUT, 2, timeout_s=0.05)
    waiting = asyncio.create_task(budget.acquire(LAYOUT, 2, timeout_s=5))
    await asyncio.sleep(0.02)
    budget.release(first)
    assert await waiting == 0


async def test_a_request_larger_than_the_budget_is_refused_at_once(budget):
    with pytest.raises(StagingFull, match="exceed"):
        await budget.acquire(LAYOUT, 4, timeout_s=10)


async def test_chunks_land_in_their_blocks_plane_by_plane(budget):
    offset = await budget.acquire(LAYOUT, 3, timeout_s=0.1)
    view = budget.view(LAYOUT, offset, 3)
    data = np.arange(4 * 2 * 64, dtype=np.uint32).astype(np.uint8).reshape(4, 2, 64)
    await budget.write_chunk(view, 1, 2, data.tobytes())
    assert np.array_equal(view[:, 1:], data) and not view[:, 0].any()
    assert await budget.read_chunk(view, 1, 2) == data.tobytes()
