"""Statement clustering before isl scheduling (the scheduling half of TimeRL §5.4 fusion).

isl's scheduler is super-linear in the number of statements, so nodes that can run
together at every point of a shared domain become one statement. :func:`cluster_pdg`
merges nodes with the same domain and condition greedily while the merged statement
stays schedulable in a simple sense:

* every edge between members reads points that run no later under one loop direction
  per dim (lexicographically ``<= 0`` distance, see :mod:`timerl.schedule.distance`),
  and the members that may read each other at the same point form a DAG (their order
  inside the statement);
* every path that leaves the cluster and comes back (through other statements) reads
  strictly earlier points, so the statements in between have room to run.

Both checks over-approximate distances with intervals, so they may refuse a legal
merge but never accept one that makes a schedulable program unschedulable. Recurrences
running forwards (``x[t - 1]``) and backwards (``x[t + 1]``) never share a cluster, and
n-step learning (reading ``r[t:t + n]``) stays apart from acting, so isl can still
interleave them.

Postcondition: the cluster PDG has one node per cluster (the representative, its first
member in the member order) carrying every edge that is not an identity edge inside a
cluster; :func:`expand_ast` turns ``Exec(cluster)`` back into member ``Exec``s.
"""

from __future__ import annotations

import heapq
import itertools
from collections import defaultdict
from dataclasses import replace
from typing import Any

from timerl.pdg.ir import PDG, Edge
from timerl.schedule import ast as tast
from timerl.schedule.distance import (
    FULL,
    INF,
    Interval,
    add,
    contains,
    edge_offsets,
    hull,
    lex_nonpositive,
)
from timerl.symbolic import Const, Slice, Sym

Vec = tuple[Interval, ...]
_CLAMP = 2  # offsets beyond +-_CLAMP widen to infinity, so path analysis terminates
_MAX_VECS = 16  # distinct path distances kept per node before taking their hull


def _clamp(iv: Interval) -> Interval:
    lo, hi = iv
    if lo < -_CLAMP:
        lo = -INF
    elif lo > _CLAMP:
        lo = _CLAMP
    if hi > _CLAMP:
        hi = INF
    elif hi < -_CLAMP:
        hi = -_CLAMP
    return (lo, hi)


def _may_be_zero(vec: Vec) -> bool:
    return all(lo <= 0 <= hi for lo, hi in vec)


def _is_identity(e: Edge, pdg: PDG) -> bool:
    src, sink = pdg.nodes[e.src], pdg.nodes[e.sink]
    return (
        e.select is None
        and not e.order_only
        and src.domain == sink.domain
        and src.cond is sink.cond
        and len(e.phi) == len(src.domain)
        and all(c is s for c, s in zip(e.phi, src.domain, strict=True))
    )


