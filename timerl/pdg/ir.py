"""The polyhedral dependence graph (PDG): nodes with domains, edges with dependences.

Glossary (see ``docs/glossary.md``):

* **dim**: a symbolic dimension, a pair (index symbol ``t``, bound symbol ``T``);
  its points are ``0 <= t < T``.
* **domain** of a node: the dims it varies over, in context order, intersected with
  the node's ``cond`` (a boolean expression; ``TRUE`` for the full box).
* **edge** ``sink <- src``: the sink, at point ``q`` of its domain, reads output
  ``oid`` of ``src`` at the source points ``phi(q)`` (one index component per source
  dim: a point expression or a :class:`Slice`) when ``cond(q)`` holds, as its input
  ``iid``. A slice component stacks the points along a new leading per-point dim.
  ``select`` (optional, gradient edges only) picks, for every stacked source point,
  one element of the source's leading per-point dim: ``select`` is an expression in
  the sink's symbols and :data:`SLICE_VAR` (the source coordinate of the slice).
* ``order_only`` edges carry no data: they order effectful ops (env reset after the
  previous episode's steps).
* ``batch``: leading concrete dims that vectorization turned from symbolic dims
  (``(64,)`` after vectorizing ``b`` with ``B = 64``); ``batch_dims`` names them, in
  vectorization order. An entry that is a bound symbol ``T`` (a dim with a dynamic bound,
  vectorized) has the size ``bucket(T)`` at run time (``plan/layout.py``): rows
  ``T ..`` are padding that no reader sees.
* ``batch_read`` (edges): reads along dims the *source* has as batch dims but the edge
  still indexes (a sink that was not vectorized over ``t`` reading a source that was:
  ``x[t + 1]`` takes row ``t + 1`` of the batch axis, ``x[0:T]`` narrows it and makes it the
  first stacked per-point dim). ``to_batch`` (edges): the sink was vectorized over that dim
  and the source was not, so the edge reads the source's whole range (``phi`` holds the
  ``0:D`` slice, as the first slice) and the stacked axis becomes the sink's batch axis.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from timerl.pdg.ops import DType, Op, OpKind
from timerl.symbolic import TRUE, Expr, Slice, Sym

SLICE_VAR = Sym("_slice_q")
"""Placeholder for the source coordinate inside :attr:`Edge.select`."""

ShapeDim = int | Expr


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """Per-point shape (ints or symbolic sizes such as ``T - t``) and dtype."""

    shape: tuple[ShapeDim, ...]
    dtype: DType

    @property
    def ndim(self) -> int:
        return len(self.shape)


@dataclass(frozen=True, slots=True)
class Node:
    """An op evaluated at every point of its domain."""

    id: int
    op: Op
    domain: tuple[Sym, ...]
    outputs: tuple[TensorSpec, ...]
    num_inputs: int
    cond: Expr = TRUE
    batch: tuple[int | Sym, ...] = ()  # a Sym: a dynamic bound T, padded to bucket(T) at run time
    name: str | None = None
    where: str = "?"  # the user's defining line, for error messages
    batch_dims: tuple[Sym, ...] = ()  # the symbolic dims ``batch`` came from, same order

    @property
    def label(self) -> str:
        """How errors name this node: the user's name, else the op and defining line."""
        if self.name:
            return f"'{self.name}'"
        return f"{self.op.kind.name.lower()} defined at {self.where}"

    def __repr__(self) -> str:
        dom = ", ".join(s.name for s in self.domain)
        c = "" if self.cond is TRUE else f" | {self.cond}"
        b = f" batch={self.batch}" if self.batch else ""
        nm = f" '{self.name}'" if self.name else ""
        return f"%{self.id}{nm} = {self.op!r} [{dom}{c}]{b} -> {list(self.outputs)}"


@dataclass(frozen=True, slots=True)
class Edge:
    """``sink`` (input ``iid``) reads ``src`` (output ``oid``) at ``phi(q)`` when ``cond(q)``."""

    sink: int
    src: int
    iid: int
    oid: int
    phi: tuple[Expr | Slice, ...]
    cond: Expr = TRUE
    select: Expr | None = None
    order_only: bool = False
    batch_read: tuple[tuple[Sym, Expr | Slice], ...] = ()  # (source batch dim, index there)
    to_batch: Sym | None = None  # phi's first slice becomes this batch dim of the sink

    @property
    def rows_to_batch(self) -> bool:
        """``to_batch`` with no slice in ``phi``: the source's rows (its per-point dim 0, a
        lifted scan's) become the sink's batch dim."""
        return self.to_batch is not None and not any(isinstance(c, Slice) for c in self.phi)

    def __repr__(self) -> str:
        phi = ", ".join(map(str, self.phi))
        c = "" if self.cond is TRUE else f" if {self.cond}"
        s = "" if self.select is None else f" select {self.select}"
        br = "".join(f" batch[{d}={x}]" for d, x in self.batch_read)
        tb = "" if self.to_batch is None else f" to_batch {self.to_batch}"
        kind = "order" if self.order_only else f"in{self.iid}<-out{self.oid}"
        return f"%{self.sink} <- %{self.src}[{phi}]{c}{s}{br}{tb} ({kind})"


