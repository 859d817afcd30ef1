"""Fused regions that span statements: reorder a straight-line run of the AST so that pure
ops at one point gather into as few compiled regions as their dependences allow.

The scheduler orders the statements of a loop body (or of the program) for isl's reasons,
not for fusion: PPO's learning phase, at one point ``i``, interleaves ~300 pure ops with
the ``MERGE``s that pick each parameter's and Adam moment's value (``i == 0`` or the
previous iteration's), the ``EVAL_SYMBOL`` of the annealed learning rate, and reads of the
rollout through ``batch[t=0:T]``. Fusing only *consecutive* pure statements cut it into ~40
regions; each one's outputs are written to memory and read back by the next, and a
transpose feeding a matmul in another region is materialised (32 MB per weight gradient
at 512 x 250) instead of being folded into the matmul by XLA.

:func:`plan_regions` takes the children of a ``Seq`` (nested ``Seq``s inlined) and

1. moves each *cheap host statement* (``MERGE``, ``EVAL_SYMBOL``, ``CONST``) up to just
   after the last statement it depends on, so it no longer splits a region;
2. adds each fusable ``Exec`` to the latest region before it that it can join (same
   domain, same point, reads of members only at its own point: :func:`internal_read`),
   moving it past the statements in between when it depends on none of them.

A statement ``b`` *depends on* an earlier ``a`` when an edge from a node ``a`` writes to
``b``'s node may read the point ``a`` writes at this instance of the loop nest
(:func:`may_read`: the read index minus the written point is compared with
``affine_difference``; anything not provably another point counts as the same). Nothing
moves past a ``Loop``, an ``If``, or a free of its own node at a maybe-same point; nothing
that uses a dynamic bound (in its point, its edges or its attributes, or over a dim with a
dynamic bound) moves at all, since its position is also where the bound is known. Moving a
statement earlier past ones it does not depend on keeps every read after its write and
before the point's free (the original order had them so), so values are unchanged; the
differential tests run programs with ``fuse`` on and off.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from timerl.pdg.ir import PDG, Edge, Node, edges_by_sink
from timerl.pdg.ops import OpKind
from timerl.plan.fusable import fusable, internal_read
from timerl.schedule.ast import AstNode, Dealloc, Exec, Fetch, Offload, inline_seqs
from timerl.symbolic import Expr, Slice, Sym, free_symbols, substitute
from timerl.symbolic.expr import same
from timerl.symbolic.simplify import affine_difference

_HOISTED = frozenset({OpKind.MERGE, OpKind.EVAL_SYMBOL, OpKind.CONST})


@dataclass(frozen=True, slots=True)
class FusedExec(Exec):
    """Runtime-only AST node: ``members`` (pure, same domain) at one point, as one region.

    ``donate``: ``(member, input id)`` pairs whose input buffer the region may reuse (it is
    their last reader, see :mod:`timerl.schedule.donate`)."""

    members: tuple[int, ...] = ()
    donate: tuple[tuple[int, int], ...] = ()


def may_read(e: Edge, sink: Node, sink_point: Sequence[Expr], src_point: Sequence[Expr]) -> bool:
    """Whether ``e`` (into ``sink``, run at ``sink_point``) may read the source's value at
    ``src_point`` (both in the loop variables of one straight-line run)."""
    if len(e.phi) != len(src_point):
        return True
    mapping = dict(zip(sink.domain, sink_point, strict=True))
    for comp, ps in zip(e.phi, src_point, strict=True):
        c = substitute(comp, mapping)
        if isinstance(c, Slice):
            hi = affine_difference(ps, c.stop)
            lo = affine_difference(c.start, ps)
            if (hi is not None and hi >= 0) or (lo is not None and lo > 0):
                return False
        else:
            d = affine_difference(c, ps)
            if d is not None and d != 0:
                return False
    return True


class _Planner:
    def __init__(self, pdg: PDG, dynamic: frozenset[Sym]) -> None:
        self.pdg = pdg
        self.dynamic = dynamic
        self._in = edges_by_sink(pdg)
        self._bounds = dict(pdg.dims)
        self._fixed: dict[int, bool] = {}

    def in_edges(self, nid: int) -> list[Edge]:
        return self._in.get(nid, [])

    def fixed(self, stmt: Exec) -> bool:
        """Whether ``stmt`` must stay where the scheduler put it (it uses a dynamic bound)."""
        got = self._fixed.get(stmt.node)
        if got is None:
            got = self._fixed[stmt.node] = self._uses_dynamic(self.pdg.nodes[stmt.node])
        return got or any(free_symbols(c) & self.dynamic for c in stmt.point)

    def _uses_dynamic(self, n: Node) -> bool:
        dyn = self.dynamic
        if not dyn:
            return False
        if any(self._bounds.get(d) in dyn for d in n.domain):
            return True
        for e in self.in_edges(n.id):
            for c in e.phi:
                if free_symbols(c) & dyn:
                    return True
            if free_symbols(e.cond) & dyn or (e.select is not None and free_symbols(e.select) & dyn):
                return True
            if any(free_symbols(c) & dyn for _, c in e.batch_read):
                return True
        return any(_mentions(v, dyn) for _, v in n.op.attrs)

    def depends(self, b: Exec, a: AstNode) -> bool:
        """Whether ``b`` (later) may read a value ``a`` writes, or must stay after ``a``."""
        if isinstance(a, Fetch):  # a reader of the fetched node stays after the fetch
            return a.node == b.node or any(e.src == a.node for e in self.in_edges(b.node))
        if isinstance(a, (Dealloc, Offload)):
            if any(isinstance(c, Slice) for c in a.point):  # a batched free: a range of points
                return a.node == b.node
            return a.node == b.node and _maybe_same(a.point, b.point)
        if not isinstance(a, Exec):
            return True  # a Loop or an If: never moved past
        members = a.members if isinstance(a, FusedExec) else (a.node,)
        src = set(members)
        sink = self.pdg.nodes[b.node]
        return any(e.src in src and may_read(e, sink, b.point, a.point) for e in self.in_edges(b.node))

    def joins(self, region: FusedExec, b: Exec) -> bool:
        first = self.pdg.nodes[region.members[0]]
        node = self.pdg.nodes[b.node]
        if node.domain != first.domain or len(b.point) != len(region.point):
            return False
        if not all(same(x, y) for x, y in zip(b.point, region.point, strict=True)):
            return False
        inside = set(region.members)
        return all(
            internal_read(e, self.pdg) is not None
            for e in self.in_edges(b.node)
            if e.src in inside and not e.order_only
        )


def plan_regions(children: Sequence[AstNode], pdg: PDG, dynamic: frozenset[Sym]) -> list[AstNode]:
    """The statements of a ``Seq`` reordered and grouped into :class:`FusedExec` regions
    (see the module docstring); a region of one member stays a plain ``Exec``."""
    p = _Planner(pdg, dynamic)
    out: list[AstNode] = []
    for c in inline_seqs(children):
        if type(c) is not Exec:
            out.append(c)
            continue
        node = pdg.nodes[c.node]
        movable = not p.fixed(c)
        if node.op.kind in _HOISTED and movable:
            k = len(out)
            while k > 0 and not p.depends(c, out[k - 1]):
                k -= 1
            out.insert(k, c)
            continue
        if not fusable(node):
            out.append(c)
            continue
        target = None
        j = len(out) - 1
        while j >= 0:
            s = out[j]
            if isinstance(s, FusedExec) and p.joins(s, c):
                target = j
                break
            if not movable or p.depends(c, s):
                break
            j -= 1
        if target is None:
            out.append(FusedExec(c.node, c.point, (c.node,)))
        else:
            r = out[target]
            assert isinstance(r, FusedExec)
            out[target] = FusedExec(r.node, r.point, r.members + (c.node,))
    return [Exec(s.node, s.point) if isinstance(s, FusedExec) and len(s.members) == 1 else s for s in out]


def _mentions(v: object, syms: frozenset[Sym]) -> bool:
    if isinstance(v, (Expr, Slice)):
        return bool(free_symbols(v) & syms)
    if isinstance(v, (tuple, list)):
        return any(_mentions(x, syms) for x in v)
    return False


def _maybe_same(a: Sequence[Expr], b: Sequence[Expr]) -> bool:
    if len(a) != len(b):
        return True
    for x, y in zip(a, b, strict=True):
        d = affine_difference(x, y)
        if d is not None and d != 0:
            return False
    return True
