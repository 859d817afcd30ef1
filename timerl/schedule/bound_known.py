"""Statements that isl placed by the value of a dynamic bound before the bound is known.

isl sees a dynamic bound ``T`` (of dim ``t``, set per enclosing point ``e`` by its
``SET_SYMBOL`` node ``Z[e, t]``) as one parameter, and may give a statement a position
that is a function of ``T``. The runtime knows ``T`` only once ``Z[e, T - 1]`` ran: before
that, a guard the position needs (``if (T == 1)``, ``if (T <= _c1)``) cannot be evaluated
(``BoundError`` at run time). The bound-order edges of ``scheduler.bound_order_edges`` keep
every statement that *reads* with ``T`` after ``Z[e, T - 1]``; a statement that does not
may still be pulled next to a reader after the episode. An incrementalized matmul over
``(i, di)`` (no ``t``) whose result only a statement after the episode reads came out at
``T + di``: inside the acting loop's last iterations, and before it when ``T == 1``.

:func:`early_bound_statements` finds such statements in a computed schedule: their schedule
(gisted by their domain) involves ``T``, and some of their points run before
``Z[e, T - 1]`` while some run after ``Z[e, 0]``. :func:`after_setter_edges` and
:func:`before_setter_edges` are the order-only edges that keep them after the episode or
before it; the scheduler solves again with the first, else the second.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import islpy as isl

from timerl.pdg.ir import PDG, Edge, Node
from timerl.symbolic import Const, Expr, Slice, Sym
from timerl.symbolic.expr import cmp_eq

BOUND_ORDER_IID = -2
"""``iid`` of the order-only edges that keep statements after a dynamic bound's setter
(validity, not proximity)."""


@dataclass(frozen=True)
class Setter:
    """A dynamic bound ``bound`` of dim ``t``, found per point of ``enclosing`` by statement
    ``stmt`` (the ``SET_SYMBOL`` node, or the cluster statement holding it)."""

    bound: Sym
    t: Sym
    enclosing: tuple[Sym, ...]
    stmt: int


def setter_point(
    pdg: PDG, z: Node, t: Sym, at: Expr | Slice, reader: tuple[Sym, ...] | None = None
) -> tuple[Expr | Slice, ...]:
    """``Z[e, at]`` as an index: ``e`` read at the reader's own coordinates, or along every
    position where the reader (over ``reader``, when given) lacks that enclosing dim (a
    value over ``(di,)`` read in every episode waits for every episode's setter)."""
    out: list[Expr | Slice] = []
    for d in z.domain:
        if d is t:
            out.append(at)
        elif d in z.domain[: z.domain.index(t)] and (reader is None or d in reader):
            out.append(d)
        else:  # a dim after t, or one the reader lacks: every position
            out.append(Slice(Const(0), pdg.bound_of(d)))
    return tuple(out)


def after_setter_edges(pdg: PDG, stmts: Iterable[int], s: Setter) -> tuple[Edge, ...]:
    """``S[p]`` after ``Z[e, T - 1]`` for each statement ``S``: ``T`` is known where it runs."""
    z = pdg.nodes[s.stmt]
    return tuple(
        Edge(
            n,
            s.stmt,
            BOUND_ORDER_IID,
            0,
            setter_point(pdg, z, s.t, s.bound - 1, pdg.nodes[n].domain),
            order_only=True,
        )
        for n in stmts
    )


def before_setter_edges(pdg: PDG, stmts: Iterable[int], s: Setter) -> tuple[Edge, ...]:
    """``Z[e, 0]`` after every point ``S[e, ..]`` of each statement ``S`` (over ``e``, not ``t``):
    it runs before its episode starts."""
    z = pdg.nodes[s.stmt]
    out = []
    for n in stmts:
        dom = pdg.nodes[n].domain
        if s.t in dom:
            continue
        phi = tuple(
            d if d in s.enclosing and d in z.domain else Slice(Const(0), pdg.bound_of(d)) for d in dom
        )
        out.append(Edge(s.stmt, n, BOUND_ORDER_IID, 0, phi, cmp_eq(s.t, Const(0)), None, True))
    return tuple(out)


def early_bound_statements(
    prog: object, sched: isl.Schedule, setters: Iterable[Setter]
) -> dict[Setter, list[int]]:
    """Per dynamic bound, the statements of ``prog`` whose position in ``sched`` depends on it
    while some of their points run before its setter's last point and some after its first
    (see the module doc). ``prog`` is the :class:`~timerl.schedule.isl.IslProgram` ``sched``
    was computed for."""
    from timerl.schedule.isl import stmt_name

    pdg: PDG = prog.pdg
    setters = [
        s for s in setters if s.stmt in pdg.nodes and any(b is s.bound for b in prog.param_syms.values())
    ]
    if not setters:
        return {}
    run = prog.run_context()
    theta = sched.get_map().intersect_domain(sched.get_domain()).intersect_params(run)
    by_name: dict[str, isl.Map] = {}
    theta.foreach_map(lambda m: by_name.__setitem__(m.get_tuple_name(isl.dim_type.in_), m))
    out: dict[Setter, list[int]] = {}
    for s in setters:
        name = next(p for p, b in prog.param_syms.items() if b is s.bound)
        for n in pdg:
            m = by_name.get(stmt_name(n.id))
            if n.id == s.stmt or m is None:
                continue
            pos = m.find_dim_by_name(isl.dim_type.param, name)
            if pos < 0 or not m.gist_domain(prog.node_domain(n.id).intersect_params(run)).involves_dims(
                isl.dim_type.param, pos, 1
            ):
                continue
            (after,) = after_setter_edges(pdg, [n.id], s)
            if _holds(prog, after, theta):
                continue
            before = before_setter_edges(pdg, [n.id], s)
            if before and _holds(prog, before[0], theta):
                continue
            out.setdefault(s, []).append(n.id)
    return out


def _holds(prog: object, edge: Edge, theta: isl.UnionMap) -> bool:
    """Whether every source point of ``edge`` runs before its sink points under ``theta``."""
    deps = prog.dependences(edges=[edge]).intersect_params(prog.run_context())
    ends = isl.UnionSet.from_set(prog.node_domain(edge.src)).union(
        isl.UnionSet.from_set(prog.node_domain(edge.sink))
    )
    sub = theta.intersect_domain(ends)
    return deps.subtract(sub.lex_lt_union_map(sub)).is_empty()