@dataclass(frozen=True)
class PDG:
    """An immutable PDG. ``dims`` lists (index, bound) pairs in context order.

    ``bounds`` maps bound symbols to ints (static) or to the id of the node whose
    boolean output ends the dim (dynamic, via a ``SET_SYMBOL`` node). ``outputs``
    are node ids the program must keep alive at the end (parameters' last values).
    """

    dims: tuple[tuple[Sym, Sym], ...]
    nodes: Mapping[int, Node]
    edges: tuple[Edge, ...]
    static_bounds: Mapping[Sym, int] = field(default_factory=dict)
    dynamic_bounds: frozenset[Sym] = frozenset()
    # dims along which parameters hold independent agents (trl.param(agents=...)): random
    # draws are seeded per agent there (runtime/common.Seeds)
    agent_dims: tuple[Sym, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "nodes", MappingProxyType(dict(self.nodes)))
        object.__setattr__(self, "static_bounds", MappingProxyType(dict(self.static_bounds)))

    # -- queries --------------------------------------------------------------------
    def bound_of(self, sym: Sym) -> Sym:
        for s, b in self.dims:
            if s is sym:
                return b
        raise KeyError(sym)

    @functools.cached_property
    def _edge_index(self) -> tuple[dict[int, list[Edge]], dict[int, list[Edge]], dict[int, list[Edge]]]:
        """``(in-edges, out-edges, data in-edges by iid)`` per node, built once per PDG value
        (the queries below were linear scans of every edge)."""
        ins = edges_by_sink(self)
        data = {k: sorted((e for e in v if not e.order_only), key=lambda e: e.iid) for k, v in ins.items()}
        return ins, edges_by_src(self), data

    def in_edges(self, nid: int) -> list[Edge]:
        return list(self._edge_index[0].get(nid, ()))

    def out_edges(self, nid: int) -> list[Edge]:
        return list(self._edge_index[1].get(nid, ()))

    def data_in_edges(self, nid: int) -> list[Edge]:
        return list(self._edge_index[2].get(nid, ()))

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes[k] for k in sorted(self.nodes))

    def with_(self, **changes: object) -> PDG:
        return replace(self, **changes)  # type: ignore[arg-type]

    def pretty(self) -> str:
        lines = [repr(n) for n in self]
        lines += [repr(e) for e in self.edges]
        return "\n".join(lines)


def edges_by_src(pdg: PDG) -> dict[int, list[Edge]]:
    """Every node's out-edges (its readers), in edge order; nodes without readers absent."""
    out: dict[int, list[Edge]] = {}
    for e in pdg.edges:
        out.setdefault(e.src, []).append(e)
    return out


def edges_by_sink(pdg: PDG) -> dict[int, list[Edge]]:
    """Every node's in-edges, in edge order; nodes without inputs absent."""
    out: dict[int, list[Edge]] = {}
    for e in pdg.edges:
        out.setdefault(e.sink, []).append(e)
    return out


def reads_own_point(e: Edge, src: Node, sink: Node) -> bool:
    """Whether data edge ``e`` reads ``src`` at ``sink``'s own point, whole: same domain and
    batch, identity ``phi``, no condition, ``select`` or batch-dim read."""
    return (
        e.cond is TRUE
        and e.select is None
        and not e.batch_read
        and e.to_batch is None
        and not e.order_only
        and src.domain == sink.domain
        and src.batch == sink.batch
        and src.batch_dims == sink.batch_dims
        and all(c is d for c, d in zip(e.phi, src.domain, strict=True))
    )


def strongly_connected_components(ids: list[int], succ: Mapping[int, list[int]]) -> list[list[int]]:
    """Tarjan's strongly connected components of the graph ``succ`` over ``ids`` (iterative, no
    recursion limit; successors visited in the order given), every node in one component."""
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    on: set[int] = set()
    stack: list[int] = []
    out: list[list[int]] = []
    counter = 0
    for root in ids:
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            v, k = work.pop()
            if k == 0:
                index[v] = low[v] = counter
                counter += 1
                stack.append(v)
                on.add(v)
            nxt = succ.get(v, [])
            if k < len(nxt):
                work.append((v, k + 1))
                w = nxt[k]
                if w not in index:
                    work.append((w, 0))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                out.append(comp)
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[v])
    return out


def kinds(pdg: PDG, kind: OpKind) -> list[Node]:
    """Nodes of one op kind, in id order."""
    return [n for n in pdg if n.op.kind is kind]
