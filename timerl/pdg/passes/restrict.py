"""Restrict the ops of a branch value to the points where the branch can be taken.

``y[T - 1] = 0; y[t] = y[t + 1:T].max(0) + 1`` records ``max`` and ``+ 1`` over all
of ``t``, but the MERGE ``y`` takes the first branch at ``t = T - 1``, so the second
branch's value is never used there, and evaluating it there fails (a max over the
empty slice ``y[T:T]``) or reads a table out of range. :func:`restrict_to_demand` adds
to the condition of each such op the points some reader can use:

* a MERGE reading the op through branch ``k`` by shifts (``q + c`` per dim) uses it
  where no earlier branch covers the point (``not cond_j`` for ``j < k``, under the
  MERGE's own condition), moved into the op's coordinates;
* a pure op reading it at the same point (identity read, same domain, no condition)
  uses it where that reader runs (its own, possibly restricted, condition);
* any other reader (effects, shifted or sliced reads, other domains) uses every point;
* an op nobody reads (dead code, which ``dce`` removes when on) uses no point, so that a
  dead value reading a branch's neighbour (``(x[t + 1] < 0.25)`` never used, beside
  ``x[t] = x[t + 1] * 0.5``) is accepted with ``dce`` off as with it on.

Only the earlier branches' precedence is used, not the branch's cover condition: a
forward recurrence ``x[t + 1] = f(x[t])`` keeps ``f`` over all of ``t`` (``f`` at
``T - 1`` is harmless, and restricting it would split statement clusters). An op is
restricted only when the demand excludes some point of its domain on a sample of
small bound values (a skipped restriction leaves the old behaviour, an extra one only
a redundant condition). Effects, MERGEs, parameters' nodes and RNG ops are never
restricted.

Postcondition: every point any reader reads is still computed, with the same value;
fewer points of pure ops are evaluated.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import replace

from timerl.errors import SymbolicError
from timerl.pdg.ir import PDG, Edge, Node, edges_by_src
from timerl.pdg.ops import OpKind
from timerl.symbolic import (
    FALSE,
    TRUE,
    Const,
    Expr,
    Sym,
    evaluate,
    logical_and,
    logical_not,
    logical_or,
    substitute,
)
from timerl.symbolic.simplify import affine_in

log = logging.getLogger(__name__)

_NEVER = frozenset({OpKind.MERGE, OpKind.RAND_UNIFORM, OpKind.RAND_NORMAL})
_SAMPLE_BOUNDS = (1, 2, 3, 5)
_MAX_SAMPLE_POINTS = 4096


def restrict_to_demand(pdg: PDG, keep: frozenset[int] = frozenset()) -> PDG:
    """Add to each pure op's condition the points its readers can use (module doc)."""
    readers = edges_by_src(pdg)
    merge_inputs: dict[int, list[Edge]] = {}
    for n in pdg:
        if n.op.kind is OpKind.MERGE:
            merge_inputs[n.id] = sorted(
                (e for e in pdg.in_edges(n.id) if not e.order_only), key=lambda e: e.iid
            )
    demand: dict[int, Expr] = {}
    new_cond: dict[int, Expr] = {}

    def cond_of(nid: int) -> Expr:
        return new_cond.get(nid, pdg.nodes[nid].cond)

    def node_demand(nid: int, visiting: set[int]) -> Expr:
        if nid in demand:
            return demand[nid]
        n = pdg.nodes[nid]
        if n.op.effectful or n.op.kind in _NEVER or nid in keep or nid in visiting:
            demand[nid] = TRUE
            return TRUE
        if not readers.get(nid):  # dead: no point is used
            demand[nid] = FALSE
            new_cond[nid] = FALSE
            return FALSE
        visiting.add(nid)
        out: Expr | None = None
        for e in readers[nid]:
            d = _edge_demand(pdg, e, n, merge_inputs, lambda r: _restricted(r, visiting))
            out = d if out is None else logical_or(out, d)
            if out is TRUE:
                break
        visiting.discard(nid)
        d = TRUE if out is None else out
        demand[nid] = d
        if d is not TRUE and _excludes_points(pdg, n, d):
            new_cond[nid] = logical_and(n.cond, d)
        return d

    def _restricted(rid: int, visiting: set[int]) -> Expr:
        node_demand(rid, visiting)
        return cond_of(rid)

    for n in sorted(pdg, key=lambda n: -n.id):  # readers were mostly recorded after their sources
        node_demand(n.id, set())
    if not new_cond:
        return pdg
    log.debug("restricted %d ops to the points their readers use", len(new_cond))
    nodes = {k: replace(v, cond=new_cond[k]) if k in new_cond else v for k, v in pdg.nodes.items()}
    return pdg.with_(nodes=nodes)


def _edge_demand(pdg: PDG, e: Edge, src: Node, merge_inputs: dict[int, list[Edge]], reader_cond) -> Expr:
    """The points of ``src`` that the reader of edge ``e`` can use, in ``src``'s symbols."""
    if e.order_only or e.select is not None:
        return TRUE
    sink = pdg.nodes[e.sink]
    shift = _shift_inverse(e, src, sink)
    if shift is None:
        return TRUE
    if sink.op.kind is OpKind.MERGE:
        prior: Expr = sink.cond
        for other in merge_inputs[sink.id]:
            if other.iid >= e.iid:
                break
            prior = logical_and(prior, logical_not(other.cond))
        return substitute(prior, shift) if prior is not TRUE else TRUE
    if (
        sink.op.effectful
        or e.cond is not TRUE
        or any(c is not d for c, d in zip(e.phi, src.domain, strict=True))
    ):
        return TRUE
    rc = reader_cond(sink.id)
    return substitute(rc, shift) if rc is not TRUE else TRUE


def _shift_inverse(e: Edge, src: Node, sink: Node) -> dict[Sym, Expr] | None:
    """For a read ``src[q + c]`` per dim (same dims as the reader), the map ``q -> p - c``."""
    if set(src.domain) != set(sink.domain) or len(e.phi) != len(src.domain):
        return None
    out: dict[Sym, Expr] = {}
    for d, comp in zip(src.domain, e.phi, strict=True):
        if not isinstance(comp, Expr):
            return None
        aff = affine_in(comp, d)
        if aff is None or aff[0] != 1 or not isinstance(aff[1], Const):
            return None
        k = aff[1].value
        if k:
            out[d] = d - k
    return out


def _excludes_points(pdg: PDG, n: Node, demand: Expr) -> bool:
    """Whether some point of ``n``'s domain is outside ``demand``, on small sample bounds."""
    bounds = sorted({pdg.bound_of(d) for d in n.domain} - set(pdg.static_bounds), key=lambda s: s.name)
    for values in itertools.product(_SAMPLE_BOUNDS, repeat=len(bounds)):
        env: dict[Sym, int] = {b: int(v) for b, v in pdg.static_bounds.items()}
        env.update(zip(bounds, values, strict=True))
        sizes = [env[pdg.bound_of(d)] for d in n.domain]
        total = 1
        for s in sizes:
            total *= s
        if total > _MAX_SAMPLE_POINTS:
            return True  # too many points to look at: restrict (a redundant condition is harmless)
        for point in itertools.product(*(range(s) for s in sizes)):
            env.update(zip(n.domain, point, strict=True))
            try:
                if evaluate(n.cond, env) and not evaluate(demand, env):
                    return True
            except SymbolicError:
                return True
    return False