class _Clusterer:
    def __init__(self, pdg: PDG) -> None:
        self.pdg = pdg
        self.offs = [edge_offsets(e, pdg) for e in pdg.edges]
        self.out: dict[int, list[int]] = defaultdict(list)
        self.inn: dict[int, list[int]] = defaultdict(list)
        for k, e in enumerate(pdg.edges):
            self.out[e.src].append(k)
            self.inn[e.sink].append(k)
        self.cluster_of = {n: n for n in pdg.nodes}
        self.members: dict[int, list[int]] = {n: [n] for n in pdg.nodes}
        self._aligned_cache: dict[tuple[Sym, ...], list[tuple[_Step, ...]]] = {}
        self._never_forward_cache: dict[Sym, bool] = {}

    def _aligned(self, dims: tuple[Sym, ...]) -> list[tuple[_Step, ...]]:
        """Per edge, how it moves a path's distance along each of ``dims`` (see :func:`_step`)."""
        got = self._aligned_cache.get(dims)
        if got is None:
            got = self._aligned_cache[dims] = [
                tuple(_step(e, self.pdg, off, d) for d in dims)
                for e, off in zip(self.pdg.edges, self.offs, strict=True)
            ]
        return got

    def _vec(self, k: int, dims: tuple[Sym, ...], start: Vec | None = None) -> Vec:
        """A path's distance vector after edge ``k`` (``start``: before it; None: a lone edge).

        Along a dim the current node has, the distance is ``start_d - current_d``; along a
        dim it lacks, it is ``start_d - 0`` (the path left the dim reading a known position,
        and every point it re-enters is at position >= 0).
        """
        steps = self._aligned(dims)[k]
        if start is None:
            return tuple(_clamp(st[1]) if st[0] == "tied" else FULL for st in steps)
        return tuple(_clamp(_move(st, v)) for st, v in zip(steps, start, strict=True))

    def _paths_ok(self, inside: set[int], dims: tuple[Sym, ...], signs_ok: list[tuple[int, ...]]) -> bool:
        """Whether, for one of the loop directions ``signs_ok``, every path from ``inside``
        back to ``inside`` through other statements reads strictly earlier points.

        Stops at the first path that no direction allows (most refused merges end early).

        A path reaching one member of another cluster reaches all of it at the same point
        (a cluster runs as one statement), so paths are followed between clusters. With
        ``outer_forward`` (the first dim runs upwards) a path that already went strictly
        back along the first dim, which no edge of the program ever reads forwards, stays
        safe whatever follows and is not followed further.
        """
        outer_forward = bool(dims) and all(sg[0] == 1 for sg in signs_ok)
        viable = list(signs_ok)
        prune = outer_forward and self._never_forward(dims[0])
        zero = tuple((0, 0) for _ in dims)
        states: dict[int, list[Vec]] = defaultdict(list)
        work: list[tuple[int, Vec]] = []
        for m in inside:
            for k in self.out[m]:
                sink = self.pdg.edges[k].sink
                if sink not in inside:
                    work.append((self.cluster_of[sink], self._vec(k, dims, zero)))
        while work:
            cl, vec = work.pop()
            if not _insert(states[cl], vec):
                continue
            if len(states[cl]) > _MAX_VECS:
                h = states[cl][0]
                for v in states[cl][1:]:
                    h = tuple(hull(a, b) for a, b in zip(h, v, strict=True))
                states[cl][:] = [h]
                vec = h
            if prune and vec[0][1] < 0:
                continue
            for node in self.members[cl]:
                for k in self.out[node]:
                    sink = self.pdg.edges[k].sink
                    nv = self._vec(k, dims, vec)
                    if sink in inside:
                        viable = [sg for sg in viable if lex_nonpositive(nv, sg, strict=True)]
                        if not viable:
                            return False
                    elif self.cluster_of[sink] != cl or sink == node or nv != vec:
                        work.append((self.cluster_of[sink], nv))
        return True

    def _never_forward(self, d: Sym) -> bool:
        """Whether no edge reads a later point along ``d`` (every offset's upper end <= 0)."""
        got = self._never_forward_cache.get(d)
        if got is None:
            got = self._never_forward_cache[d] = all(off[d][1] <= 0 for off in self.offs if d in off)
        return got

    def try_merge(self, a: int, b: int) -> bool:
        pdg = self.pdg
        ra, rb = self.cluster_of[a], self.cluster_of[b]
        if ra == rb:
            return False
        na, nb = pdg.nodes[ra], pdg.nodes[rb]
        if na.domain != nb.domain or na.cond is not nb.cond:
            return False
        dims = na.domain
        inside = set(self.members[ra]) | set(self.members[rb])
        intra: list[tuple[int, Vec]] = []
        for m in inside:
            for k in self.out[m]:
                if pdg.edges[k].sink in inside:
                    intra.append((k, self._vec(k, dims)))
        signs_ok = [
            signs
            for signs in itertools.product((1, -1), repeat=len(dims))
            if all(lex_nonpositive(v, signs, strict=pdg.edges[k].src == pdg.edges[k].sink) for k, v in intra)
        ]
        if not signs_ok:
            return False
        order = _member_order(inside, [(pdg.edges[k], v) for k, v in intra])
        if order is None:
            return False
        if not self._paths_ok(inside, dims, signs_ok):
            return False
        for m in inside:
            self.cluster_of[m] = ra
        self.members[ra] = order
        del self.members[rb]
        return True


# How an edge moves a path's distance along one dim: ("tied", offset) when both ends have
# the dim; ("drop", position) when only the source has it (the sink reads it at that
# absolute position); ("bcast",) when only the sink has it; ("none",) when neither has it.
_Step = tuple


def _step(e: Edge, pdg: PDG, off: dict[Sym, Interval], d: Sym) -> _Step:
    if d in off:
        return ("tied", off[d])
    src, sink = pdg.nodes[e.src], pdg.nodes[e.sink]
    if d in src.domain:
        comp = e.phi[src.domain.index(d)]
        return ("drop", _position(comp))
    if d in sink.domain:
        return ("bcast",)
    return ("none",)


