"""Give nodes over a dynamically bounded dim the dims that its bound depends on.

A dynamic bound ``T`` of dim ``t`` has one value per *enclosing point*: the coordinates
of the dims before ``t`` in the domain of its ``SET_SYMBOL`` node (``(i,)`` when each
iteration's episode ends on its own). A node over ``t`` that lacks some of these dims
(``as_tensor(t)`` has the domain ``(t,)``) has no single ``T``: the scheduler cannot
place its loop after the episode that defines it. :func:`enclose_dynamic_dims` adds the
missing enclosing dims to such nodes when that is only a recomputation: the node is pure
(not a UDF, sink, RNG or ``SET_SYMBOL``) and every node reading it has those dims (or
gets them in the same rewrite). Reads of a widened node take the added dims at the
reader's own coordinates.

Postcondition: the program computes the same values; a node that could not be widened
(an effect, or a reader without the dims) is left unchanged.
"""

from __future__ import annotations

from dataclasses import replace

from timerl.pdg.ir import PDG, Edge
from timerl.pdg.ops import OpKind
from timerl.symbolic import Sym


def enclosing_dims(pdg: PDG) -> dict[Sym, tuple[Sym, tuple[Sym, ...], int]]:
    """Per dynamic bound: (its dim, the dims enclosing it, the SET_SYMBOL node id)."""
    out: dict[Sym, tuple[Sym, tuple[Sym, ...], int]] = {}
    for n in pdg:
        if n.op.kind is not OpKind.SET_SYMBOL:
            continue
        b, d = n.op.attr("bound"), n.op.attr("dim")
        if b in pdg.dynamic_bounds and d in n.domain and b not in out:
            out[b] = (d, tuple(n.domain[: n.domain.index(d)]), n.id)
    return out


def enclose_dynamic_dims(pdg: PDG) -> PDG:
    """Widen pure nodes over a dynamic dim by the dims its bound depends on (module doc)."""
    want: dict[int, set[Sym]] = {}
    for d, enclosing, _ in enclosing_dims(pdg).values():
        for n in pdg:
            missing = set(enclosing) - set(n.domain)
            if d in n.domain and missing and not n.op.effectful and n.op.kind is not OpKind.SET_SYMBOL:
                want.setdefault(n.id, set()).update(missing)
    if not want:
        return pdg
    # drop candidates read by a node that lacks the added dims (and is not widened itself)
    changed = True
    while changed:
        changed = False
        for e in pdg.edges:
            if e.src not in want:
                continue
            have = set(pdg.nodes[e.sink].domain) | want.get(e.sink, set())
            if not want[e.src] <= have:
                del want[e.src]
                changed = True
    if not want:
        return pdg
    order = [s for s, _ in pdg.dims]
    nodes = dict(pdg.nodes)
    for nid, extra in want.items():
        n = pdg.nodes[nid]
        dom = tuple(s for s in order if s in set(n.domain) | extra)
        nodes[nid] = replace(n, domain=dom)
    edges: list[Edge] = []
    for e in pdg.edges:
        if e.src in want:
            old = dict(zip(pdg.nodes[e.src].domain, e.phi, strict=True))
            phi = tuple(old.get(s, s) for s in nodes[e.src].domain)
            e = replace(e, phi=phi)
        edges.append(e)
    return pdg.with_(nodes=nodes, edges=tuple(edges))
