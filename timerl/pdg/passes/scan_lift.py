"""Scan lifting: first-order linear recurrences become one ``LINEAR_SCAN`` op (TimeRL §5.2 A).

GAE and discounted returns are written as a backward recurrence over ``t``:
``adv[T - 1] = base; adv[t] = x[t] + c[t] * adv[t + 1]``. Run point by point, that is
``T`` dependent steps of a few ops each, and the recurrence keeps ``adv``, ``x`` and
``c`` per point. Lifted, one node ``S`` over the other dims reads ``x[0:T]`` and
``c[0:T]`` and computes all ``T`` values with one scan (``lax.scan`` on JAX, a loop of
in-place row writes on Torch); ``adv`` becomes ``S``'s row ``t``, which
:mod:`~timerl.pdg.passes.vectorize_partial` then turns into a view of ``S`` (the rows axis
is the batch axis of ``t``).

Pattern, for a dim ``d`` with a static bound ``D``: a ``MERGE`` ``y`` over ``d`` with two
branches, one taken only at ``d = D - 1`` (reverse) or ``d = 0`` (forward), reading a
value ``y0`` that does not depend on ``d``, the other taken at every other point, reading
``a`` at ``y``'s own point where ``a = x + c * y[d +/- 1]`` (``ADD`` and ``MUL`` in either
operand order); ``x`` and ``c`` read at ``y``'s point, defined at every point of ``d``, with
``y``'s per-point shape, batch and domain, defined wherever the recurrence uses them
(every point but the base one: the restriction of branch ops to where their branch is
taken qualifies), and depending on no point of ``y`` (``y[t] = t * y[t + 1] + c *
y[t + 1]`` is not lifted: its ``x`` would be read, whole, by the scan it comes from).
Conditions are checked by evaluating them at every ``d`` (they may only use ``d`` and
static bounds). ``S`` reads ``x`` and ``c`` at those ``D - 1`` points.

Postcondition: the same values (the same arithmetic in the same order per point); ``a``
and the multiply are left for DCE when nothing else reads them.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from timerl.pdg.ir import PDG, Edge, Node, TensorSpec
from timerl.pdg.ops import Op, OpKind
from timerl.symbolic import TRUE, And, Const, Expr, Slice, Sym, evaluate, free_symbols
from timerl.symbolic.simplify import affine_in

log = logging.getLogger(__name__)


def _at_point(
    e: Edge, src: Node, node: Node, shift: dict[Sym, int] | None = None, branch: bool = False
) -> bool:
    """``e`` reads ``src`` at ``node``'s own point (``d + k`` for ``shift = {d: k}``); a
    ``branch`` edge of a MERGE may have a condition (checked by the caller)."""
    if (e.cond is not TRUE and not branch) or e.select is not None or e.batch_read or e.to_batch is not None:
        return False
    if src.domain != node.domain or src.batch != node.batch or src.batch_dims != node.batch_dims:
        return False
    for s, c in zip(src.domain, e.phi, strict=True):
        k = (shift or {}).get(s, 0)
        if k == 0:
            if c is not s:
                return False
        elif c is not s + k:
            return False
    return True


def _taken_at(cond: Expr, d: Sym, size: int, static: dict[Sym, int]) -> list[int] | None:
    """The points of ``d`` where ``cond`` holds, or None when it uses other symbols."""
    if not free_symbols(cond) <= {d, *static}:
        return None
    return [k for k in range(size) if bool(evaluate(cond, {**static, d: k}))]


def _lift_one(pdg: PDG, y: Node, d: Sym, size: int) -> tuple[Node, list[Edge], Node, list[Edge]] | None:
    static = {s: int(v) for s, v in pdg.static_bounds.items()}
    ins = pdg.data_in_edges(y.id)
    if len(ins) != 2 or any(e.order_only for e in ins):
        return None
    spec = y.outputs[0]
    if y.cond is not TRUE or not all(isinstance(s, int) for s in spec.shape):
        return None
    taken = [_taken_at(e.cond, d, size, static) for e in ins]
    if any(t is None for t in taken):
        return None
    for reverse, edge in ((True, size - 1), (False, 0)):
        base_k = next((k for k, t in enumerate(taken) if t == [edge]), None)
        if base_k is None:
            continue
        rec = ins[1 - base_k]
        rest = [k for k in range(size) if k != edge]
        # the recurring branch must cover every other point (the first branch wins at `edge`)
        covered = set(taken[1 - base_k] or [])
        if not set(rest) <= covered:
            continue
        base = ins[base_k]
        if any(d in free_symbols(c) for c in base.phi):
            continue
        a = pdg.nodes[rec.src]
        if a.op.kind is not OpKind.ADD or not _at_point(rec, a, y, branch=True):
            continue
        a_ins = pdg.data_in_edges(a.id)
        if len(a_ins) != 2:
            continue
        shift = {d: 1 if reverse else -1}
        found = None
        for j in (0, 1):
            m = pdg.nodes[a_ins[j].src]
            x_edge = a_ins[1 - j]
            if m.op.kind is not OpKind.MUL or not _mul_at(pdg, a_ins[j], m, a, d):
                continue
            m_ins = pdg.data_in_edges(m.id)
            for q in (0, 1):
                ye, ce = m_ins[q], m_ins[1 - q]
                if (
                    ye.src == y.id
                    and _at_point(ye, y, m, shift)
                    and not _reads(pdg, {x_edge.src, ce.src}, y, d)
                ):
                    found = (x_edge, ce)
                    break
            if found:
                break
        if found is None:
            continue
        x_edge, c_edge = found
        xs, cs = pdg.nodes[x_edge.src], pdg.nodes[c_edge.src]
        ok = all(
            _at_point(e, n, pdg.nodes[e.sink])
            and _defined_on(n, d, rest, size, static)
            and n.outputs[e.oid] == spec
            for e, n in ((x_edge, xs), (c_edge, cs))
        )
        if not ok:
            continue
        return _rewrite(pdg, y, d, reverse, x_edge, c_edge, base)
    return None


def _reads(pdg: PDG, nodes: set[int], y: Node, d: Sym) -> bool:
    """Whether any of ``nodes`` may depend on ``y`` within one scan: through a chain of
    edges that keeps every other dim of ``y`` at the reader's own point (or reads a slice,
    or a fixed position, of it). Such an ``x`` or ``c`` (``y[t] = t * y[t + 1] + c *
    y[t + 1]``: ``x = t * y[t + 1]``) is not known before the recurrence runs, so one scan
    reading all of it would read its own rows. A chain through another point of those
    dims (the weights of iteration ``i`` from the advantages of ``i - 1``, in PPO) is not
    followed: that is another scan."""
    others = [s for s in y.domain if s is not d]
    static = {s: int(v) for s, v in pdg.static_bounds.items()}
    start: list[tuple[int, tuple[tuple[Sym, int], ...]]] = [(n, ()) for n in nodes]
    seen = set(start)
    visits: dict[int, int] = {}
    stack = list(start)
    while stack:
        n, fixed = stack.pop()
        if n == y.id:
            return True
        env = {**static, **dict(fixed)}
        for e in pdg.in_edges(n):
            src = pdg.nodes[e.src]
            if _shifted(src, e, others) or _never(e.cond, env):
                continue
            # the read's coordinates known here (PPO's acting reads the weights at (i, 0, 0):
            # the branch that updates them within an iteration, e > 0 or m > 0, is not taken)
            at = tuple(
                (s_, v) for s_, c in zip(src.domain, e.phi, strict=True) if (v := _value(c, env)) is not None
            )
            if visits.get(e.src, 0) >= _MAX_FIXINGS:  # bounded: then followed at every point
                at = ()
            key = (e.src, at)
            if key in seen or (e.src, ()) in seen:  # a visit at every point covers this one
                continue
            seen.add(key)
            visits[e.src] = visits.get(e.src, 0) + 1
            stack.append(key)
    return False


_MAX_FIXINGS = 4
"""Distinct known coordinates :func:`_reads` follows a node at before following it at every point."""


def _value(c: Expr | Slice, env: dict[Sym, int]) -> int | None:
    """The coordinate ``c`` as an int where ``env`` determines it, else None."""
    if isinstance(c, Slice) or not free_symbols(c) <= env.keys():
        return None
    return int(evaluate(c, env))


def _never(cond: Expr, env: dict[Sym, int]) -> bool:
    """Whether ``cond`` is false wherever ``env`` holds: one of its conjuncts uses only
    ``env``'s symbols and is false there."""
    if cond is TRUE:
        return False
    if isinstance(cond, And):
        return any(_never(c, env) for c in cond.args)
    return free_symbols(cond) <= env.keys() and not bool(evaluate(cond, env))


