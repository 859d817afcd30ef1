"""Algebraic simplification: copies and multiplications by one removed.

Autodiff and lowering leave plain copies (``IDENTITY``: ``detach``, the materialised
gradient of a view, a gradient passed through unchanged) and products with the constant
``1`` (a seed gradient). A reader of such a node can read its operand directly: its edge
is re-pointed at the operand when the node reads that operand at its own point (same
domain, identity ``phi``, no condition, same batch), so the composed read is the reader's
own ``phi``. The bypassed node is left for DCE.

Kept: nodes with a user's name (``'grad_w'``, what checkpoints, sinks and errors name) and
nodes whose operand has another per-point shape or dtype (``x * 1.0`` broadcasting a
scalar, or an int times a float one).

Postcondition: the same values at every point, fewer nodes after DCE.
"""

from __future__ import annotations

import logging
from dataclasses import replace

import numpy as np

from timerl.pdg.ir import PDG, Edge, Node, edges_by_sink, reads_own_point
from timerl.pdg.ops import OpKind

log = logging.getLogger(__name__)


def _is_one(n: Node) -> bool:
    if n.op.kind is not OpKind.CONST or n.batch:
        return False
    v = np.asarray(n.op.attr("value"))
    return v.size == 1 and v.ndim == 0 and v.item() == 1


def _passthrough(pdg: PDG, n: Node, ins: list[Edge]) -> Edge | None:
    """The in-edge whose value ``n`` equals, if ``n`` is a copy or a product with one."""
    if n.name or len(n.outputs) != 1:
        return None
    data = [e for e in ins if not e.order_only]
    if n.op.kind is OpKind.IDENTITY and len(data) == 1:
        cand = data[0]
    elif n.op.kind is OpKind.MUL and len(data) == 2:
        ones = [e for e in data if _is_one(pdg.nodes[e.src])]
        if len(ones) != 1:
            return None
        cand = next(e for e in data if e is not ones[0])
    else:
        return None
    src = pdg.nodes[cand.src]
    if not reads_own_point(cand, src, n):
        return None
    if src.outputs[cand.oid] != n.outputs[0]:
        return None
    return cand


def simplify(pdg: PDG) -> PDG:
    """Re-point readers of copies and of products with one at the operand (module doc)."""
    ins = edges_by_sink(pdg)
    through: dict[int, Edge] = {}
    for n in pdg:
        cand = _passthrough(pdg, n, ins.get(n.id, []))
        if cand is not None:
            through[n.id] = cand

    def resolve(e: Edge) -> Edge:
        hops = 0
        while e.src in through and e.oid == 0 and not e.order_only:
            inner = through[e.src]
            e = replace(e, src=inner.src, oid=inner.oid)
            hops += 1
            if hops > len(through):  # a cycle of copies: leave it
                break
        return e

    edges = tuple(resolve(e) for e in pdg.edges)
    log.debug("simplify: %d copies and products with one bypassed", len(through))
    return pdg.with_(edges=edges)
