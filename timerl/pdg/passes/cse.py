"""Common-subexpression elimination (duplicate code, TimeRL §5).

Two pure nodes compute the same values when they have the same op (kind and attributes,
arrays compared by value), domain, condition and batch, and read the same outputs at the
same points (equal edges, after their sources were themselves merged). Lowering and
autodiff make many such duplicates: a constant per use, the same ``1 - d`` or ``x * x``
built by several rules. Every reader of a duplicate reads the node kept (the one with
the smallest id) instead, and DCE removes the duplicate.

Not merged: effectful ops (UDFs, sinks, RNG, ``SET_SYMBOL``: each call is an effect or a
separate draw), ``MERGE`` nodes (branching definitions are cyclic; they are kept as
written), and a pair of nodes that both carry a user's name.

Postcondition: the same values at every point; fewer nodes once DCE has run.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

import numpy as np

from timerl.pdg.ir import PDG, Edge, Node, edges_by_sink
from timerl.pdg.ops import Op, OpKind

log = logging.getLogger(__name__)


def _value_key(v: Any) -> Any:
    if isinstance(v, np.ndarray):
        return ("array", v.shape, v.dtype.str, v.tobytes())
    if isinstance(v, (tuple, list)):
        return tuple(_value_key(x) for x in v)
    if callable(v) and not isinstance(v, type):
        return ("callable", id(v))
    return v


def op_key(op: Op) -> Any:
    """A hashable key equal for ops that compute the same function."""
    return (op.kind, tuple((k, _value_key(v)) for k, v in op.attrs))


def _mergeable(n: Node) -> bool:
    return not n.op.effectful and n.op.kind is not OpKind.MERGE


def _edge_key(e: Edge, rep: dict[int, int]) -> Any:
    return (
        e.iid,
        rep.get(e.src, e.src),
        e.oid,
        e.phi,
        e.cond,
        e.select,
        e.order_only,
        e.batch_read,
        e.to_batch,
    )


def eliminate_common_subexpressions(pdg: PDG) -> PDG:
    """Redirect readers of duplicate pure nodes to one representative (module doc)."""
    ins = edges_by_sink(pdg)
    rep: dict[int, int] = {}
    while True:
        seen: dict[Any, int] = {}
        changed = False
        for n in pdg:
            if not _mergeable(n) or n.id in rep:
                continue
            key = (
                op_key(n.op),
                n.domain,
                n.cond,
                n.batch,
                n.batch_dims,
                len(n.outputs),
                tuple(sorted((_edge_key(e, rep) for e in ins.get(n.id, ())), key=repr)),
            )
            first = seen.setdefault(key, n.id)
            if first == n.id:
                continue
            if n.name and pdg.nodes[first].name:
                continue
            rep[n.id] = first
            changed = True
        if not changed:
            break
    if not rep:
        return pdg
    nodes = dict(pdg.nodes)
    for dup, keep in rep.items():  # a name survives on the node kept
        if pdg.nodes[dup].name and not nodes[keep].name:
            nodes[keep] = replace(nodes[keep], name=pdg.nodes[dup].name)
    edges = tuple(replace(e, src=rep[e.src]) if e.src in rep else e for e in pdg.edges)
    log.debug("cse: %d duplicate nodes", len(rep))
    return pdg.with_(nodes=nodes, edges=edges)