def _shifted(src: Node, e: Edge, dims: list[Sym]) -> bool:
    """Whether ``e`` reads ``src`` at ``s + k`` (``k != 0``) along one of ``dims``."""
    for s, c in zip(src.domain, e.phi, strict=True):
        if any(s is x for x in dims) and not isinstance(c, Slice) and c is not s:
            got = affine_in(c, s)
            if got is not None and got[0] == 1 and isinstance(got[1], Const) and got[1].value != 0:
                return True
    return False


def _defined_on(n: Node, d: Sym, points: list[int], size: int, static: dict[Sym, int]) -> bool:
    """``n`` exists at every one of ``points`` along ``d`` (its condition, if any, holds there;
    a branch op restricted to where its branch is taken, ``t + 1 < T``, qualifies)."""
    if n.cond is TRUE:
        return True
    taken = _taken_at(n.cond, d, size, static)
    return taken is not None and set(points) <= set(taken)


def _mul_at(pdg: PDG, e: Edge, m: Node, a: Node, d: Sym) -> bool:
    """``a`` reads the product ``m`` at its own point, where ``a`` exists (``m`` may carry
    the same domain condition as ``a``)."""
    if e.cond is not TRUE or e.select is not None or e.batch_read or e.to_batch is not None:
        return False
    return (
        m.domain == a.domain
        and m.batch == a.batch
        and all(c is s for s, c in zip(m.domain, e.phi, strict=True))
    )


