"""NixlLink between two agents in this process: a READ lands the right bytes in the right blocks, scattered
block ids included; pieces outside the source's cache fail that READ; the progress setting is checked."""

import time

import numpy as np
import pytest

from engines.base.types import KvLayout
from engines.transfer.descriptor import NIXL, KvDescriptor
from engines.transfer.nixl_link import NixlLink, NixlSettings, is_available
from engines.transfer.paged import HostCache

LAYOUT = KvLayout(2, 2, 8, "bfloat16", 4)  # 4 planes, blocks of 4 x 2 x 8 x 2 = 128 bytes
needs_nixl = pytest.mark.skipif(not is_available(), reason="NIXL is not installed")


def cache(num_blocks: int, fill) -> HostCache:
    c = HostCache(np.zeros(LAYOUT.num_layers * 2 * num_blocks * 128, np.uint8), LAYOUT, num_blocks)
    c.blocks[:] = fill(c.blocks.shape)
    return c


def describe(link: NixlLink, source: HostCache, block_ids, exposed=None) -> KvDescriptor:
    """A descriptor of `block_ids`, with metadata exposing `exposed` (default: those blocks)."""
    g = source.geometry
    tokens = tuple(range(len(block_ids) * LAYOUT.block_size))
    metadata = link.expose(f"req-{tuple(block_ids)}-{exposed}", block_ids if exposed is None else exposed)
    return KvDescriptor(NIXL, LAYOUT, tokens, tuple(block_ids), link.name, metadata, g.base, g.num_blocks)


def wait(link: NixlLink, transfer, timeout_s: float = 30.0) -> str:
    deadline = time.monotonic() + timeout_s
    while (state := link.state(transfer)) == "PROC" and time.monotonic() < deadline:
        time.sleep(0.001)
    return state


@pytest.fixture(scope="module")
def pair():
    rng = np.random.default_rng(7)
    src = cache(12, lambda shape: rng.integers(0, 256, shape, dtype=np.uint8))
    dst = cache(10, lambda shape: np.zeros(shape, np.uint8))
    return src, NixlLink(src.geometry, "test-src"), dst, NixlLink(dst.geometry, "test-dst")


@needs_nixl
@pytest.mark.parametrize(
    "src_ids, dst_ids",
    [
        ((0, 1, 2, 3), (4, 5, 6, 7)),  # one run per plane
        ((9, 2, 3, 11, 5), (0, 1, 2, 8, 3)),  # scattered: runs broken on one side or the other
    ],
)
def test_a_read_lands_every_plane_of_every_block_where_it_belongs(pair, src_ids, dst_ids):
    src, src_link, dst, dst_link = pair
    dst.blocks[:] = 0
    assert wait(dst_link, dst_link.read(describe(src_link, src, src_ids), dst_ids)) == "DONE"
    assert np.array_equal(dst.blocks[:, list(dst_ids)], src.blocks[:, list(src_ids)])
    untouched = sorted(set(range(10)) - set(dst_ids))
    assert not dst.blocks[:, untouched].any()


@needs_nixl
def test_blocks_beyond_what_the_source_registered_fail_that_read(pair):
    src, src_link, dst, dst_link = pair
    desc = describe(src_link, src, (0, 1))
    lying = KvDescriptor(NIXL, LAYOUT, desc.token_ids, (0, 40), desc.agent, desc.metadata, desc.base, 64)
    assert wait(dst_link, dst_link.read(lying, (0, 1))) == "ERR"
    assert wait(dst_link, dst_link.read(desc, (2, 3))) == "DONE"  # the link still works


@needs_nixl
def test_a_reader_given_one_requests_metadata_cannot_read_the_sources_other_blocks():
    rng = np.random.default_rng(11)
    src = cache(12, lambda shape: rng.integers(0, 256, shape, dtype=np.uint8))
    dst = cache(10, lambda shape: np.zeros(shape, np.uint8))
    src_link, dst_link = NixlLink(src.geometry, "test-src2"), NixlLink(dst.geometry, "test-dst2")
    assert wait(dst_link, dst_link.read(describe(src_link, src, (4, 5), exposed=(4, 5)), (0, 1))) == "DONE"
    # the same agent's metadata, exposing blocks 4 and 5 only, used to ask for other blocks of its cache
    assert wait(dst_link, dst_link.read(describe(src_link, src, (6, 7), exposed=(4, 5)), (2, 3))) == "ERR"
    assert wait(dst_link, dst_link.read(describe(src_link, src, (0, 4), exposed=(4,)), (2, 3))) == "ERR"
    assert not dst.blocks[:, [2, 3]].any()
    src_link.conceal("req-(4, 5)-(4, 5)")
    assert not src_link._exposed.get("req-(4, 5)-(4, 5)")


def test_the_progress_thread_is_off_unless_asked_for(monkeypatch):
    monkeypatch.delenv("TANDEM_NIXL_PROGRESS_THREAD", raising=False)
    assert NixlSettings.from_env() == NixlSettings(progress_thread=False)
    monkeypatch.setenv("TANDEM_NIXL_PROGRESS_THREAD", "1")
    assert NixlSettings.from_env() == NixlSettings(progress_thread=True)
    monkeypatch.setenv("TANDEM_NIXL_PROGRESS_THREAD", "yes")
    with pytest.raises(ValueError, match="TANDEM_NIXL_PROGRESS_THREAD must be 0 or 1, got 'yes'"):
        NixlSettings.from_env()
