"""A point table whose points may be rows of a stacked array, copied out only when read.

A loop run as one ``lax.scan`` (:mod:`~timerl.runtime.scan`) returns each output it keeps
as one array with a row per iteration. Storing it point by point (one copy per row) cost
PPO's 250-step rollout about 2,000 copies per iteration, most never read one by one: the
learning phase reads the whole rollout at once (a slice read served from the stacked array,
``Executor.stack_hints``). A :class:`RowsTable` records the rows instead (point ->
``(stack, row)``) and copies a row out the first time that point is read; frees drop the
record; the stacked array is released with its last row (and the hint that holds it).

It is a ``dict`` so the executor's point reads stay plain subscripts; a row not copied out
yet is produced by ``__missing__``. ``get``, ``in``, ``len`` and iteration see both kinds of
point. Writes and frees go through :meth:`put`, :meth:`put_rows` and :meth:`discard`, which
return the change in ``(bytes, points)`` for :class:`~timerl.runtime.store.PointStore`'s
accounting (a row counts its share of the stacked array's bytes).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

Point = tuple[int, ...]


class RowsTable(dict):
    """Points of one output of a node; some are rows of stacked arrays not copied out yet."""

    def __init__(self, take: Callable[[Any, int, int], Any], nbytes: Callable[[Any], int]) -> None:
        super().__init__()
        self._take = take  # take(array, axis, index): the row, axis removed
        self._nbytes = nbytes
        self._lazy: dict[Point, tuple[Any, int, int, int]] = {}  # point -> (array, axis, row, bytes)

    # -- reads ------------------------------------------------------------------------------
    def __missing__(self, point: Point) -> Any:
        arr, axis, row, _ = self._lazy.pop(point)  # KeyError(point) when absent
        v = self._take(arr, axis, row)
        dict.__setitem__(self, point, v)
        return v

    def __contains__(self, point: object) -> bool:
        return dict.__contains__(self, point) or point in self._lazy

    def get(self, point: Point, default: Any = None) -> Any:  # type: ignore[override]
        if dict.__contains__(self, point) or point in self._lazy:
            return self[point]
        return default

    def __iter__(self) -> Iterator[Point]:
        yield from list(dict.keys(self))
        yield from list(self._lazy)

    def keys(self) -> list[Point]:  # type: ignore[override]
        return list(self)

    def __len__(self) -> int:
        return dict.__len__(self) + len(self._lazy)

    @property
    def lazy_points(self) -> int:
        """How many points are rows not copied out yet."""
        return len(self._lazy)

    # -- writes and frees ---------------------------------------------------------------------
    def put(self, point: Point, value: Any) -> tuple[int, int]:
        """Store ``value`` at ``point``; returns ``(bytes added, points added)``."""
        db, dn = self.discard(point)
        dict.__setitem__(self, point, value)
        return self._nbytes(value) - db, 1 - dn

    def put_rows(self, points: Sequence[Point], arr: Any, axis: int) -> tuple[int, int]:
        """Record ``points[k]`` as row ``k`` of ``arr`` along ``axis`` (nothing copied)."""
        n = len(points)
        if n == 0:
            return 0, 0
        if arr.shape[axis] != n:
            raise ValueError(f"{n} points for {arr.shape[axis]} rows along axis {axis}")
        share = self._nbytes(arr) // n
        lazy = self._lazy
        if lazy.keys().isdisjoint(points) and dict.keys(self).isdisjoint(points):  # nothing replaced
            before = len(lazy)
            lazy.update(zip(points, [(arr, axis, k, share) for k in range(n)], strict=True))
            if len(lazy) - before != n:
                raise ValueError(f"the {n} points for {n} rows repeat some point")
            return share * n, n
        db = dn = 0
        for k, p in enumerate(points):
            b, m = self.discard(p)
            db -= b
            dn -= m
            self._lazy[p] = (arr, axis, k, share)
        return db + share * n, dn + n

    def discard_many(self, points: Sequence[Point]) -> tuple[int, int]:
        """:meth:`discard` of each of ``points``; returns the totals."""
        lazy, nbytes = self._lazy, self._nbytes
        released = removed = 0
        for p in points:
            ent = lazy.pop(p, None)
            if ent is not None:
                released += ent[3]
                removed += 1
                continue
            old = dict.pop(self, p, None)
            if old is not None:
                released += nbytes(old)
                removed += 1
        return released, removed

    def discard(self, point: Point) -> tuple[int, int]:
        """Free ``point``; returns ``(bytes released, points removed)``."""
        ent = self._lazy.pop(point, None)
        if ent is not None:
            return ent[3], 1
        old = dict.pop(self, point, None)
        if old is None:
            return 0, 0
        return self._nbytes(old), 1
