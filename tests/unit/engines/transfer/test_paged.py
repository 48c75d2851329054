"""The paged cache's NIXL pieces and their merging into runs contiguous on both sides: pure, exact."""

import numpy as np
import pytest

from engines.transfer.paged import Geometry, merge_runs

G = Geometry(num_planes=2, num_blocks=4, block_bytes=100, base=1000, device_id=3)


def rows(*triples) -> np.ndarray:
    return np.array(triples, dtype=np.uint64).reshape(-1, 3)


def region_table(g: Geometry) -> np.ndarray:
    """Every (plane, block) piece of the pool, plane-major, built row by row: the reference `pieces` must match."""
    return rows(
        *[
            (g.base + (p * g.num_blocks + b) * g.block_bytes, g.block_bytes, g.device_id)
            for p in range(g.num_planes)
            for b in range(g.num_blocks)
        ]
    )


def test_pieces_are_the_region_table_rows_of_the_blocks_plane_major():
    assert G.pieces([2, 0]).tolist() == [[1200, 100, 3], [1000, 100, 3], [1600, 100, 3], [1400, 100, 3]]
    table = region_table(G)
    assert np.array_equal(G.pieces([3, 1, 2]), table[[p * G.num_blocks + b for p in range(2) for b in (3, 1, 2)]])
    assert G.pieces(range(G.num_blocks)).tolist() == table.tolist() == [[1000 + 100 * i, 100, 3] for i in range(8)]


def test_consecutive_blocks_on_both_sides_become_one_piece_per_plane():
    local, remote = merge_runs(G.pieces([0, 1, 2]), Geometry(2, 8, 100, 5000).pieces([4, 5, 6]))
    assert local.tolist() == [[1000, 300, 3], [1400, 300, 3]]
    assert remote.tolist() == [[5400, 300, 0], [6200, 300, 0]]


def test_a_run_breaks_where_either_side_stops_being_contiguous():
    # local blocks 0,1,2,3 are consecutive; the source's 7,8 | 2 | 3 are not after 8
    local, remote = merge_runs(G.pieces([0, 1, 2, 3]), Geometry(1 * 2, 10, 100, 0).pieces([7, 8, 2, 3]))
    assert local.tolist() == [[1000, 200, 3], [1200, 200, 3], [1400, 200, 3], [1600, 200, 3]]
    assert remote.tolist() == [[700, 200, 0], [200, 200, 0], [1700, 200, 0], [1200, 200, 0]]
    # the source consecutive, the local side not: nothing merges
    local, remote = merge_runs(G.pieces([3, 1]), G.pieces([0, 1]))
    assert (len(local), len(remote)) == (4, 4)


def test_whole_planes_merge_when_both_pools_are_contiguous_there():
    local, remote = merge_runs(G.pieces(range(4)), Geometry(2, 4, 100, 9000).pieces(range(4)))
    assert local.tolist() == [[1000, 800, 3]] and remote.tolist() == [[9000, 800, 0]]


def test_rows_on_another_device_never_merge():
    local, remote = merge_runs(rows((0, 10, 0), (10, 10, 1)), rows((50, 10, 0), (60, 10, 0)))
    assert local.tolist() == [[0, 10, 0], [10, 10, 1]] and remote.tolist() == [[50, 10, 0], [60, 10, 0]]


def test_merging_keeps_every_byte_and_refuses_unpaired_tables():
    local, remote = merge_runs(G.pieces([1, 2, 0]), G.pieces([0, 1, 3]))
    assert int(local[:, 1].sum()) == int(remote[:, 1].sum()) == 6 * 100
    assert merge_runs(rows(), rows())[0].shape == (0, 3)
    with pytest.raises(ValueError, match="differ in shape"):
        merge_runs(G.pieces([0]), G.pieces([0, 1]))
