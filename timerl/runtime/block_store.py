"""Block storage for slice-accessed tensors (TimeRL §6, "tensor storage").

The point store keeps one backend tensor per point, so a slice read such as ``r[i, t:T]``
gathers ``T - t`` tensors and stacks them: ``O(T)`` Python-level work per read,
``O(T^2)`` per episode for Monte-Carlo returns. A *block store* keeps, per output of a
node, preallocated *blocks*: buffers of ``rows`` consecutive points along one dim (the
block dim) for one *key* (the point's other coordinates, e.g. ``(i,)``); block ``c``
holds coordinates ``c * rows .. (c + 1) * rows - 1``. A point write copies the value
into its row in place (Torch: ``copy_`` into a view; JAX: a jitted
``dynamic_update_slice`` that donates the buffer, compiled once per block shape), and a
slice read is one backend call on the one or few blocks it spans (a view on Torch when
it lies in one block) instead of a stack of ``N`` tensors.

**Which tensors** (:func:`~timerl.plan.storage.plan_block_storage`, from the PDG, in the plan): an output is
block-stored when some data edge reads it with exactly one :class:`~timerl.symbolic.Slice`
component and no ``select``, and several sink points read the same key through it
(:func:`rereads`: ``r[i, t:T]`` at every ``t``, windows, prefixes; not ``g[i, 0:T]`` read
once per ``i``, where stacking already reads each point once and a block would only add
a copy per write). The block dim is the source dim of that component (the one most such
edges slice, when they disagree). Outputs with symbolic per-point shapes, and
everything else, stay in the point store; other reads of a block-stored output (points,
other slices) read its rows.

**Block size**: the largest slice extent along the block dim (``t:min(t + 3, T)``: 3;
``0:T`` with a static ``T``: ``T``, so such reads are views of one block), at least
:data:`MIN_BLOCK` rows (unless the dim's static bound is smaller), at most
:data:`MAX_BLOCK`; :data:`DEFAULT_BLOCK` when the extent is not bounded statically
(``t:T`` with a dynamic ``T``). Blocks are allocated when their first point is written,
so a key holds at most one partly used block: no regrowth copies, and one block shape
per tensor (one JAX compilation).

**Memory** is accounted per block (its whole size, from allocation), so
``peak_bytes``/``live_bytes`` include the preallocated rows. A block is released when
its last point is freed (``Dealloc`` or a finished iteration, ``gc.py``); freeing other
points only marks them absent ("can delay memory management requests", as the paper
notes).

**Aliasing**: rows are written once. Reads may alias a block (Torch views), so writing a
row again (a point stored twice) first copies the block, and values handed out before
keep theirs. A value whose shape or dtype differs from the rows written before turns the
table into a point table (a plain dict, the rows copied out) for the rest of the run.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from timerl.backends.base import AbstractBackend
from timerl.plan.storage import BlockSpec

log = logging.getLogger(__name__)

Point = tuple[int, ...]


class _Block:
    """One block's buffer, and which of its rows hold a point."""

    __slots__ = ("buf", "count", "present")

    def __init__(self, buf: Any, rows: int) -> None:
        self.buf = buf
        self.present = np.zeros(rows, dtype=bool)
        self.count = 0


