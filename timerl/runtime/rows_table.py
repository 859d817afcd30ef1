"""A point table whose points may be rows of a stacked array, copied out only when read.

A loop run as one ``lax.scan`` (:mod:`~timerl.runtime.scan`) returns each output it keeps
as one array with a row per iteration. Storing it point by point (one copy per row) cost
PPO's 250-step rollout about 2,000 copies per iteration, most never read one by one: the
learning phase reads the whole rollout at once (a slice read served from the stacked array,
``Executor.stack_hints``). A :class:`RowsTable` records the rows instead, one record per
stacked array (the points as an ``(n, d)`` array, which are still held), and copies a row
out the first time that point is read; frees clear the rows' flags (in NumPy, for all the
points of a scanned loop at once); the stacked array is released with its last row (and
the hint that holds it). The Python work of a scan's rows is thus per loop entry, not per
iteration.

It is a ``dict`` so the executor's point reads stay plain subscripts; a row not copied out
yet is produced by ``__missing__``. ``get``, ``in``, ``len`` and iteration see both kinds of
point. Writes and frees go through :meth:`put`, :meth:`put_rows` and :meth:`discard`, which
return the change in ``(bytes, points)`` for :class:`~timerl.runtime.store.PointStore`'s
accounting (a row counts its share of the stacked array's bytes).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from timerl.runtime.points import Point, PointBox, PointRows, member_mask, repeats, within


class _Stack:
    """The rows of one stacked array still held as points (not copied out, not freed)."""

    __slots__ = ("arr", "axis", "share", "cols", "alive", "count", "_index")

    def __init__(self, arr: Any, axis: int, share: int, cols: np.ndarray) -> None:
        self.arr, self.axis, self.share, self.cols = arr, axis, share, cols
        self.alive = np.ones(len(cols), dtype=bool)
        self.count = len(cols)
        self._index: dict[Point, int] | None = None  # point -> row, built on the first point lookup

    def row(self, point: Point) -> int:
        """The row of ``point`` if it is held here, else -1."""
        if self._index is None:
            self._index = {p: k for k, p in enumerate(map(tuple, self.cols.tolist()))}
        k = self._index.get(point, -1)
        return k if k >= 0 and self.alive[k] else -1

    def drop(self, mask: np.ndarray) -> int:
        """Drop the held rows where ``mask``; returns how many."""
        hit = mask & self.alive
        n = int(np.count_nonzero(hit))
        if n:
            self.alive &= ~hit
            self.count -= n
        return n

    def drop_row(self, k: int) -> None:
        """Drop held row ``k``."""
        self.alive[k] = False
        self.count -= 1

    def points(self) -> Iterator[Point]:
        return map(tuple, self.cols[self.alive].tolist())


class RowsTable(dict):
    """Points of one output of a node; some are rows of stacked arrays not copied out yet."""

    def __init__(self, take: Callable[[Any, int, int], Any], nbytes: Callable[[Any], int]) -> None:
        super().__init__()
        self._take = take  # take(array, axis, index): the row, axis removed
        self._nbytes = nbytes
        self._stacks: list[_Stack] = []

    def _find(self, point: Point) -> tuple[_Stack, int] | None:
        for st in self._stacks:
            k = st.row(point)
            if k >= 0:
                return st, k
        return None

    def _drop(self, st: _Stack, mask: np.ndarray) -> int:
        n = st.drop(mask)
        self._release_if_empty(st)
        return n

    def _drop_row(self, st: _Stack, k: int) -> None:
        st.drop_row(k)
        self._release_if_empty(st)

    def _release_if_empty(self, st: _Stack) -> None:
        if st.count == 0:
            self._stacks.remove(st)  # its array goes with its last row

    # -- reads ------------------------------------------------------------------------------
    def __missing__(self, point: Point) -> Any:
        found = self._find(point)
        if found is None:
            raise KeyError(point)
        st, k = found
        v = self._take(st.arr, st.axis, k)
        self._drop_row(st, k)
        dict.__setitem__(self, point, v)
        return v

    def __contains__(self, point: object) -> bool:
        return dict.__contains__(self, point) or (isinstance(point, tuple) and self._find(point) is not None)

    def get(self, point: Point, default: Any = None) -> Any:  # type: ignore[override]
        if point in self:
            return self[point]
        return default

    def __iter__(self) -> Iterator[Point]:
        yield from list(dict.keys(self))
        for st in list(self._stacks):
            yield from list(st.points())

    def keys(self) -> list[Point]:  # type: ignore[override]
        return list(self)

    def __len__(self) -> int:
        return dict.__len__(self) + self.lazy_points

    @property
    def lazy_points(self) -> int:
        """How many points are rows not copied out yet."""
        return sum(st.count for st in self._stacks)

    # -- whole state (a compiled iteration: runtime/iteration.py) ---------------------------
    def stacks(self) -> list[_Stack]:
        """The stacked arrays with rows still held (read-only use)."""
        return self._stacks

    def stack_bytes(self) -> int:
        """Bytes the held rows count for."""
        return sum(st.share * st.count for st in self._stacks)

    def add_stack(self, arr: Any, axis: int, share: int, cols: np.ndarray, alive: np.ndarray) -> None:
        """Hold the rows of ``arr`` at ``cols`` where ``alive`` (a stack as another one was)."""
        st = _Stack(arr, axis, share, cols)
        st.alive = alive.copy()
        st.count = int(np.count_nonzero(alive))
        if st.count:
            self._stacks.append(st)

    # -- writes and frees ---------------------------------------------------------------------
    def put(self, point: Point, value: Any) -> tuple[int, int]:
        """Store ``value`` at ``point``; returns ``(bytes added, points added)``."""
        db, dn = self.discard(point)
        dict.__setitem__(self, point, value)
        return self._nbytes(value) - db, 1 - dn

    def put_rows(
        self, points: Sequence[Point] | PointRows, arr: Any, axis: int, distinct: bool = False
    ) -> tuple[int, int]:
        """Record ``points[k]`` as row ``k`` of ``arr`` along ``axis`` (nothing copied; rows
        after the last point are padding, accounted with the points); points already held are replaced. ``distinct``: no point repeats (known by the
        caller: not checked)."""
        n = len(points)
        if n == 0:
            return 0, 0
        if arr.shape[axis] < n:  # more rows: a loop's chunk padded to its bucket (runtime/scan.py)
            raise ValueError(f"{n} points for {arr.shape[axis]} rows along axis {axis}")
        if isinstance(points, PointRows):
            rows = points
        else:
            first = next(iter(points))
            rows = PointRows.of(points, len(first))
        if not distinct and repeats(rows.cols):
            raise ValueError(f"the {n} points for {n} rows repeat some point")
        db, dn = self.discard_many(rows) if len(self) else (0, 0)
        share = self._nbytes(arr) // n
        self._stacks.append(_Stack(arr, axis, share, rows.cols))
        return share * n - db, n - dn

    def discard_many(self, points: Iterable[Point]) -> tuple[int, int]:
        """:meth:`discard` of each of ``points`` (a :class:`PointBox` or :class:`PointRows`
        in NumPy per stacked array); returns the totals."""
        released = removed = 0
        if not isinstance(points, PointBox | PointRows):
            listed = list(points)
            points = (
                PointRows.of(listed, self._stacks[0].cols.shape[1]) if self._stacks and listed else listed
            )
        for st in list(self._stacks):
            n = self._drop(st, member_mask(st.cols, points))
            released += n * st.share
            removed += n
        if dict.__len__(self):
            nbytes = self._nbytes
            for p in within(points, dict.keys(self)):
                old = dict.pop(self, p, None)
                if old is not None:
                    released += nbytes(old)
                    removed += 1
        return released, removed

    def discard(self, point: Point) -> tuple[int, int]:
        """Free ``point``; returns ``(bytes released, points removed)``."""
        old = dict.pop(self, point, None)
        if old is not None:
            return self._nbytes(old), 1
        found = self._find(point)
        if found is None:
            return 0, 0
        st, k = found
        self._drop_row(st, k)
        return st.share, 1
