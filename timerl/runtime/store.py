"""Tensor stores: per (node, output) a table from a domain point to a backend tensor.

The executor writes each output of a node at the point it ran, reads source points when
gathering inputs, and frees points on ``Dealloc``. Every put/free updates the byte
accounting (``live_bytes``, ``peak_bytes``) through the backend's ``nbytes``, so memory
passes can be measured rather than claimed.

A table is a dict (point storage) or, for outputs declared with :meth:`PointStore.declare_block`,
a :class:`~timerl.runtime.block_store.BlockTable` (preallocated buffers along one dim for
slice-accessed tensors): its bytes are those of its buffers, whole, from allocation on;
or, for outputs declared with :meth:`PointStore.declare_rows`, a
:class:`~timerl.runtime.rows_table.RowsTable` whose points may be rows of a stacked array
(a scanned loop's output) copied out when first read.

Values are immutable backend tensors; the same object may be stored at several points
(for example a ``CONST``); each stored point is counted once per point, which is what a
runtime without aliasing would hold.

**Pools and tensors.** Every table belongs to a memory pool (``"device"``, where backend
tensors live, or ``"host"``, for values kept in host memory; on CPU the two are still
counted apart, so moving values between them is measured). Live and peak bytes are kept
per pool and per node as well as in total, with a few integer updates per put/free, so the
accounting stays on in every run. With :meth:`PointStore.record_timeline` (compile option
``memory_timeline``) each change also samples the live bytes per pool with the time
(:class:`MemoryTimeline`, the paper's Fig. 11a). Swapping (:meth:`PointStore.offload`,
:meth:`PointStore.fetch`) moves a point's outputs between the pools: a host copy
(``backend.to_host``) replaces the device tensor, and back (``backend.from_host``). ``peak_bytes`` is the most bytes held at once by all
pools together; a pool's or a node's peak is its own maximum (they need not coincide).
"""

from __future__ import annotations

import logging
import resource
import sys
import time
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from timerl.errors import MemoryBudgetError
from timerl.runtime.block_store import BlockTable
from timerl.runtime.points import PointBox, PointRows, within
from timerl.runtime.rows_table import RowsTable
from timerl.units import fmt_bytes

Point = tuple[int, ...]

log = logging.getLogger(__name__)


POOLS = ("device", "host")
"""Memory pools of a store (see the module doc)."""
_HOST = POOLS.index("host")
_DEVICE = POOLS.index("device")

DEFAULT_TOP = 10
"""How many tensors :meth:`PointStore.stats` lists, largest peak first."""


@dataclass(frozen=True, slots=True)
class PoolStats:
    """Bytes one pool holds now and held at most so far."""

    live_bytes: int
    peak_bytes: int


@dataclass(frozen=True, slots=True)
class TensorStats:
    """Bytes the outputs of one node hold now and held at most so far, and its live points."""

    node: int
    label: str
    live_bytes: int
    peak_bytes: int
    live_points: int