class BlockTable:
    """The stored points of one block-stored output: a mapping ``point -> tensor`` for the
    executor's reads, plus :meth:`rows` for slice reads. Writes and frees go through
    :meth:`put` and :meth:`discard`, which return the change in bytes and points so that
    :class:`~timerl.runtime.store.PointStore` can keep its accounting.
    """

    def __init__(self, spec: BlockSpec, backend: AbstractBackend, label: str = "") -> None:
        self.spec = spec
        self.label = label or f"%{spec.nid}"
        self._be = backend
        self._nbytes: Callable[[Any], int] = backend.nbytes
        self._k = spec.axis
        self._bs = spec.rows
        self._blocks: dict[tuple[Point, int], _Block] = {}  # (key, block index) -> block
        self._row_like: tuple[tuple[int, ...], Any] | None = None  # (shape, dtype) of a row
        self._points: dict[Point, Any] | None = None  # set once demoted to point storage
        self.bytes = 0  # bytes held: whole blocks (or the points, once demoted)
        self.num_points = 0
        self.allocations = 0

    def _find(self, point: Point) -> tuple[_Block | None, int]:
        k = self._k
        c, off = divmod(point[k], self._bs)
        return self._blocks.get((point[:k] + point[k + 1 :], c)), off

    # -- mapping interface used by the executor's point reads ------------------------------
    def __getitem__(self, point: Point) -> Any:
        if self._points is not None:
            return self._points[point]
        blk, off = self._find(point)
        if blk is None or not blk.present[off]:
            raise KeyError(point)
        return self._be.block_row(blk.buf, off)

    def __contains__(self, point: object) -> bool:
        if self._points is not None:
            return point in self._points
        if not isinstance(point, tuple):
            return False
        blk, off = self._find(point)
        return blk is not None and bool(blk.present[off])

    def get(self, point: Point, default: Any = None) -> Any:
        try:
            return self[point]
        except KeyError:
            return default

    def __iter__(self) -> Iterator[Point]:
        if self._points is not None:
            yield from list(self._points)
            return
        k, bs = self._k, self._bs
        for (key, c), blk in list(self._blocks.items()):
            for off in np.flatnonzero(blk.present).tolist():
                yield key[:k] + (c * bs + off,) + key[k:]

    def __len__(self) -> int:
        return self.num_points

    @property
    def demoted(self) -> bool:
        """Whether the table fell back to point storage (a value of another shape or dtype)."""
        return self._points is not None

    @property
    def num_blocks(self) -> int:
        return len(self._blocks)

    # -- slice reads -------------------------------------------------------------------------
    def rows(self, key: Point, start: int, stop: int, size: int) -> Any:
        """The points of ``key`` with block coordinate in ``[start, stop)`` (``start < stop``),
        stacked at ``spec.row_axis`` and zero-padded there to ``size`` rows; ``None`` once
        demoted (read point by point then). ``KeyError(point)`` names a missing point."""
        if self._points is not None:
            return None
        bs, blocks = self._bs, self._blocks
        pieces = []
        if start >= 0:
            for c in range(start // bs, (stop - 1) // bs + 1):
                blk = blocks.get((key, c))
                lo, hi = max(start - c * bs, 0), min(stop - c * bs, bs)
                if blk is None or not blk.present[lo:hi].all():
                    break
                pieces.append((blk.buf, lo, hi))
            else:
                return self._be.block_rows(pieces, self.spec.row_axis, size)
        k = self._k
        row = next(r for r in range(start, stop) if key[:k] + (r,) + key[k:] not in self)
        raise KeyError(key[:k] + (row,) + key[k:])

    # -- writes and frees ----------------------------------------------------------------------
    def put(self, point: Point, value: Any) -> tuple[int, int]:
        """Store ``value`` at ``point``; returns ``(bytes added, points added)``."""
        if self._points is not None:
            return self._put_point(point, value)
        like = (tuple(value.shape), value.dtype)
        if self._row_like is None:
            self._row_like = like
        k = self._k
        row = point[k]
        if like != self._row_like or row < 0:
            log.warning(
                "%s: a value of shape %s and dtype %s at %s does not fit its block store (rows of %s, %s); "
                "keeping this tensor in a point store",
                self.label,
                like[0],
                like[1],
                point,
                self._row_like[0],
                self._row_like[1],
            )
            delta = self._demote()
            d, n = self._put_point(point, value)
            return delta + d, n
        be = self._be
        c, off = divmod(row, self._bs)
        bkey = (point[:k] + point[k + 1 :], c)
        blk = self._blocks.get(bkey)
        delta = 0
        if blk is None:
            blk = self._blocks[bkey] = _Block(be.block_alloc(self._bs, value), self._bs)
            delta = self._nbytes(blk.buf)
            self.bytes += delta
            self.allocations += 1
        elif blk.present[off]:  # written again: earlier reads may alias the row, so copy first
            blk.buf = be.block_copy(blk.buf)
        blk.buf = be.block_write(blk.buf, off, value)
        if blk.present[off]:
            return delta, 0
        blk.present[off] = True
        blk.count += 1
        self.num_points += 1
        return delta, 1

    def put_rows(self, cols: np.ndarray, arr: Any, axis: int) -> tuple[int, int] | None:
        """Store row ``j`` of ``arr`` along ``axis`` at the point ``cols[j]`` when the points
        are consecutive along the block dim for one key (a scanned loop's rows): one write per
        block spanned. Returns ``(bytes added, points added)``, or None (nothing stored) when
        they are not, or the rows do not fit the blocks (the caller puts them one by one)."""
        n, k = len(cols), self._k
        if n == 0:
            return 0, 0
        if self._points is not None:
            return None
        others = np.delete(cols, k, axis=1)
        start = int(cols[0, k])
        if start < 0 or (others != others[0]).any() or (np.diff(cols[:, k]) != 1).any():
            return None
        like = (tuple(arr.shape[:axis]) + tuple(arr.shape[axis + 1 :]), arr.dtype)
        if self._row_like is not None and like != self._row_like:
            return None
        self._row_like = like
        be, key = self._be, tuple(int(c) for c in others[0])
        delta = added = pos = 0
        while pos < n:
            c, off = divmod(start + pos, self._bs)
            m = min(self._bs - off, n - pos)
            blk = self._blocks.get((key, c))
            if blk is None:
                blk = self._blocks[(key, c)] = _Block(
                    be.block_alloc(self._bs, be.take(arr, axis, pos)), self._bs
                )
                b = self._nbytes(blk.buf)
                self.bytes += b
                delta += b
                self.allocations += 1
            elif blk.present[off : off + m].any():  # written again: earlier reads may alias it
                blk.buf = be.block_copy(blk.buf)
            blk.buf = be.block_write_rows(blk.buf, off, arr, axis, pos, m)
            new = int(m - blk.present[off : off + m].sum())
            blk.present[off : off + m] = True
            blk.count += new
            self.num_points += new
            added += new
            pos += m
        return delta, added

    def discard(self, point: Point) -> tuple[int, int]:
        """Free ``point``; returns ``(bytes released, points removed)``. A block is released
        with its last point."""
        if self._points is not None:
            old = self._points.pop(point, None)
            if old is None:
                return 0, 0
            b = self._nbytes(old)
            self.bytes -= b
            self.num_points -= 1
            return b, 1
        k = self._k
        c, off = divmod(point[k], self._bs)
        bkey = (point[:k] + point[k + 1 :], c)
        blk = self._blocks.get(bkey)
        if blk is None or not blk.present[off]:
            return 0, 0
        blk.present[off] = False
        blk.count -= 1
        self.num_points -= 1
        if blk.count:
            return 0, 1
        del self._blocks[bkey]
        b = self._nbytes(blk.buf)
        self.bytes -= b
        return b, 1

    # -- internals ------------------------------------------------------------------------------
    def _put_point(self, point: Point, value: Any) -> tuple[int, int]:
        assert self._points is not None
        old = self._points.get(point)
        self._points[point] = value
        b = self._nbytes(value) - (self._nbytes(old) if old is not None else 0)
        self.bytes += b
        if old is None:
            self.num_points += 1
            return b, 1
        return b, 0

    def _demote(self) -> int:
        """Copy every row out into a dict; returns the change in bytes."""
        pts = {p: self[p] for p in self}
        before = self.bytes
        self._blocks.clear()
        self._points = pts
        self.bytes = sum(self._nbytes(v) for v in pts.values())
        return self.bytes - before
