"""Suffix sums as one scan: ``r[t:T].discounted_sum(gamma)`` for every ``t`` at once.

Monte-Carlo returns are written per timestep over the rest of the episode:
``g[t] = r[t:T].discounted_sum(gamma)`` (or ``r[t:T].sum(0)``, ``gamma = 1``). Run point by
point, that is ``T`` reads of ``T - t`` rows each (``O(T^2)`` work, ``T`` calls), and under a
dynamic ``T`` :mod:`~timerl.pdg.passes.vectorize_partial` cannot batch it (each point reads
another window). The same values are one suffix sum of ``r[0:T]``:
``y[k] = r[k] + gamma * y[k + 1]``. This pass rewrites such a node ``g`` over ``d`` into a
node ``S`` without ``d`` (``SUFFIX_SUM``, reading ``x[0:D]``, output ``(D, ...)``) and ``g``
into row ``d`` of ``S`` (``INDEX``), which ``vectorize_partial`` then turns into a view of ``S``
whose rows are the batch axis of ``d``.

Pattern: a ``DISCOUNTED_SUM`` (or a ``SUM`` over dim 0 alone, without ``keepdim``) of a float
dtype, with no condition, reading one source ``x`` through one edge with no condition,
selection, batch read or ``to_batch``, whose coordinate along ``d`` (a dim of ``x``) is the
slice ``d:D`` (``D`` the bound of ``d``), whose other coordinates do not use ``d`` and are not
slices (the rows of ``d`` are the per-point dim 0 the sum runs over). ``g`` has no
condition, so at ``d = 0`` it reads ``x[0:D]``: ``S`` reads nothing ``g`` did not.

Under a dynamic ``D`` (``T`` found per episode), ``S``'s input is zero-padded to
``bucket(T)`` rows (op attribute ``padded``; :func:`~timerl.plan.layout.pads_to_bucket`):
zero rows at the end leave rows ``< T`` unchanged, and the view then has the padded batch
axis that vectorized readers expect.

Postcondition: the same values up to float summation order (a doubling scan instead of one
sum per row); ``S``'s spec has ``D`` rows (``bucket(D)`` at run time when padded).
"""

from __future__ import annotations

import logging
from dataclasses import replace

from timerl.pdg.ir import PDG, Edge, Node
from timerl.pdg.ops import Op, OpKind
from timerl.pdg.passes.scan_lift import rows_of_scan
from timerl.symbolic import TRUE, Const, Slice, Sym, free_symbols

log = logging.getLogger(__name__)


def _gamma(n: Node) -> float | None:
    """The discount of a suffix-sum candidate: ``gamma`` of a ``DISCOUNTED_SUM``, 1 for a
    ``SUM`` over dim 0 alone without ``keepdim``, else None."""
    op = n.op
    if op.kind is OpKind.DISCOUNTED_SUM:
        return float(op.attr("gamma"))
    if op.kind is OpKind.SUM and not op.attr("keepdim", False):
        dims = op.attr("dims")
        if (tuple(dims) if isinstance(dims, (tuple, list)) else (dims,)) == (0,):
            return 1.0
    return None


def _suffix_read(pdg: PDG, g: Node) -> tuple[Edge, Sym] | None:
    """The edge and dim ``d`` of a node reading ``x[..., d:D, ...]`` as the module doc says."""
    if g.cond is not TRUE or not g.outputs[0].dtype.is_float:
        return None
    ins = pdg.in_edges(g.id)
    if len(ins) != 1:
        return None
    (e,) = ins
    if e.order_only or e.cond is not TRUE or e.select is not None or e.batch_read or e.to_batch is not None:
        return None
    x = pdg.nodes[e.src]
    found: Sym | None = None
    for s, c in zip(x.domain, e.phi, strict=True):
        if isinstance(c, Slice):
            if found is not None or s not in g.domain or c.start is not s or c.stop is not pdg.bound_of(s):
                return None
            found = s
    if found is None:
        return None
    if any(found in free_symbols(c) for s, c in zip(x.domain, e.phi, strict=True) if s is not found):
        return None
    return e, found


def _rewrite(pdg: PDG, g: Node, e: Edge, d: Sym, gamma: float, sid: int) -> tuple[list[Node], list[Edge]]:
    x = pdg.nodes[e.src]
    bound = pdg.bound_of(d)
    op = Op.make(OpKind.SUFFIX_SUM, gamma=gamma, padded=bound in pdg.dynamic_bounds)
    s_node, row, row_edge = rows_of_scan(pdg, g, d, sid, op, 1, "suffix")
    phi = tuple(Slice(Const(0), bound) if s is d else c for s, c in zip(x.domain, e.phi, strict=True))
    return [s_node, row], [replace(e, sink=sid, phi=phi), row_edge]


def scan_suffix_sums(pdg: PDG) -> PDG:
    """Rewrite every suffix sum ``x[d:D]`` over ``d`` into a row of one ``SUFFIX_SUM`` (module doc)."""
    nodes = dict(pdg.nodes)
    drop: set[int] = set()
    added: list[Edge] = []
    sid = max(pdg.nodes, default=-1) + 1
    for g in pdg:
        gamma = _gamma(g)
        got = _suffix_read(pdg, g) if gamma is not None else None
        if got is None:
            continue
        e, d = got
        new, edges = _rewrite(pdg, g, e, d, gamma, sid)
        for n in new:
            nodes[n.id] = n
        drop.add(g.id)
        added += edges
        log.debug("suffix_scan: %s over %s became row %s of a SUFFIX_SUM", g.label, d, d)
        sid += 1
    if not drop:
        return pdg
    edges = [e for e in pdg.edges if e.sink not in drop] + added
    return pdg.with_(nodes=nodes, edges=tuple(edges))
