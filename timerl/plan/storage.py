"""Store kinds decided before running: which outputs live in block buffers.

An output is *block-stored* (``runtime/block_store.py``: preallocated buffers of ``rows``
consecutive points along one dim, updated in place) when some data edge reads it with
exactly one :class:`~timerl.symbolic.Slice` component and several sink points read the same
key through it (:func:`rereads`); everything else stays in the point store. The block size
is the largest slice extent along the block dim, within [:data:`MIN_BLOCK`,
:data:`MAX_BLOCK`] (see the runtime module for the whole story)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from timerl.pdg.ir import PDG, Edge
from timerl.symbolic import Expr, Max, Min, Slice, Sym, affine_difference, free_symbols
from timerl.symbolic.simplify import affine_in

MIN_BLOCK = 8
"""Fewest rows of a block (unless the dim's static bound is smaller)."""
DEFAULT_BLOCK = 32
"""Rows of a block when no slice extent along the dim is bounded statically."""
MAX_BLOCK = 1024
"""Most rows of a block (a longer slice spans several blocks)."""


@dataclass(frozen=True, slots=True)
class BlockSpec:
    """How output ``oid`` of node ``nid`` is block-stored."""

    nid: int
    oid: int
    axis: int  # position of the block dim in the node's domain
    dim: Sym  # the block dim
    extent: int | None  # the largest slice extent along ``dim`` (None: unbounded statically)
    rows: int  # the block size: rows per block
    row_axis: int  # where a slice read puts the rows: right after the node's batch dims


def slice_axis(e: Edge) -> int | None:
    """The position of the only :class:`Slice` component of a data edge without ``select``."""
    if e.order_only or e.select is not None:
        return None
    ks = [k for k, c in enumerate(e.phi) if isinstance(c, Slice)]
    return ks[0] if len(ks) == 1 else None


def rereads(e: Edge, pdg: PDG, k: int) -> bool:
    """Whether several points of the sink of ``e`` read the same key (the source coordinates
    other than the slice ``e.phi[k]``): some sink dim is missing from those coordinates.

    ``r[i, t:T]`` read at every ``(i, t)`` does (each reward is read ``t + 1`` times, by
    overlapping slices), and so do windows ``r[i, t:min(t + n, T)]`` and prefixes
    ``x[0:i + 1]``; ``g[i, 0:T]`` read once per ``i`` does not: stacking reads each point
    once, so a block store would only add a copy per write.
    """
    used: frozenset[Sym] = frozenset()
    for j, c in enumerate(e.phi):
        if j != k:
            used |= free_symbols(c)
    missing = [d for d in pdg.nodes[e.sink].domain if d not in used]
    return bool(missing) and not _disjoint_blocks(e.phi[k], missing)  # type: ignore[arg-type]


def _disjoint_blocks(sl: Slice, dims: list[Sym]) -> bool:
    """Whether the slice ``sl`` reads disjoint rows for different values of ``dims`` (the
    blocks ``bs*di : bs*di + bs`` of an incrementalized reduction): a constant extent, no
    larger than the start's step along each of them. Each point is then read once."""
    extent = _gap(sl.stop, sl.start)
    if extent is None or extent <= 0:
        return False
    for d in dims:
        got = affine_in(sl.start, d)
        if got is None or abs(got[0]) < extent:
            return False
    return True


def _gap(stop: Expr, start: Expr) -> int | None:
    """An upper bound of ``stop - start`` when one follows from the expressions alone."""
    if isinstance(stop, Min):
        gs = [g for g in (_gap(a, start) for a in stop.args) if g is not None]
        return min(gs) if gs else None
    if isinstance(start, Max):
        gs = [g for g in (_gap(stop, a) for a in start.args) if g is not None]
        return min(gs) if gs else None
    return affine_difference(stop, start)


def slice_extent(comp: Slice, bound: int | None) -> int | None:
    """The largest number of points ``comp`` reads: a constant gap (``t:min(t + 3, T)``: 3),
    else the dim's static ``bound``, else ``None``."""
    g = _gap(comp.stop, comp.start)
    if g is None:
        return bound
    return max(0, g) if bound is None else max(0, min(g, bound))


def _static_shape(shape: tuple[Any, ...]) -> bool:
    return all(isinstance(s, int) for s in shape)


def plan_block_storage(pdg: PDG) -> dict[tuple[int, int], BlockSpec]:
    """Per ``(node id, output id)`` read by slices: its :class:`BlockSpec` (see the module doc)."""
    votes: dict[tuple[int, int], Counter[int]] = {}
    edges: dict[tuple[int, int], list[Edge]] = {}
    for e in pdg.edges:
        k = slice_axis(e)
        if k is None or not rereads(e, pdg, k):
            continue
        src = pdg.nodes[e.src]
        if e.oid >= len(src.outputs) or not _static_shape(tuple(src.outputs[e.oid].shape)):
            continue
        votes.setdefault((e.src, e.oid), Counter())[k] += 1
        edges.setdefault((e.src, e.oid), []).append(e)
    plan: dict[tuple[int, int], BlockSpec] = {}
    for (nid, oid), c in sorted(votes.items()):
        node = pdg.nodes[nid]
        axis = c.most_common(1)[0][0]
        dim = node.domain[axis]
        b = pdg.bound_of(dim)
        bound = int(pdg.static_bounds[b]) if b in pdg.static_bounds else None
        extents = [slice_extent(e.phi[axis], bound) for e in edges[(nid, oid)] if slice_axis(e) == axis]
        extent = None if any(x is None for x in extents) else max(x for x in extents if x is not None)
        plan[(nid, oid)] = BlockSpec(nid, oid, axis, dim, extent, block_rows(extent, bound), len(node.batch))
    return plan


def block_rows(extent: int | None, bound: int | None) -> int:
    """The block size for the largest slice extent and the dim's static bound (module doc)."""
    rows = DEFAULT_BLOCK if extent is None else min(max(extent, MIN_BLOCK), MAX_BLOCK)
    return max(1, min(rows, bound)) if bound is not None else rows