@dataclass(frozen=True, slots=True)
class MemoryStats:
    """Bytes held by the stores now (``live_bytes``) and at most so far (``peak_bytes``).

    ``pools``: per pool (``"device"``, ``"host"``); ``tensors``: the nodes with the largest
    peaks (at most ``top`` of them, largest first); ``max_rss_bytes``: the process's
    maximum resident set size so far (``getrusage``; 0 where unavailable).
    """

    live_bytes: int
    peak_bytes: int
    live_points: int
    block_bytes: int = 0  # of live_bytes: held by block-store buffers (preallocated rows included)
    pools: tuple[tuple[str, PoolStats], ...] = ()
    tensors: tuple[TensorStats, ...] = ()
    max_rss_bytes: int = 0

    def pool(self, name: str) -> PoolStats:
        """The stats of pool ``name`` (zero for a pool nothing was put in)."""
        return dict(self.pools).get(name, PoolStats(0, 0))

    def summary(self) -> str:
        """One line per pool and per listed tensor (MiB), for logs and benchmarks."""
        mib = 1 << 20
        lines = [
            f"store: live {self.live_bytes / mib:.2f} MiB, peak {self.peak_bytes / mib:.2f} MiB, "
            f"{self.live_points} points; max RSS {self.max_rss_bytes / mib:.0f} MiB"
        ]
        lines += [
            f"  pool {n}: live {p.live_bytes / mib:.2f} MiB, peak {p.peak_bytes / mib:.2f} MiB"
            for n, p in self.pools
        ]
        lines += [
            f"  {t.label} (%{t.node}): live {t.live_bytes / mib:.2f} MiB ({t.live_points} points), "
            f"peak {t.peak_bytes / mib:.2f} MiB"
            for t in self.tensors
        ]
        return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class MemoryTimeline:
    """Live bytes per pool over a run (paper Fig. 11a): sample ``k`` was taken at
    ``seconds[k]`` after the run started, right after a put or free changed the bytes, and
    ``pools`` holds, per pool, the live bytes at each sample (same length as ``seconds``)."""

    seconds: tuple[float, ...]
    pools: tuple[tuple[str, tuple[int, ...]], ...]

    def pool(self, name: str) -> tuple[int, ...]:
        """The live bytes of pool ``name`` at each sample."""
        return dict(self.pools)[name]

    def total(self) -> tuple[int, ...]:
        """The live bytes of all pools together at each sample."""
        return tuple(sum(vs) for vs in zip(*(v for _, v in self.pools), strict=True)) if self.pools else ()


def max_rss_bytes() -> int:
    """The process's maximum resident set size so far, in bytes (0 where unknown)."""
    try:
        r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    except (OSError, ValueError):
        return 0
    return int(r) if sys.platform == "darwin" else int(r) * 1024  # kilobytes on Linux


