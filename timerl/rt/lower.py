"""Lowering: the recorded RT graph plus compile bounds -> an immutable :class:`PDG`.

Steps: resolve bounds (static ints; a boolean RT ends a dim dynamically through a
``SET_SYMBOL`` node), check that every bound the program uses is given, then freeze
nodes and edges. Vectorization of batch-like dims happens in
``timerl/pdg/passes/vectorize.py`` afterwards.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from timerl.errors import BoundError
from timerl.pdg.ir import PDG, Edge, Node
from timerl.pdg.ops import Op, OpKind
from timerl.rt.context import Context
from timerl.rt.tensor import RecurrentTensor
from timerl.symbolic import Slice, Sym, free_symbols


def lower(ctx: Context, bounds: Mapping[Any, Any]) -> PDG:
    """Freeze ``ctx``'s graph into a PDG with the given bounds.

    The ``SET_SYMBOL`` nodes of dynamic bounds belong to this PDG only: they are taken out
    of ``ctx``'s graph again, so that the program can be compiled more than once.
    """
    setters: list[int] = []
    try:
        return _lower(ctx, bounds, setters)
    finally:
        for nid in setters:
            ctx.graph.nodes.pop(nid, None)


def _lower(ctx: Context, bounds: Mapping[Any, Any], setters: list[int]) -> PDG:
    static: dict[Sym, int] = {}
    dynamic: set[Sym] = set()
    by_name = {b.name: b for _, b in ctx.dims}
    for key, val in bounds.items():
        b = by_name.get(key) if isinstance(key, str) else key
        if not isinstance(b, Sym) or not b.is_bound or b not in by_name.values():
            raise BoundError(
                f"compile bounds: {key!r} is not a bound symbol of this context (bounds: {sorted(by_name)})"
            )
        if isinstance(val, RecurrentTensor):
            dim = ctx.dim_of_bound(b)
            if dim not in val.domain:
                raise BoundError(
                    f"dynamic bound {b} = {val!r}: the RT must vary over `{dim}` "
                    f"(its domain is {tuple(s.name for s in val.domain)})"
                )
            node = ctx.graph.add(
                Op.make(OpKind.SET_SYMBOL, bound=b, dim=dim), val.domain, (), [val._input()], cond=val.cond
            )
            node.where = val.node.where
            setters.append(node.id)
            dynamic.add(b)
        else:
            try:
                v = int(val)
            except (TypeError, ValueError):
                raise BoundError(f"bound {b} = {val!r}: give an int or a boolean RT") from None
            if v < 1:
                raise BoundError(f"bound {b} = {v}: bounds must be >= 1")
            static[b] = v
    nodes: dict[int, Node] = {}
    edges: list[Edge] = []
    used: dict[Sym, str] = {}
    for n in ctx.graph.nodes.values():
        for s in n.domain:
            used.setdefault(ctx.bound_of(s), n.label)
        for k, inp in enumerate(n.inputs):
            edges.append(Edge(n.id, inp.src, k, inp.oid, inp.phi, inp.cond, inp.select))
            for c in inp.phi:
                for s in free_symbols(c) if not isinstance(c, Slice) else free_symbols(c):
                    if s.is_bound:
                        used.setdefault(s, n.label)
        for inp in n.order_after:
            edges.append(Edge(n.id, inp.src, -1, inp.oid, inp.phi, inp.cond, None, True))
        nodes[n.id] = Node(n.id, n.op, n.domain, n.outputs, len(n.inputs), n.cond, (), n.name, n.where)
    for n in ctx.graph.nodes.values():
        for d, k in zip(n.agents, n.agent_sizes, strict=False):  # env ops mark agents without sizes
            b = ctx.bound_of(d)
            if static.get(b) != k:
                given = "dynamic" if b in dynamic else static.get(b)
                raise BoundError(
                    f"{n.label} holds {k} agents along `{d}` (the leading dim of its init), but `{b}` = "
                    f"{given}: give `{b.name}: {k}`, or an init with one entry per agent"
                )
    for b, who in used.items():
        if b not in static and b not in dynamic:
            raise BoundError(
                f"bound `{b}` is used by {who} but compile() got no value for it; pass "
                f"`{b.name}: <int>` or `{b.name}: <done RT>` in the bounds"
            )
    agents = tuple(dict.fromkeys(d for n in ctx.graph.nodes.values() for d in n.agents))
    return PDG(ctx.dims, nodes, tuple(edges), static, frozenset(dynamic), agents)
