"""Dead-code elimination.

Keeps every node from which an effectful op (UDF, SINK, SET_SYMBOL, RNG) or a
parameter node is reachable backwards along data edges, plus those roots
themselves; removes the rest and their edges. Effectful ops are never removed.
Postcondition: every remaining node contributes to an effect or a parameter.
"""

from __future__ import annotations

from timerl.pdg.ir import PDG


def eliminate_dead_code(pdg: PDG, keep: frozenset[int] = frozenset()) -> PDG:
    """Remove nodes whose results no effect or kept node needs."""
    live: set[int] = set()
    stack = [n.id for n in pdg if n.op.effectful or n.id in keep]
    ins: dict[int, list[int]] = {}
    for e in pdg.edges:
        ins.setdefault(e.sink, []).append(e.src)
    while stack:
        nid = stack.pop()
        if nid in live:
            continue
        live.add(nid)
        stack.extend(s for s in ins.get(nid, ()) if s not in live)
    nodes = {k: v for k, v in pdg.nodes.items() if k in live}
    edges = tuple(e for e in pdg.edges if e.sink in live and e.src in live)
    return pdg.with_(nodes=nodes, edges=edges)
