"""Tensor stores: per (node, output) a table from a domain point to a backend tensor.

The executor writes each output of a node at the point it ran, reads source points when
gathering inputs, and frees points on ``Dealloc``. Every put/free updates the byte
accounting (``live_bytes``, ``peak_bytes``) through the backend's ``nbytes``, so memory
passes can be measured rather than claimed.

A table is a dict (point storage) or, for outputs declared with :meth:`PointStore.declare_block`,
a :class:`~timerl.runtime.block_store.BlockTable` (preallocated buffers along one dim for
slice-accessed tensors): its bytes are those of its buffers, whole, from allocation on.

Values are immutable backend tensors; the same object may be stored at several points
(for example a ``CONST``); each stored point is counted once per point, which is what a
runtime without aliasing would hold.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from timerl.runtime.block_store import BlockTable

Point = tuple[int, ...]


@dataclass(frozen=True, slots=True)
class MemoryStats:
    """Bytes held by the stores now (``live_bytes``) and at most so far (``peak_bytes``)."""

    live_bytes: int
    peak_bytes: int
    live_points: int
    block_bytes: int = 0  # of live_bytes: held by block-store buffers (preallocated rows included)


class PointStore:
    """Tensors of one run, keyed by ``(node id, output id)`` then by point.

    ``table(nid, oid)`` returns the underlying dict (or block table) for fast reads (the
    executor keeps a reference to it); writes and frees must go through :meth:`put` and
    :meth:`free` so that the byte accounting stays right.
    """

    def __init__(self, nbytes: Callable[[Any], int]) -> None:
        self._nbytes = nbytes
        self._tables: dict[int, list[Any]] = {}
        self._blocks: list[BlockTable] = []
        self.live_bytes = 0
        self.peak_bytes = 0
        self.live_points = 0

    def declare(self, nid: int, num_outputs: int) -> None:
        """Create the (empty) tables of a node with ``num_outputs`` outputs."""
        if nid not in self._tables:
            self._tables[nid] = [{} for _ in range(num_outputs)]

    def declare_block(self, nid: int, oid: int, table: BlockTable) -> None:
        """Keep output ``oid`` of ``nid`` (declared, still empty) in a block table."""
        tabs = self._tables[nid]
        if tabs[oid]:
            raise ValueError(f"%{nid} output {oid} already holds points; declare its block table first")
        tabs[oid] = table
        self._blocks.append(table)

    def table(self, nid: int, oid: int) -> Any:
        """The dict (or :class:`BlockTable`) holding output ``oid`` of node ``nid`` (read-only use)."""
        return self._tables[nid][oid]

    def is_block(self, nid: int, oid: int) -> bool:
        """Whether output ``oid`` of ``nid`` is block-stored."""
        return isinstance(self._tables[nid][oid], BlockTable)

    def block_tables(self) -> list[BlockTable]:
        return list(self._blocks)

    def put(self, nid: int, oid: int, point: Point, value: Any) -> None:
        """Store ``value`` as output ``oid`` of ``nid`` at ``point`` (replacing any old value)."""
        tab = self._tables[nid][oid]
        if type(tab) is not dict:
            db, dn = tab.put(point, value)
            self.live_bytes += db
            self.live_points += dn
            if self.live_bytes > self.peak_bytes:
                self.peak_bytes = self.live_bytes
            return
        old = tab.get(point)
        if old is not None:
            self.live_bytes -= self._nbytes(old)
            self.live_points -= 1
        tab[point] = value
        self.live_bytes += self._nbytes(value)
        self.live_points += 1
        if self.live_bytes > self.peak_bytes:
            self.peak_bytes = self.live_bytes

    def get(self, nid: int, oid: int, point: Point) -> Any:
        """The stored value; ``KeyError`` if it was never written or was freed."""
        return self._tables[nid][oid][point]

    def has(self, nid: int, oid: int, point: Point) -> bool:
        tabs = self._tables.get(nid)
        return tabs is not None and point in tabs[oid]

    def free(self, nid: int, point: Point) -> int:
        """Drop every output of ``nid`` at ``point``; returns the bytes released."""
        released = 0
        for tab in self._tables.get(nid, ()):
            if type(tab) is not dict:
                b, n = tab.discard(point)
                released += b
                self.live_points -= n
                continue
            old = tab.pop(point, None)
            if old is not None:
                released += self._nbytes(old)
                self.live_points -= 1
        self.live_bytes -= released
        return released

    def points(self, nid: int, oid: int = 0) -> Iterable[Point]:
        """The points stored for output ``oid`` of ``nid``."""
        return list(self._tables.get(nid, [{}] * (oid + 1))[oid])

    def stats(self) -> MemoryStats:
        blocks = sum(t.bytes for t in self._blocks if not t.demoted)
        return MemoryStats(self.live_bytes, self.peak_bytes, self.live_points, blocks)