def _position(comp: Any) -> Interval:
    """Absolute range of an index component that mentions no dim of the reader (>= 0)."""
    if isinstance(comp, Slice):
        lo, hi = _position(comp.start), _position(comp.stop)
        return (lo[0], hi[1] - 1)
    if isinstance(comp, Const):
        return (comp.value, comp.value)
    return (0, INF)


def _move(step: _Step, v: Interval) -> Interval:
    kind = step[0]
    if kind in ("tied", "drop"):  # drop: start_d - 0 = (start_d - cur_d) + position
        return add(v, step[1])
    if kind == "bcast":  # start_d - r for a re-entered position r >= 0
        return (-INF, v[1])
    return v


def _insert(vecs: list[Vec], v: Vec) -> bool:
    """Add ``v`` to a list of boxes unless one contains it; drop boxes it contains."""
    for w in vecs:
        if all(contains(x, y) for x, y in zip(w, v, strict=True)):
            return False
    vecs[:] = [w for w in vecs if not all(contains(y, x) for x, y in zip(w, v, strict=True))]
    vecs.append(v)
    return True


def _member_order(inside: set[int], intra: list[tuple[Edge, Vec]]) -> list[int] | None:
    """Members in an order that respects every edge that may read the same point; None on a cycle."""
    succs: dict[int, set[int]] = {m: set() for m in inside}
    for e, v in intra:
        if e.src != e.sink and _may_be_zero(v):
            succs[e.src].add(e.sink)
    indeg = dict.fromkeys(inside, 0)
    for m in inside:
        for x in succs[m]:
            indeg[x] += 1
    ready = [m for m in inside if indeg[m] == 0]
    heapq.heapify(ready)  # smallest id first: a deterministic order
    out: list[int] = []
    while ready:
        m = heapq.heappop(ready)
        out.append(m)
        for x in succs[m]:
            indeg[x] -= 1
            if indeg[x] == 0:
                heapq.heappush(ready, x)
    return out if len(out) == len(inside) else None


def cluster_pdg(pdg: PDG) -> tuple[PDG, dict[int, list[int]]]:
    """Merge nodes into statements; return (cluster PDG, representative -> members in order)."""
    c = _Clusterer(pdg)
    # First along data edges (producer-consumer fusion), then siblings of one domain.
    for e in pdg.edges:
        if e.src != e.sink and not e.order_only:
            c.try_merge(e.src, e.sink)
    groups: dict[tuple, list[int]] = defaultdict(list)
    for r in sorted(c.members):
        n = pdg.nodes[r]
        groups[(n.domain, n.cond)].append(r)
    for reps in groups.values():
        for x, y in itertools.combinations(reps, 2):
            c.try_merge(x, y)
    members = {order[0]: order for order in c.members.values()}
    rep = {nid: order[0] for order in members.values() for nid in order}
    edges = []
    for e in pdg.edges:
        a, b = rep[e.src], rep[e.sink]
        if a == b and _is_identity(e, pdg):
            continue
        edges.append(replace(e, src=a, sink=b))
    nodes = {r: pdg.nodes[r] for r in members}
    return pdg.with_(nodes=nodes, edges=tuple(edges)), members


def split_prologue(pdg: PDG) -> tuple[PDG, list[int]]:
    """Nodes with an empty domain and no inputs (constants) run once, before everything."""
    pro = [
        n.id
        for n in pdg
        if not n.domain and n.num_inputs == 0 and not n.op.effectful and not pdg.in_edges(n.id)
    ]
    if not pro:
        return pdg, []
    drop = set(pro)
    nodes = {k: v for k, v in pdg.nodes.items() if k not in drop}
    edges = tuple(e for e in pdg.edges if e.src not in drop and e.sink not in drop)
    return pdg.with_(nodes=nodes, edges=edges), pro


def expand_ast(node: tast.AstNode, members: dict[int, list[int]]) -> tast.AstNode:
    """Replace each cluster ``Exec`` by its members' ``Exec``s, in order."""
    if isinstance(node, tast.Exec):
        ms = members.get(node.node, [node.node])
        if len(ms) == 1:
            return node
        return tast.Seq(tuple(tast.Exec(m, node.point) for m in ms))
    if isinstance(node, tast.Seq):
        return tast.Seq(tuple(expand_ast(c, members) for c in node.children))
    if isinstance(node, tast.Loop):
        return replace(node, body=expand_ast(node.body, members))
    if isinstance(node, tast.If):
        return replace(
            node,
            then=expand_ast(node.then, members),
            else_=None if node.else_ is None else expand_ast(node.else_, members),
        )
    return node
