"""Broadcast removal: elementwise readers of an ``EXPAND`` read its operand instead.

Branch adapters (a scalar assigned into a ``(2,)`` tensor), ``expand`` calls and the
gradients of reductions materialise broadcasts with ``EXPAND`` nodes. Elementwise ops
broadcast their per-point operands themselves (NumPy rules, right-aligned; batched inputs
are aligned after their batch dims), so an elementwise reader gets the same values from
the unexpanded operand whenever its other operands still give the output its shape. Its
edge is re-pointed at the operand; the ``EXPAND`` is left for DCE (or stays for its other
readers). Inside a fused region XLA elides such a broadcast anyway; unfused (Torch, JAX
outside regions) it is one dispatch and one stored value per point fewer.

Conditions, per reader edge: the ``EXPAND`` is unnamed, unconditioned and reads its
operand at its own point (same domain and batch, identity index); the reader is an
elementwise op (``ELEMENTWISE_OPS``) reading the ``EXPAND`` at its own point; and the
per-point shapes of the reader's inputs, with the operand in place of the ``EXPAND`` and
the reader's edges re-pointed before it in place of theirs, broadcast to the reader's
output shape.

Postcondition: the same values at every point.
"""

from __future__ import annotations

import logging
from dataclasses import replace

import numpy as np

from timerl.pdg.ir import PDG, Edge, Node, edges_by_sink, reads_own_point
from timerl.pdg.ops import ELEMENTWISE_OPS, OpKind
from timerl.symbolic import TRUE

log = logging.getLogger(__name__)


def _operand(pdg: PDG, n: Node, ins: list[Edge]) -> Edge | None:
    """The edge from an ``EXPAND``'s operand, if ``n`` is a removable broadcast."""
    if n.op.kind is not OpKind.EXPAND or n.name or n.cond is not TRUE or len(n.outputs) != 1:
        return None
    data = [e for e in ins if not e.order_only]
    if len(data) != 1 or len(data) != len(ins):
        return None
    e = data[0]
    src = pdg.nodes[e.src]
    if not reads_own_point(e, src, n) or src.outputs[e.oid].dtype != n.outputs[0].dtype:
        return None
    return e


def _shape(pdg: PDG, e: Edge) -> tuple[int, ...]:
    return tuple(pdg.nodes[e.src].outputs[e.oid].shape)


def remove_broadcasts(pdg: PDG) -> PDG:
    """Re-point elementwise readers of ``EXPAND`` nodes at their operands (module doc)."""
    ins = edges_by_sink(pdg)
    operand: dict[int, Edge] = {}
    for n in pdg:
        e = _operand(pdg, n, ins.get(n.id, []))
        if e is not None:
            operand[n.id] = e
    if not operand:
        return pdg
    at: dict[int, list[int]] = {}  # sink -> positions of its data edges in pdg.edges
    for k, e in enumerate(pdg.edges):
        if not e.order_only:
            at.setdefault(e.sink, []).append(k)
    new: dict[int, Edge] = {}  # position in pdg.edges -> replacement
    for k, e in enumerate(pdg.edges):
        inner = operand.get(e.src)
        if inner is None or e.order_only or e.oid != 0:
            continue
        sink = pdg.nodes[e.sink]
        if sink.op.kind not in ELEMENTWISE_OPS or len(sink.outputs) != 1:
            continue
        if not reads_own_point(e, pdg.nodes[e.src], sink):
            continue
        # the reader's inputs as re-pointed so far: of two EXPANDs of (1,) to (3,) read by
        # one ADD only one may go, or the ADD would compute (1,)
        shapes = [_shape(pdg, inner if j == k else new.get(j, pdg.edges[j])) for j in at[sink.id]]
        try:
            out = np.broadcast_shapes(*shapes)
        except ValueError:
            continue
        if tuple(out) != tuple(sink.outputs[0].shape):
            continue
        new[k] = replace(e, src=inner.src, oid=inner.oid)
    log.debug("remove_broadcasts: %d reads of %d EXPAND nodes re-pointed", len(new), len(operand))
    if not new:
        return pdg
    return pdg.with_(edges=tuple(new.get(k, e) for k, e in enumerate(pdg.edges)))
