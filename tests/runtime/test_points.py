"""Point sets named without listing them (boxes of ranges, rows of an array): membership in
NumPy agrees with Python's tuples, and freeing them from tables frees exactly those points."""

from __future__ import annotations

import numpy as np
import pytest

from timerl.backends import get_backend
from timerl.runtime.points import PointBox, PointRows, member_mask, repeats, within
from timerl.runtime.rows_table import RowsTable
from timerl.runtime.store import PointStore


def _random_box(rng: np.random.Generator, d: int) -> PointBox:
    coords: list[int | range] = []
    for _ in range(d):
        if rng.random() < 0.7:
            start, stop = int(rng.integers(-3, 3)), int(rng.integers(-3, 7))
            coords.append(range(start, stop, int(rng.choice([1, 2, 3, -1, -2]))))
        else:
            coords.append(int(rng.integers(-3, 6)))
    return PointBox(tuple(coords))


@pytest.mark.parametrize("seed", range(4))
def test_membership_in_numpy_equals_membership_of_tuples(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(100):
        d = int(rng.integers(0, 4))
        cols = rng.integers(-3, 6, size=(int(rng.integers(0, 25)), d))
        box = _random_box(rng, d)
        rows = PointRows(rng.integers(-3, 6, size=(int(rng.integers(0, 25)), d)))
        for points in (box, rows):
            want = set(points)
            assert member_mask(cols, points).tolist() == [tuple(r) in want for r in cols.tolist()]
            held = set(map(tuple, cols.tolist()))
            assert set(within(points, held)) & held == want & held
        assert repeats(cols) == (len(set(map(tuple, cols.tolist()))) != len(cols))
    spread = PointRows(np.array([[0, 2**40], [2**40, 0]]))  # too spread for one int64 key
    assert member_mask(np.array([[0, 2**40], [1, 1]]), spread).tolist() == [True, False]
    assert (0, 2**40) in spread and (1, 1) not in spread and len(spread) == 2


def test_freeing_boxes_and_rows_from_every_kind_of_table() -> None:
    """The store frees a box or rows from plain, rows and partly copied-out tables with the
    bytes and points of freeing them one by one."""
    be = get_backend("jax")
    row_b = 3 * 4
    stores = []
    for batched in (True, False):
        store = PointStore(be.nbytes)
        store.declare(1, 1)
        store.declare(2, 1)
        tab = RowsTable(be.take, be.nbytes)
        store.declare_rows(2, 0, tab)
        for k in range(6):
            store.put(1, 0, (0, k), be.from_numpy(np.zeros(3, np.float32)))
        rows = PointRows(np.array([[1, k] for k in range(8)]))
        store.put_rows(2, 0, rows, be.from_numpy(np.ones((8, 3), np.float32)), 0)
        tab[(1, 3)]  # copied out
        box = PointBox((range(0, 2), range(2, 100)))
        gone = PointRows(np.array([[1, 0], [1, 3], [5, 5]]))
        if batched:
            freed = store.free_points(1, box) + store.free_points(2, box) + store.free_points(2, gone)
        else:
            freed = sum(store.free(n, p) for n in (1, 2) for p in list(box) + list(gone))
        stores.append((freed, store.live_points, store.live_bytes, sorted(tab)))
    assert stores[0] == stores[1]
    assert stores[0] == (4 * row_b + 7 * row_b, 2 + 1, 3 * row_b, [(1, 1)])
