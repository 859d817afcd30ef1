"""Statement clustering before isl scheduling (the scheduling half of TimeRL §5.4 fusion).

isl's scheduler is super-linear in the number of statements. Nodes with the same
domain and condition that are linked only by identity edges (``y[p]`` reads
``x[p]``) always run at the same point one after the other, so they can be one
statement: :func:`cluster_pdg` groups them (greedily, never creating a cycle between
clusters) and returns a smaller PDG of cluster representatives plus the member order
inside each cluster. :func:`expand_ast` turns ``Exec(cluster)`` back into a sequence
of member ``Exec``s.

Postcondition: the cluster PDG has one node per cluster (the representative, its
first member in topological order) and every edge between different clusters; edges
inside a cluster are all identity edges, which the member order satisfies.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

from timerl.pdg.ir import PDG, Edge
from timerl.schedule import ast as tast
from timerl.symbolic import Const, Slice, free_symbols


def _identity(e: Edge, pdg: PDG) -> bool:
    src, sink = pdg.nodes[e.src], pdg.nodes[e.sink]
    return (
        e.select is None
        and src.domain == sink.domain
        and src.cond is sink.cond
        and len(e.phi) == len(src.domain)
        and all(c is s for c, s in zip(e.phi, src.domain, strict=True))
    )


def _forward_uniform(e: Edge, pdg: PDG) -> bool:
    """Same domains, every component ``s`` or ``s - k`` with ``k >= 0``: reads only earlier points."""
    from timerl.symbolic import Sym, affine_in

    src, sink = pdg.nodes[e.src], pdg.nodes[e.sink]
    if e.select is not None or src.domain != sink.domain or src.cond is not sink.cond:
        return False
    for c, s in zip(e.phi, src.domain, strict=True):
        if isinstance(c, Sym) and c is s:
            continue
        aff = None if isinstance(c, Slice) else affine_in(c, s)
        if aff is None or aff[0] != 1 or not isinstance(aff[1], Const) or aff[1].value > 0:
            return False
        if any(x is not s and x in free_symbols(c) for x in src.domain):
            return False
    return True


def cluster_pdg(pdg: PDG) -> tuple[PDG, dict[int, list[int]]]:
    """Group identity-linked nodes; return (cluster PDG, representative -> members in order)."""
    parent = {nid: nid for nid in pdg.nodes}

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def reaches_indirectly(a: int, b: int) -> bool:
        """Is there a path a -> ... -> b (source to sink) of length >= 2 between clusters?"""
        succ: dict[int, set[int]] = defaultdict(set)
        for e in pdg.edges:
            ra, rb = find(e.src), find(e.sink)
            if ra != rb:
                succ[ra].add(rb)
        stack = [c for c in succ[a] if c != b]
        seen: set[int] = set()
        while stack:
            c = stack.pop()
            if c == b:
                return True
            if c in seen:
                continue
            seen.add(c)
            stack.extend(succ[c])
        return False

    # A node that reads itself at other points (a recurrence) stays alone: merging it
    # could turn two opposite recurrences into one unschedulable cycle.
    recurrent = {e.src for e in pdg.edges if e.src == e.sink and not _forward_uniform(e, pdg)}
    between: dict[tuple[int, int], list[Edge]] = defaultdict(list)
    for e in pdg.edges:
        between[(e.src, e.sink)].append(e)
    for e in pdg.edges:
        if e.src == e.sink or e.order_only or not _identity(e, pdg):
            continue
        if e.src in recurrent or e.sink in recurrent:
            continue
        a, b = find(e.src), find(e.sink)
        if a == b:
            continue
        # every edge between the two clusters must be an identity data edge
        ok = True
        directions: set[tuple[int, int]] = set()
        for x in pdg.nodes:
            if find(x) not in (a, b):
                continue
            for y in pdg.nodes:
                if find(y) not in (a, b) or find(x) == find(y):
                    continue
                fs = between.get((x, y), ())
                if any(_identity(f, pdg) and not f.order_only for f in fs):
                    directions.add((find(x), find(y)))
                if any(not (_identity(f, pdg) or _forward_uniform(f, pdg)) or f.order_only for f in fs):
                    ok = False
                    break
            if not ok:
                break
        if len(directions) > 1:  # a zero-distance cycle: leave it for isl to report
            ok = False
        if not ok or reaches_indirectly(a, b) or reaches_indirectly(b, a):
            continue
        parent[b] = a

    groups: dict[int, list[int]] = defaultdict(list)
    for nid in sorted(pdg.nodes):
        groups[find(nid)].append(nid)
    members: dict[int, list[int]] = {}
    for root, ms in groups.items():
        order = _topo(ms, pdg)
        members[order[0]] = order
    rep = {nid: order[0] for order in members.values() for nid in order}
    edges = []
    for e in pdg.edges:
        a, b = rep[e.src], rep[e.sink]
        if a == b and _identity(e, pdg):
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


def _topo(ms: list[int], pdg: PDG) -> list[int]:
    inside = set(ms)
    preds: dict[int, set[int]] = {m: set() for m in ms}
    for e in pdg.edges:
        if e.src in inside and e.sink in inside and e.src != e.sink and _identity(e, pdg):
            preds[e.sink].add(e.src)
    out: list[int] = []
    done: set[int] = set()
    while len(out) < len(ms):
        progressed = False
        for m in ms:
            if m not in done and preds[m] <= done:
                out.append(m)
                done.add(m)
                progressed = True
        if not progressed:  # a zero-distance cycle; isl reports it on the unclustered PDG
            out.extend(m for m in ms if m not in done)
            break
    return out


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