class PointStore:
    """Tensors of one run, keyed by ``(node id, output id)`` then by point.

    ``table(nid, oid)`` returns the underlying dict (or block table) for fast reads (the
    executor keeps a reference to it); writes and frees must go through :meth:`put` and
    :meth:`free` so that the byte accounting stays right.
    """

    def __init__(
        self,
        nbytes: Callable[[Any], int],
        to_host: Callable[[Any], Any] | None = None,
        from_host: Callable[[Any], Any] | None = None,
        host_nbytes: Callable[[Any], int] | None = None,
        budget: int | None = None,
        labels: Mapping[int, str] | None = None,
    ) -> None:
        self._nbytes = nbytes
        # the user's memory_budget: a put that takes the device pool above it raises
        # MemoryBudgetError naming the tensor (labels: node id -> label, for the message)
        self._budget = budget
        self._labels = labels or {}
        # swapping (offload / fetch): per node, point -> host copies of its outputs (None
        # where an output holds nothing), in the "host" pool
        self._to_host = to_host
        self._from_host = from_host
        self._host_nbytes = host_nbytes or nbytes
        self._host: dict[int, dict[Point, list[Any]]] = {}
        self._not_moved: set[int] = set()  # nodes whose tables cannot move (logged once)
        # id(device tensor) -> weak references to it and to its host copy (_host_copy)
        self._host_of: dict[int, tuple[Any, Any]] = {}
        self._prune_at = 1024
        self._tables: dict[int, list[Any]] = {}
        self._blocks: list[BlockTable] = []
        self.live_bytes = 0
        self.peak_bytes = 0
        self.live_points = 0
        # per node: [live bytes, peak bytes, live points, pool index]
        self._nodes: dict[int, list[int]] = {}
        self._pool_live = [0] * len(POOLS)
        self._pool_peak = [0] * len(POOLS)
        # (time, live bytes per pool...) after each change, when recording (record_timeline)
        self._timeline: list[tuple[float, ...]] | None = None
        self._t0 = 0.0

    def record_timeline(self) -> None:
        """Sample the live bytes per pool after every put and free from now on
        (:meth:`timeline`); one clock read and one tuple per change."""
        self._t0 = time.perf_counter()
        self._timeline = [(0.0, *self._pool_live)]

    def timeline(self) -> MemoryTimeline | None:
        """The samples taken since :meth:`record_timeline` (None when not recording)."""
        if self._timeline is None:
            return None
        cols = list(zip(*self._timeline, strict=True))
        return MemoryTimeline(
            tuple(cols[0]), tuple((name, tuple(cols[1 + k])) for k, name in enumerate(POOLS))
        )

    def declare(self, nid: int, num_outputs: int, pool: str = "device") -> None:
        """Create the (empty) tables of a node with ``num_outputs`` outputs, in ``pool``."""
        if nid not in self._tables:
            self._tables[nid] = [{} for _ in range(num_outputs)]
            self._nodes[nid] = [0, 0, 0, POOLS.index(pool)]

    def declare_block(self, nid: int, oid: int, table: BlockTable) -> None:
        """Keep output ``oid`` of ``nid`` (declared, still empty) in a block table."""
        tabs = self._tables[nid]
        if tabs[oid]:
            raise ValueError(f"%{nid} output {oid} already holds points; declare its block table first")
        tabs[oid] = table
        self._blocks.append(table)

    def declare_rows(self, nid: int, oid: int, table: RowsTable) -> None:
        """Keep output ``oid`` of ``nid`` (declared, still empty) in a :class:`RowsTable`, so
        that :meth:`put_rows` can record rows of stacked arrays without copying them."""
        tabs = self._tables[nid]
        if tabs[oid]:
            raise ValueError(f"%{nid} output {oid} already holds points; declare its rows table first")
        tabs[oid] = table

    def put_rows(
        self, nid: int, oid: int, points: Sequence[Point], arr: Any, axis: int, distinct: bool = False
    ) -> bool:
        """Store ``points[k]`` as row ``k`` of ``arr`` along ``axis``; False (nothing stored)
        when the output is not kept in a :class:`RowsTable` or (consecutive rows) a
        :class:`BlockTable`. ``distinct``: the caller knows
        no point repeats (not checked again)."""
        tab = self._tables[nid][oid]
        if type(tab) is BlockTable:  # consecutive rows along its block dim: one write per block
            cols = points.cols if isinstance(points, PointRows) else np.asarray(list(points), dtype=np.int64)
            got = tab.put_rows(cols.reshape(len(points), -1), arr, axis)
            if got is None:
                return False
            self._account(nid, *got)
            return True
        if type(tab) is not RowsTable:
            return False
        db, dn = tab.put_rows(points, arr, axis, distinct)
        self._account(nid, db, dn)
        return True

    def table(self, nid: int, oid: int) -> Any:
        """The dict (or :class:`BlockTable`) holding output ``oid`` of node ``nid`` (read-only use)."""
        return self._tables[nid][oid]

    def is_block(self, nid: int, oid: int) -> bool:
        """Whether output ``oid`` of ``nid`` is block-stored."""
        return isinstance(self._tables[nid][oid], BlockTable)

    def block_tables(self) -> list[BlockTable]:
        return list(self._blocks)

    def _account(self, nid: int, db: int, dn: int, pool: int | None = None) -> None:
        """Add ``db`` bytes and ``dn`` points to the totals, ``nid``'s and its pool's
        (``pool``: an index into :data:`POOLS`, default the node's)."""
        acc = self._nodes[nid]
        acc[0] += db
        acc[2] += dn
        self.live_points += dn
        if acc[0] > acc[1]:
            acc[1] = acc[0]
        k = acc[3] if pool is None else pool
        self._pool_live[k] += db
        if self._pool_live[k] > self._pool_peak[k]:
            self._pool_peak[k] = self._pool_live[k]
            if self._budget is not None and k == _DEVICE and self._pool_live[k] > self._budget:
                self._over_budget(nid)
        self.live_bytes += db
        if self.live_bytes > self.peak_bytes:
            self.peak_bytes = self.live_bytes
        if self._timeline is not None and db:
            self._timeline.append((time.perf_counter() - self._t0, *self._pool_live))

    def _over_budget(self, nid: int) -> None:
        """Raise :class:`MemoryBudgetError`: storing ``nid`` took the device pool over the budget."""
        labels = self._labels
        live = sorted(
            ((acc[0], n) for n, acc in self._nodes.items() if acc[0] > 0 and acc[3] == _DEVICE), reverse=True
        )
        rows = "\n".join(
            f"  {labels.get(n, f'%{n}')}: {fmt_bytes(b)} in {self._nodes[n][2]} points"
            for b, n in live[:DEFAULT_TOP]
        )
        raise MemoryBudgetError(
            f"memory_budget={fmt_bytes(self._budget or 0)} exceeded at run time: storing "
            f"{labels.get(nid, f'%{nid}')} ({self._nodes[nid][2]} points, {fmt_bytes(self._nodes[nid][0])} live) "
            f"brings the device store to {fmt_bytes(self._pool_live[_DEVICE])}. The compile-time estimate "
            "walks dynamic bounds at 1 (and cannot see every run's sizes). Live tensors, largest first:\n"
            f"{rows}\nFix: raise memory_budget, or shrink the largest tensors (fewer envs or steps, "
            "shorter episodes), or free them earlier (dealloc=True, a smaller swap_threshold)."
        )

    def put(self, nid: int, oid: int, point: Point, value: Any) -> None:
        """Store ``value`` as output ``oid`` of ``nid`` at ``point`` (replacing any old value)."""
        tab = self._tables[nid][oid]
        if type(tab) is not dict:
            db, dn = tab.put(point, value)
            self._account(nid, db, dn)
            return
        old = tab.get(point)
        tab[point] = value
        if old is None:
            self._account(nid, self._nbytes(value), 1)
        else:
            self._account(nid, self._nbytes(value) - self._nbytes(old), 0)

    def get(self, nid: int, oid: int, point: Point) -> Any:
        """The stored value; ``KeyError`` if it was never written or was freed."""
        return self._tables[nid][oid][point]

    def has(self, nid: int, oid: int, point: Point) -> bool:
        tabs = self._tables.get(nid)
        return tabs is not None and point in tabs[oid]

    def free(self, nid: int, point: Point) -> int:
        """Drop every output of ``nid`` at ``point`` (on the device or offloaded to the
        host); returns the bytes released."""
        return self.free_points(nid, (point,))

    def free_points(self, nid: int, points: Iterable[Point], outputs: tuple[int, ...] = ()) -> int:
        """:meth:`free` of several points, accounted once (a batched free); with ``outputs``,
        of those outputs only (the others stay, as on the host when swapped: a node freed
        per output is never swapped, ``schedule/dealloc.py``)."""
        released = removed = host_b = host_n = 0
        tabs = self._tables.get(nid, ())
        if outputs:
            tabs = [tabs[o] for o in outputs if o < len(tabs)]
        host = None if outputs else self._host.get(nid)
        if not isinstance(points, PointBox | PointRows):
            points = list(points)
        for tab in tabs:
            kind = type(tab)
            if kind is RowsTable:  # rows of scans: freed in one call per table
                b, n = tab.discard_many(points)
            elif kind is dict:
                b = n = 0
                for point in within(points, tab):
                    old = tab.pop(point, None)
                    if old is not None:
                        b += self._nbytes(old)
                        n += 1
            else:  # a block table
                b = n = 0
                for point in points:
                    db, dn = tab.discard(point)
                    b += db
                    n += dn
            released += b
            removed += n
        for point in within(points, host) if host else ():
            hs = host.pop(point, None)
            if hs is not None:
                host_b += sum(self._host_nbytes(h) for h in hs if h is not None)
                host_n += sum(h is not None for h in hs)
        if removed:
            self._account(nid, -released, -removed)
        if host_n:
            self._account(nid, -host_b, -host_n, _HOST)
        return released + host_b

    # -- whole tables (a compiled iteration: runtime/iteration.py) -------------------------
    def all_tables(self) -> dict[int, list[Any]]:
        """Every node's tables (node id -> one per output), for reading and in-place value
        replacement only: entries change through :meth:`load_table`."""
        return self._tables

    def table_bytes(self, tab: Any) -> tuple[int, int]:
        """``(bytes, points)`` a dict or rows table holds."""
        nb = self._nbytes
        b = sum(nb(v) for v in dict.values(tab))
        n = dict.__len__(tab)
        if type(tab) is RowsTable:
            b += tab.stack_bytes()
            n += tab.lazy_points
        return b, n

    def load_table(
        self, nid: int, oid: int, entries: dict[Point, Any], stacks: Sequence[tuple[Any, ...]] = ()
    ) -> None:
        """Replace what output ``oid`` of ``nid`` holds by ``entries`` and, for a rows table,
        ``stacks`` (``(array, axis, share, cols, alive)`` each), accounted as puts and frees."""
        tab = self._tables[nid][oid]
        b0, n0 = self.table_bytes(tab)
        dict.clear(tab)
        dict.update(tab, entries)
        if type(tab) is RowsTable:
            tab.stacks().clear()
            for st in stacks:
                tab.add_stack(*st)
        b1, n1 = self.table_bytes(tab)
        if b1 != b0 or n1 != n0:
            self._account(nid, b1 - b0, n1 - n0)

    def snapshot(self) -> Any:
        """Everything :meth:`restore` needs to undo changes to the tables and the accounting
        (not the block or host pools)."""
        tabs = []
        for nid, ts in self._tables.items():
            for oid, tab in enumerate(ts):
                if type(tab) is RowsTable:
                    stacks = [(st.arr, st.axis, st.share, st.cols, st.alive.copy()) for st in tab.stacks()]
                    tabs.append((nid, oid, dict(dict.items(tab)), stacks))
                elif type(tab) is dict:
                    tabs.append((nid, oid, dict(tab), None))
        acc = {nid: list(a) for nid, a in self._nodes.items()}
        return tabs, acc, list(self._pool_live), self.live_bytes, self.live_points

    def restore(self, snap: Any) -> None:
        """Undo every change since :meth:`snapshot` (peaks stay as they are)."""
        tabs, acc, pool_live, self.live_bytes, self.live_points = snap
        for nid, oid, entries, stacks in tabs:
            tab = self._tables[nid][oid]
            dict.clear(tab)
            dict.update(tab, entries)
            if stacks is not None:
                tab.stacks().clear()
                for st in stacks:
                    tab.add_stack(*st)
        for nid, a in acc.items():
            self._nodes[nid][:] = a
        self._pool_live[:] = pool_live

    # -- swapping -------------------------------------------------------------------------
    def _movable(self, nid: int) -> bool:
        """Whether ``nid`` has outputs that can move: those in plain dict tables (outputs
        in a block or rows table, preallocated buffers or a scanned loop's stacked rows,
        stay on the device; logged once)."""
        tabs = self._tables.get(nid, ())
        if self._to_host is None:
            return False
        if any(type(t) is not dict for t in tabs) and nid not in self._not_moved:
            self._not_moved.add(nid)
            log.debug(
                "%%%d: outputs kept in a block or rows table (preallocated buffers / a scanned "
                "loop's stacked rows) stay on the device when it is swapped", nid
            )  # fmt: skip
        return any(type(t) is dict for t in tabs)

    def offload(self, nid: int, points: Iterable[Point]) -> int:
        """Move the outputs of ``nid`` at ``points`` from the device pool to the host pool (a
        host copy each; the device tensors are dropped). Points not on the device (freed by a
        merge that moved them, never stored) are skipped. Returns the bytes moved."""
        if not self._movable(nid):
            return 0
        tabs = self._tables[nid]
        host = self._host.setdefault(nid, {})
        moved = n = hb = 0
        for point in points:
            vals = [tab.pop(point, None) if type(tab) is dict else None for tab in tabs]
            if all(v is None for v in vals):
                continue
            hs = host.get(point) or [None] * len(tabs)
            for k, v in enumerate(vals):
                if v is not None:
                    hs[k] = h = self._host_copy(v)
                    moved += self._nbytes(v)
                    hb += self._host_nbytes(h)
                    n += 1
            host[point] = hs
        if n:
            self._move(nid, moved, hb, n, to_host=True)
        return moved

    def _host_copy(self, v: Any) -> Any:
        """``to_host(v)``, shared by the points that store the same tensor (a ``MERGE`` stores
        its branch's tensor): one host copy per tensor, as on the device, until the tensor is
        overwritten (:meth:`forget_host_copy`). (The accounting
        still counts each point, like the device pool's.)"""
        key = id(v)
        hit = self._host_of.get(key)
        if hit is not None and hit[0]() is v:
            h = hit[1]()
            if h is not None:
                return h
        h = self._to_host(v)
        try:  # weak references only: a freed host copy or device tensor is not kept alive
            self._host_of[key] = (weakref.ref(v), weakref.ref(h))
        except TypeError:  # a tensor type without weak references: no sharing
            return h
        if len(self._host_of) > self._prune_at:
            self._host_of = {
                k: r for k, r in self._host_of.items() if r[0]() is not None and r[1]() is not None
            }
            self._prune_at = max(1024, 2 * len(self._host_of))
        return h

    def forget_host_copy(self, v: Any) -> None:
        """Stop sharing the host copy of tensor ``v`` (:meth:`_host_copy`): its buffer is about
        to be overwritten (donated to a region that writes its result into it, Torch's
        ``out=``), and a later offload of the same object must copy what it then holds."""
        self._host_of.pop(id(v), None)

    def fetch(self, nid: int, points: Iterable[Point], outputs: Sequence[int] = ()) -> int:
        """Move the outputs of ``nid`` at ``points`` (those in ``outputs``, default all) back
        from the host pool to the device (a no-op for those already on the device).
        ``KeyError(point)`` for a point held nowhere. Returns the bytes moved."""
        if not self._movable(nid):
            return 0
        tabs = self._tables[nid]
        host = self._host.get(nid, {})
        which = tuple(outputs) or tuple(range(len(tabs)))
        moved = n = hb = 0
        for point in points:
            hs = host.get(point)
            if hs is None:
                if not any(point in tab for tab in tabs if type(tab) is dict):
                    raise KeyError(point)
                continue  # already on the device
            for k in which:
                h = hs[k]
                if h is not None:
                    x = self._from_host(h)
                    tabs[k][point] = x
                    hs[k] = None
                    moved += self._nbytes(x)
                    hb += self._host_nbytes(h)
                    n += 1
            if all(h is None for h in hs):
                del host[point]
        if n:
            self._move(nid, moved, hb, n, to_host=False)
        return moved

    def _move(self, nid: int, dev_bytes: int, host_bytes: int, n: int, to_host: bool) -> None:
        """Account a move between the pools as one change (one timeline sample)."""
        timeline, self._timeline = self._timeline, None
        sign = 1 if to_host else -1
        self._account(nid, -sign * dev_bytes, -sign * n)
        self._timeline = timeline
        self._account(nid, sign * host_bytes, sign * n, _HOST)

    def is_offloaded(self, nid: int, point: Point, oid: int | None = None) -> bool:
        """Whether ``nid``'s outputs (output ``oid``) at ``point`` are in the host pool
        (offloaded, not fetched back)."""
        hs = self._host.get(nid, {}).get(point)
        return hs is not None and (oid is None or hs[oid] is not None)

    def host_value(self, nid: int, oid: int, point: Point) -> Any:
        """The host copy of an offloaded output (``KeyError`` when not offloaded)."""
        h = self._host[nid][point][oid]
        if h is None:
            raise KeyError(point)
        return h

    def points(self, nid: int, oid: int = 0) -> Iterable[Point]:
        """The points stored for output ``oid`` of ``nid``."""
        return list(self._tables.get(nid, [{}] * (oid + 1))[oid])

    def stats(self, top: int = DEFAULT_TOP, labels: Mapping[int, str] | None = None) -> MemoryStats:
        """Totals, per pool and the ``top`` nodes by peak bytes (named by ``labels``)."""
        blocks = sum(t.bytes for t in self._blocks if not t.demoted)
        pools = tuple(
            (name, PoolStats(self._pool_live[k], self._pool_peak[k])) for k, name in enumerate(POOLS)
        )
        ranked = sorted(self._nodes.items(), key=lambda kv: (-kv[1][1], kv[0]))[: max(0, top)]
        names = labels or {}
        tensors = tuple(
            TensorStats(nid, names.get(nid, f"%{nid}"), acc[0], acc[1], acc[2])
            for nid, acc in ranked
            if acc[1] > 0
        )
        return MemoryStats(
            self.live_bytes, self.peak_bytes, self.live_points, blocks, pools, tensors, max_rss_bytes()
        )
