"""A scanned loop's outputs are recorded as rows of its stacked arrays (``RowsTable``): a
row is copied out only when read; accounting, frees and iteration see every point."""

from __future__ import annotations

import numpy as np
import pytest

from timerl.backends import get_backend
from timerl.runtime.rows_table import RowsTable
from timerl.runtime.store import PointStore


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_rows_are_copied_out_when_read_and_accounted(backend: str) -> None:
    be = get_backend(backend)
    store = PointStore(be.nbytes)
    store.declare(7, 1)
    tab = RowsTable(be.take, be.nbytes)
    store.declare_rows(7, 0, tab)
    stacked = be.from_numpy(np.arange(2 * 5 * 3, dtype=np.float32).reshape(2, 5, 3))  # rows on axis 1
    pts = [(0, k) for k in range(5)]
    assert store.put_rows(7, 0, pts, stacked, 1)
    assert store.live_bytes == 2 * 5 * 3 * 4 and store.live_points == 5
    assert tab.lazy_points == 5 and len(tab) == 5 and sorted(tab) == pts
    assert (0, 2) in tab and (0, 5) not in tab and tab.get((0, 5)) is None
    np.testing.assert_array_equal(
        be.to_numpy(tab[(0, 2)]), np.arange(30, dtype=np.float32).reshape(2, 5, 3)[:, 2]
    )
    assert tab.lazy_points == 4 and len(tab) == 5
    with pytest.raises(KeyError):
        tab[(0, 9)]
    assert store.free(7, (0, 2)) == 2 * 3 * 4  # a copied-out row
    assert store.free(7, (0, 3)) == 2 * 3 * 4  # a row never copied out
    assert store.live_points == 3 and store.live_bytes == 3 * 2 * 3 * 4
    store.put(7, 0, (0, 0), be.from_numpy(np.zeros((2, 3), np.float32)))  # replaces a row
    assert store.live_points == 3 and tab.lazy_points == 2
    np.testing.assert_array_equal(be.to_numpy(store.get(7, 0, (0, 0))), np.zeros((2, 3)))


def test_put_rows_needs_a_rows_table() -> None:
    be = get_backend("jax")
    store = PointStore(be.nbytes)
    store.declare(1, 1)
    assert not store.put_rows(1, 0, [(0,)], be.from_numpy(np.zeros((1, 2), np.float32)), 0)
    assert store.live_points == 0


def test_batched_frees_and_rows_over_existing_points_keep_the_accounting() -> None:
    """``free_points`` of copied-out and lazy rows (and absent points), and ``put_rows`` over
    points already held (the per-point path), count bytes and points as single calls do."""
    be = get_backend("torch")
    store = PointStore(be.nbytes)
    store.declare(3, 1)
    tab = RowsTable(be.take, be.nbytes)
    store.declare_rows(3, 0, tab)
    row_b = 4 * 4
    store.put_rows(3, 0, [(k,) for k in range(6)], be.from_numpy(np.ones((6, 4), np.float32)), 0)
    tab[(1,)]  # copied out
    assert store.free_points(3, [(0,), (1,), (9,)]) == 2 * row_b
    assert store.live_points == 4 and store.live_bytes == 4 * row_b
    tab[(2,)]
    # rows 2..5 again (2 copied out, 3..5 lazy) plus 6, 7 new: the per-point path
    store.put_rows(3, 0, [(k,) for k in range(2, 8)], be.from_numpy(np.zeros((6, 4), np.float32)), 0)
    assert store.live_points == 6 and store.live_bytes == 6 * row_b and tab.lazy_points == 6
    np.testing.assert_array_equal(be.to_numpy(tab[(2,)]), np.zeros(4))
    with pytest.raises(ValueError, match="repeat"):
        RowsTable(be.take, be.nbytes).put_rows([(0,), (0,)], be.from_numpy(np.zeros((2, 4), np.float32)), 0)
    assert store.free_points(3, [(k,) for k in range(10)]) == 6 * row_b
    assert store.live_points == 0 and store.live_bytes == 0
