"""Vectorization of batch-like dims (TimeRL Alg. 2, the trivial case).

A dim ``b`` with a static bound ``B`` is *vectorizable* when every edge reads it
with the identity (``x[b, ...]``), not at all, or as the whole range ``0:B`` from a
sink without ``b`` (a reduction over the batch: the source's batch dim then *is* the
stacked leading per-point dim, as the first slice of the edge), no condition, slice bound, select
or op attribute mentions it (``as_tensor(b)`` itself excepted, see below), it is not a
dynamic bound's dim, and every UDF varying
over it declared it among its ``batch_dims`` (the function handles all its points at once). Such a dim carries
no dependence between its points, so it is removed from every domain and becomes a
leading concrete ``batch`` dim of size ``B`` on the nodes that had it.

Agent dims (``pdg.agent_dims``) are vectorized last; a constant table indexed by one
(``const(lrs)[s]``, a setting per agent) becomes the batched constant of its rows; a random
op's draws along one stay per agent (``point_dims``: each agent's rows seeded as its own
run's, ``runtime/common.Seeds``).

Precondition: a lowered PDG. Postcondition: no node has ``b`` in its domain; nodes
that had it carry ``batch == (B,)`` (dims vectorized earlier come first); edges lose
their ``b`` component. Sinks over ``b`` are wrapped to call the user's function once
per batch index with ``point["b"]`` set, so sink semantics are unchanged.

The value of the dim itself, ``as_tensor(b)`` (an ``EVAL_SYMBOL`` whose expression is
exactly ``b``; e.g. a per-actor epsilon), does not keep a dim symbolic that some UDF
batches over (an environment's ``b``, which must be vectorized anyway): it becomes the
constant ``arange(B)`` with ``batch == (B,)``, a ``CONST`` with ``batched=True`` whose
value already carries the batch dim. Other dims keep their old rule (so programs that
ran unvectorized still do), and any other expression of ``b`` (``as_tensor(b + i)``)
keeps ``b`` symbolic; write it as RT arithmetic on ``as_tensor(b)`` instead.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from timerl.errors import RTDefinitionError
from timerl.pdg.ir import PDG, Edge, Node
from timerl.pdg.ops import Op, OpKind
from timerl.symbolic import Const, Expr, Slice, Sym, free_symbols


def _mentions(x: Any, b: Sym) -> bool:
    if isinstance(x, (Expr, Slice)):
        return b in free_symbols(x)
    if isinstance(x, tuple):
        return any(_mentions(v, b) for v in x)
    return False


def _full_range(c: Any, bound: Sym) -> bool:
    """``0:B``: a read of the whole batch, which becomes the leading per-point dim."""
    return isinstance(c, Slice) and c.start is Const(0) and c.stop is bound


def _first_slice(e: Edge, c: Any) -> bool:
    return next(x for x in e.phi if isinstance(x, Slice)) is c


def vectorizable_dims(pdg: PDG) -> list[Sym]:
    """Dims that can become concrete batch dims (see module docstring)."""
    out = []
    udf_batched = {d for n in pdg if n.op.kind is OpKind.UDF for d in n.op.attr("batch_dims", ())}
    for s, bnd in pdg.dims:
        if bnd not in pdg.static_bounds:
            continue
        ok = True
        for n in pdg:
            if s.name in udf_batched and _is_dim_value(n, s):
                continue
            if _const_rows(pdg.nodes, pdg.edges, n, s, pdg.agent_dims, pdg.static_bounds[bnd]) is not None:
                continue
            if _mentions(n.cond, s) or any(_mentions(v, s) for _, v in n.op.attrs):
                ok = False
                break
            if n.op.kind is OpKind.SET_SYMBOL and n.op.attr("dim") is s:
                ok = False
                break
            if n.op.kind is OpKind.UDF and s in n.domain and s.name not in n.op.attr("batch_dims", ()):
                ok = False  # the function handles one point of s per call
                break
        if ok:
            for e in pdg.edges:
                src = pdg.nodes[e.src]
                sink = pdg.nodes[e.sink]
                if _mentions(e.cond, s) or (e.select is not None and _mentions(e.select, s)):
                    ok = False
                    break
                for d, c in zip(src.domain, e.phi, strict=True):
                    if d is s:
                        if c is s and s in sink.domain:
                            continue
                        if not (_full_range(c, bnd) and s not in sink.domain and _first_slice(e, c)):
                            ok = False
                    elif _mentions(c, s):
                        ok = False
                if not ok:
                    break
        if ok:
            out.append(s)
    return out


def vectorize(pdg: PDG, dims: list[Sym] | None = None, required: frozenset[Sym] = frozenset()) -> PDG:
    """Turn ``dims`` (default: all vectorizable) into batch dims. ``required`` must be among them."""
    cand = vectorizable_dims(pdg)
    chosen = cand if dims is None else [d for d in dims if d in cand]
    missing = [d for d in required if d not in chosen]
    if missing:
        raise RTDefinitionError(
            f"dim(s) {[d.name for d in missing]} must be vectorized (an environment steps all of its "
            "envs at once) but cannot be: read them only as `x[b, ...]` (no shifts, slices or "
            "conditions on them), or leave vectorization on"
        )
    # agent dims last, so that they are trailing batch dims: a random op's draws along them
    # stay per agent (``point_dims``, seeded per agent by the runtime: runtime/common.Seeds)
    chosen = [d for d in chosen if d not in pdg.agent_dims] + [d for d in chosen if d in pdg.agent_dims]
    nodes = dict(pdg.nodes)
    edges = list(pdg.edges)
    for s in chosen:
        size = pdg.static_bounds[pdg.bound_of(s)]
        new_nodes: dict[int, Node] = {}
        tables: set[int] = set()  # const(table)[s] nodes, now constants: their input edge goes
        for nid, n in nodes.items():
            rows = _const_rows(nodes, edges, n, s, pdg.agent_dims, size)
            if _is_dim_value(n, s):  # as_tensor(b): the values 0..B-1 along the new batch dim
                value = np.arange(size, dtype=n.op.attr("dtype").numpy)
                op = Op.make(OpKind.CONST, value=value, batched=True)  # value holds the batch dim
                n = replace(n, domain=(), batch=(size,), batch_dims=(s,), op=op)
            elif rows is not None:  # a setting per agent: the table's rows along the batch dim
                op = Op.make(OpKind.CONST, value=np.ascontiguousarray(rows[:size]), batched=True)
                n = replace(n, domain=(), num_inputs=0, batch=(size,), batch_dims=(s,), op=op)
                tables.add(nid)
            elif s in n.domain:
                op = n.op
                if op.kind is OpKind.SINK and not getattr(op.attr("fn"), "serves_checkpoints", False):
                    # a checkpoint request names an iteration: one for all agents (one file set)
                    op = Op.make(OpKind.SINK, fn=_per_batch_sink(op.attr("fn"), s.name, len(n.batch)))
                elif op.kind in (OpKind.RAND_UNIFORM, OpKind.RAND_NORMAL) and s in pdg.agent_dims:
                    op = Op.make(op.kind, **{**dict(op.attrs), "point_dims": (*op.attr("point_dims", ()), s)})
                n = replace(
                    n,
                    domain=tuple(d for d in n.domain if d is not s),
                    batch=n.batch + (size,),
                    batch_dims=n.batch_dims + (s,),
                    op=op,
                )
            new_nodes[nid] = n
        new_edges: list[Edge] = []
        for e in edges:
            if e.sink in tables:
                continue
            src = nodes[e.src]
            if s in src.domain:
                phi = tuple(c for d, c in zip(src.domain, e.phi, strict=True) if d is not s)
                e = replace(e, phi=phi)
            new_edges.append(e)
        nodes, edges = new_nodes, new_edges
    return pdg.with_(nodes=nodes, edges=tuple(edges))


def _const_rows(
    nodes: Any, edges: Any, n: Node, s: Sym, agent_dims: tuple[Sym, ...], size: int
) -> np.ndarray | None:
    """For ``const(table)[s]`` with ``s`` an agent dim (a setting per agent: ``lr[s]``) and at
    least ``size`` rows along it, the table's rows along ``s``; else None."""
    if not any(s is a for a in agent_dims) or n.op.kind is not OpKind.INDEX or n.domain != (s,) or n.batch:
        return None
    if n.op.attr("index") is not s:
        return None
    ins = [e for e in edges if e.sink == n.id and not e.order_only]
    if len(ins) != 1:
        return None
    src = nodes[ins[0].src]
    if src.op.kind is not OpKind.CONST or src.domain or src.batch or src.op.attr("batched", False):
        return None
    rows = np.moveaxis(np.asarray(src.op.attr("value")), n.op.attr("dim"), 0)
    return rows if len(rows) >= size else None


def _is_dim_value(n: Node, s: Sym) -> bool:
    """``as_tensor(s)``: the node's value at each point is the dim's own index."""
    return n.op.kind is OpKind.EVAL_SYMBOL and n.op.attr("expr") is s and n.domain == (s,)


def _per_batch_sink(fn: Any, name: str, axis: int) -> Any:
    def sink(value: np.ndarray, point: dict[str, int]) -> None:
        for k in range(value.shape[axis]):
            fn(np.take(value, k, axis=axis), {**point, name: k})

    sink.__name__ = getattr(fn, "__name__", "sink")
    return sink
