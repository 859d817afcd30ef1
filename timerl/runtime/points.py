"""Sets of points named without listing them one by one in Python.

* :class:`PointBox`: the product of one range (or one fixed value) per coordinate: the points
  of a batched memory op (a ``Dealloc`` over ``t = 0:T``, ``schedule/swap.py``'s memory loops).
* :class:`PointRows`: an ``(n, d)`` integer array, one point per row: the points a scanned
  loop wrote, or freed, for all its iterations at once (``runtime/scan.py``).

Both iterate as tuples, so any code that walks points accepts them. The store and
:class:`~timerl.runtime.rows_table.RowsTable` use :func:`member_mask` (which rows of an
array are in the set, in NumPy) and :func:`within` (walk the set or the table, whichever is
smaller), so freeing ``T`` points of a table that holds few costs little.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass

import numpy as np

Point = tuple[int, ...]


@dataclass(frozen=True)
class PointBox:
    """The points ``product(coords)``, each coordinate an ``int`` or a ``range``."""

    coords: tuple[int | range, ...]

    def __iter__(self) -> Iterator[Point]:
        return itertools.product(*(c if isinstance(c, range) else (c,) for c in self.coords))

    def __len__(self) -> int:
        return math.prod(len(c) if isinstance(c, range) else 1 for c in self.coords)

    def __contains__(self, point: object) -> bool:
        if not isinstance(point, tuple) or len(point) != len(self.coords):
            return False
        return all(
            p in c if isinstance(c, range) else p == c for p, c in zip(point, self.coords, strict=True)
        )


@dataclass(frozen=True, eq=False)
class PointRows:
    """Points as the rows of an ``(n, d)`` int64 array (the array is not copied; do not
    write to it)."""

    cols: np.ndarray

    @staticmethod
    def of(points: Iterable[Point], ndim: int) -> PointRows:
        """The rows of ``points`` (tuples of ``ndim`` ints), or ``points`` itself."""
        if isinstance(points, PointRows):
            return points
        pts = list(points)
        return PointRows(np.asarray(pts, dtype=np.int64).reshape(len(pts), ndim))

    def __iter__(self) -> Iterator[Point]:
        return map(tuple, self.cols.tolist())

    def __len__(self) -> int:
        return len(self.cols)

    def __contains__(self, point: object) -> bool:
        if not isinstance(point, tuple) or len(point) != self.cols.shape[1]:
            return False
        return bool(np.any(np.all(self.cols == np.asarray(point, dtype=np.int64), axis=1)))


def member_mask(cols: np.ndarray, points: Iterable[Point]) -> np.ndarray:
    """For each row of ``cols`` (``(n, d)`` int64), whether it is one of ``points``."""
    n, d = cols.shape
    if isinstance(points, PointBox):
        if len(points.coords) != d:
            return np.zeros(n, dtype=bool)
        mask = np.ones(n, dtype=bool)
        for j, c in enumerate(points.coords):
            col = cols[:, j]
            if isinstance(c, range):
                lo, hi = (c.start, c.stop) if c.step > 0 else (c.stop + 1, c.start + 1)
                mask &= (col >= lo) & (col < hi) & ((col - c.start) % c.step == 0)
            else:
                mask &= col == c
        return mask
    other = points.cols if isinstance(points, PointRows) else PointRows.of(points, d).cols
    if other.shape[1] != d or len(other) == 0 or n == 0:
        return np.zeros(n, dtype=bool)
    keys = _exact_keys(cols, other)
    if keys is None:  # coordinates too spread for one int64 key: compare as tuples
        held = set(map(tuple, other.tolist()))
        return np.fromiter((tuple(r) in held for r in cols.tolist()), dtype=bool, count=n)
    return np.isin(keys[0], keys[1])


def repeats(cols: np.ndarray) -> bool:
    """Whether two rows of ``cols`` (``(n, d)`` int64) are equal."""
    if len(cols) < 2:
        return False
    keys = _exact_keys(cols, cols[:1])
    if keys is None:
        return len(set(map(tuple, cols.tolist()))) != len(cols)
    k = np.sort(keys[0])
    return bool(np.any(k[1:] == k[:-1]))


def _exact_keys(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """One int64 per row of ``a`` and of ``b``, equal exactly when the rows are (a mixed-radix
    number over the coordinates' joint span), or None when the spans overflow 62 bits."""
    lo = np.minimum(a.min(axis=0), b.min(axis=0))
    span = np.maximum(a.max(axis=0), b.max(axis=0)) - lo + 1
    if sum(math.log2(int(s)) for s in span) >= 62:
        return None
    strides = np.ones(len(span), dtype=np.int64)
    for j in range(len(span) - 2, -1, -1):
        strides[j] = strides[j + 1] * span[j + 1]
    return (a - lo) @ strides, (b - lo) @ strides


def within(points: Iterable[Point], held: Collection[Point]) -> Iterable[Point]:
    """The points of ``points`` that may be in ``held`` (a table): ``points`` itself, or,
    when ``points`` is a box or rows larger than ``held``, ``held``'s own points among them."""
    if isinstance(points, PointBox | PointRows) and len(held) < len(points):
        keys = list(held)
        if isinstance(points, PointBox):
            return [p for p in keys if p in points]
        if not keys:
            return []
        d = points.cols.shape[1]
        fit = [p for p in keys if isinstance(p, tuple) and len(p) == d]
        mask = member_mask(PointRows.of(fit, d).cols, points) if fit else []
        return [p for p, m in zip(fit, mask, strict=True) if m]
    return points