def _rewrite(
    pdg: PDG, y: Node, d: Sym, reverse: bool, x_edge: Edge, c_edge: Edge, base: Edge
) -> tuple[Node, list[Edge], Node, list[Edge]]:
    bound = pdg.bound_of(d)
    sid = max(pdg.nodes) + 1
    s_node, row, row_edge = rows_of_scan(
        pdg, y, d, sid, Op.make(OpKind.LINEAR_SCAN, reverse=reverse), 3, "scan"
    )
    # x and c are read where the recurrence uses them: every point but the base one
    used = Slice(Const(0), bound - 1) if reverse else Slice(Const(1), bound)

    def over_all(e: Edge) -> Edge:
        src = pdg.nodes[e.src]
        phi = tuple(used if s is d else c for s, c in zip(src.domain, e.phi, strict=True))
        return Edge(sid, e.src, 0, e.oid, phi)

    s_edges = [
        replace(over_all(x_edge), iid=0),
        replace(over_all(c_edge), iid=1),
        Edge(sid, base.src, 2, base.oid, base.phi, TRUE, base.select, False, base.batch_read, base.to_batch),
    ]
    return s_node, s_edges, row, [row_edge]


def rows_of_scan(
    pdg: PDG, y: Node, d: Sym, sid: int, op: Op, num_inputs: int, suffix: str
) -> tuple[Node, Node, Edge]:
    """A scan node ``sid`` (``op``, its inputs left to the caller) over ``y``'s domain without
    ``d``, holding ``y``'s values at every point of ``d`` as its ``D`` rows; ``y`` made its row
    ``d`` (``INDEX``), and the edge of that read: the form
    :mod:`~timerl.pdg.passes.vectorize_partial` turns into a view batched over ``d``."""
    dom = tuple(s for s in y.domain if s is not d)
    spec = y.outputs[0]
    s_node = Node(
        sid,
        op,
        dom,
        (TensorSpec((pdg.bound_of(d), *spec.shape), spec.dtype),),
        num_inputs,
        batch=y.batch,
        batch_dims=y.batch_dims,
        name=f"{y.name}.{suffix}" if y.name else None,
        where=y.where,
    )
    row = replace(y, op=Op.make(OpKind.INDEX, dim=0, index=d), num_inputs=1)
    return s_node, row, Edge(y.id, sid, 0, 0, dom)


def lift_scans(pdg: PDG) -> PDG:
    """Lift every matching recurrence over a statically bounded dim (module doc)."""
    count = 0
    for d, bound in pdg.dims:
        if bound not in pdg.static_bounds:
            continue
        size = int(pdg.static_bounds[bound])
        if size < 2:
            continue
        for y in list(pdg):
            if y.op.kind is not OpKind.MERGE or d not in y.domain:
                continue
            got = _lift_one(pdg, y, d, size)
            if got is None:
                continue
            s_node, s_edges, row, row_edges = got
            nodes = dict(pdg.nodes)
            nodes[s_node.id] = s_node
            nodes[row.id] = row
            edges = [e for e in pdg.edges if e.sink != y.id] + s_edges + row_edges
            pdg = pdg.with_(nodes=nodes, edges=tuple(edges))
            count += 1
            log.debug("scan_lift: %s over %s became a LINEAR_SCAN", y.label, d)
    return pdg
