"""Partial vectorization of a static dim (TimeRL Alg. 2 with the trivial-cycle rule).

:mod:`~timerl.pdg.passes.vectorize` removes a dim from *every* node, which only works
for dims that carry no dependence (the env batch ``b``). A time dim ``t`` carries the
acting recurrence (``o[t + 1] = step(policy(o[t]))``) but most of a program does not
depend on other timesteps of the same iteration: the loss, its gradient, log-probs and
values of stored observations. This pass vectorizes ``t`` on exactly those nodes, so
learning runs as a few ops over all ``T`` steps instead of ``T`` times a few ops.

**Which nodes.** Dependences carried by an enclosing dim (an edge reading ``i - c``,
``c >= 1``, on a dim before ``d`` in context order, on no cycle of distance 0 along it:
:func:`_carried_edges`) do not constrain ``d`` within one iteration; the other edges form
the *intra-iteration* graph. A node over ``d`` is
vectorized when

* it is not in a strongly connected component of that graph with an edge whose ``d``
  index is neither ``d`` nor a constant (``t - 1``, ``t + 1:T``): a *non-trivial* cycle;
  nodes of a component with only trivial indices are vectorized all together or not at all;
* it is pure (no UDF, sink or ``SET_SYMBOL``: their calls are per point; an RNG draw is
  vectorized with its rows still seeded per point, op attribute ``point_dims``), has no
  condition, op attribute or ``MERGE`` condition mentioning ``d`` (``EVAL_SYMBOL`` of an
  expression of ``d`` and static bounds becomes a constant with the values along ``d``);
* it reads every source over ``d`` at ``d`` itself or at a constant point (``x[T - 1]``),
  with no edge condition or ``select`` mentioning ``d``, and it is not in an order edge.

**Edges** (the rules of Alg. 2). Both ends vectorized: the ``d`` index is dropped (a
constant index becomes a ``batch_read``). Source vectorized, sink not: the index becomes
a ``batch_read`` (a row, or a slice that becomes the first stacked per-point dim).
(Both vectorized and ``d`` read at a slice: the slice is the first stacked dim, so it must
come first among ``phi``'s slices, as for a sink per point.) Sink vectorized, source not:
the edge reads ``0:D`` and the stacked axis becomes the
sink's batch axis (``to_batch``). Source without ``d``: the runtime broadcasts it.
(:mod:`~timerl.plan.layout` carries these out.)

**Dynamic bounds** (``T`` found per episode by a ``SET_SYMBOL`` node). A vectorized node
runs once per enclosing point, after ``T`` is known, with its batch axis padded to a
*bucket*: the batch entry is the bound symbol ``T`` itself, which the runtime reads as
``bucket(T)``, the smallest power of two ``>= T`` (:func:`timerl.pdg.sizes.bucket`),
so compiled code is reused across episode lengths (one compilation per bucket). Per-point
sources read whole (``to_batch``) are stacked over ``0:T`` and zero-padded; readers of a
vectorized node take rows ``< T`` or read the slice ``0:T`` (``batch_read``): narrowed to
``T`` rows, or, for a sum over it and a contraction's row reshapes, with the rows ``>= T``
zeroed (``plan/layout.py``). Padded rows never reach a value that is read: every op is
elementwise along batch axes. Nodes that need the concrete
length stay per point under a dynamic bound: ``EVAL_SYMBOL`` of an expression of ``t``,
RNG draws (seeded per row), rows of a lifted scan, and nodes lacking a dim that encloses
``t`` in the bound's ``SET_SYMBOL`` node (they have no single ``T``). Only nodes that wait for
the episode's end anyway are vectorized (they read at an index that needs ``T``'s value,
``t:T``, ``T - 1``, or depend on such a node in the same episode), and, unless an n-step
window ``r[t:min(t + n, T)]`` streams learning behind acting, the nodes whose every reader
waits. With such a window the nodes that need no ``T`` run per point while the episode goes
on and free their inputs (TimeRL §8.4: O(n) live values). Nothing the done signal depends
on waits; the two operands of a contraction are vectorized together or not at all.

Postcondition: vectorized nodes lose ``d`` from their domain and gain a last batch dim
of size ``D`` (``batch_dims`` names it; ``D`` is the bound symbol when it is dynamic);
values are unchanged up to float order inside batched kernels. A dim already vectorized
is left alone, and a dynamic one too when ``dynamic=False``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import replace

import numpy as np

from timerl.pdg.ir import PDG, Edge, Node, TensorSpec, strongly_connected_components
from timerl.pdg.ops import Op, OpKind
from timerl.symbolic import TRUE, Add, Const, Expr, Max, Min, Slice, Sym, evaluate, free_symbols

log = logging.getLogger(__name__)

_PER_POINT = frozenset({OpKind.UDF, OpKind.SINK, OpKind.SET_SYMBOL})
_RAND = frozenset({OpKind.RAND_UNIFORM, OpKind.RAND_NORMAL})


def _syms(x: Expr | Slice | None) -> frozenset[Sym]:
    return frozenset() if x is None else free_symbols(x)


def _shape_syms(spec: TensorSpec) -> frozenset[Sym]:
    out: frozenset[Sym] = frozenset()
    for x in spec.shape:
        if isinstance(x, Expr):
            out |= free_symbols(x)
    return out


def _constant(c: Expr | Slice) -> bool:
    """An index with no index symbol (``5``, ``T - 1``, ``0:T``)."""
    return all(s.is_bound for s in free_symbols(c))


def _comp(e: Edge, src: Node, d: Sym) -> Expr | Slice | None:
    return e.phi[src.domain.index(d)] if d in src.domain else None


def _outer_distance(e: Edge, src: Node, outer: list[Sym]) -> tuple[tuple[int, ...], bool]:
    """How many points back ``e`` reads along each enclosing dim (``i - c``: ``c``; ``i + c``:
    ``-c``; ``i``: 0), and whether that is known: a read of an enclosing dim by anything else
    (a constant, a slice) stops there, and the edge counts as within the iteration."""
    dist = [0] * len(outer)
    for k, o in enumerate(outer):
        if o not in src.domain:
            continue
        c = src.domain.index(o)
        comp = e.phi[c]
        if comp is o:
            continue
        if isinstance(comp, Add):
            a, b = comp.args
            if b is o:
                a, b = b, a
            if a is o and isinstance(b, Const) and not isinstance(b.value, bool) and isinstance(b.value, int):
                dist[k] = -b.value
                return tuple(dist), True
        return tuple(dist), False
    return tuple(dist), True


MAX_POTENTIAL_PASSES = 64
"""Bellman-Ford passes :func:`_carried_edges` makes at most (as many as the longest chain of
shifted definitions; past it, the raw distances decide), so its time stays linear."""


def _carried_edges(pdg: PDG, outer: list[Sym]) -> set[int]:
    """The positions in ``pdg.edges`` of the edges carried by the enclosing dims ``outer``:
    those that read an earlier point of them (``i - c``) on every cycle through them.

    A cycle's distance is the sum of its edges' (:func:`_outer_distance`): a value whose
    domain is shifted from its reader's (the body of ``x[i + 1, t + 1] = f(x[i + 1, t])``,
    over ``(i, t)``, reads ``x`` at ``i + 1`` and ``x`` reads it back at ``i - 1``) has
    edges of distance 1 and -1 on one cycle of distance 0, whose points are all in one
    iteration of ``i``. So each edge's distance is measured after shifting every node by
    a potential (Bellman-Ford from all nodes at once: every cycle's distance is unchanged
    and every edge's becomes ``>= 0``, lexicographically): the edges still ``>= 1`` are on
    cycles of positive distance only. When some cycle has a negative distance (no legal
    order: the scheduler reports it) or no potential is found within
    :data:`MAX_POTENTIAL_PASSES`, the raw distances decide."""
    if not outer:
        return set()
    zero = (0,) * len(outer)
    arcs: list[tuple[int, int, int, tuple[int, ...]]] = []  # (edge position, sink, src, distance)
    carried_raw: set[int] = set()
    for k, e in enumerate(pdg.edges):
        dist, known = _outer_distance(e, pdg.nodes[e.src], outer)
        arcs.append((k, e.sink, e.src, dist))
        if known and dist > zero:
            carried_raw.add(k)
    pot: dict[int, tuple[int, ...]] = dict.fromkeys(pdg.nodes, zero)

    def plus(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(x + y for x, y in zip(a, b, strict=True))

    for _ in range(min(len(pdg.nodes), MAX_POTENTIAL_PASSES) + 1):  # pot[src] <= pot[sink] + distance
        changed = False
        for _, sink, src, dist in arcs:
            via = plus(pot[sink], dist)
            if via < pot[src]:
                pot[src] = via
                changed = True
        if not changed:
            break
    else:
        log.debug("carried edges: a cycle of negative distance along %s; raw distances used", outer)
        return carried_raw
    return {
        k
        for k, sink, src, dist in arcs
        if k in carried_raw and plus(plus(dist, pot[sink]), tuple(-x for x in pot[src])) > zero
    }


def _trivial(e: Edge, src: Node, d: Sym) -> bool:
    """Whether ``e`` indexes ``d`` only by ``d`` itself or by constants (paper's rule)."""
    if d in _syms(e.cond) or d in _syms(e.select):
        return False
    for s, c in zip(src.domain, e.phi, strict=True):
        if s is d:
            if c is not d and not _constant(c):
                return False
        elif d in free_symbols(c):
            return False
    return True


def vectorizable_nodes(pdg: PDG, d: Sym, stream: int | None = None) -> set[int]:
    """The nodes over ``d`` that may be vectorized over it (module doc; ``stream``: see
    :func:`vectorize_partial`)."""
    order = [s for s, _ in pdg.dims]
    outer = order[: order.index(d)]
    static = {b for b in pdg.static_bounds}
    bound = pdg.bound_of(d)
    enclosing: frozenset[Sym] = frozenset()
    if bound not in pdg.static_bounds:
        from timerl.pdg.passes.enclose import enclosing_dims

        enclosing = frozenset(enclosing_dims(pdg).get(bound, (d, (), -1))[1])
    over = {n.id for n in pdg if d in n.domain}
    succ: dict[int, list[int]] = {}
    intra: list[Edge] = []
    carried = _carried_edges(pdg, outer)
    for k, e in enumerate(pdg.edges):
        if k not in carried:
            succ.setdefault(e.src, []).append(e.sink)
            intra.append(e)
    comp_of: dict[int, int] = {}
    comps = strongly_connected_components(sorted(pdg.nodes), succ)
    for k, comp in enumerate(comps):
        for v in comp:
            comp_of[v] = k
    bad_comp: set[int] = set()
    cyclic: set[int] = set()
    for e in intra:
        k = comp_of[e.src]
        if k != comp_of[e.sink]:
            continue
        cyclic.add(k)
        if not _trivial(e, pdg.nodes[e.src], d):
            bad_comp.add(k)
    ok = {nid for nid in over if comp_of[nid] not in bad_comp}
    if bound not in pdg.static_bounds:
        # vectorized, a node runs once the episode has ended: only nodes that wait for the
        # end anyway (their values need T) are vectorized; the others run per point as soon
        # as their inputs exist and free them (an n-step window keeps O(n) values live)
        waits = _waits_for_end(pdg, bound, enclosing)
        # ... and, unless the episode is read through a window that streams learning
        # behind acting (``r[t:min(t + n, T)]``: TimeRL's n-step schedule, O(n) live
        # values), the nodes whose every reader waits: nothing needs them earlier
        if not _streams(pdg, d, bound):
            readers: dict[int, list[int]] = {}
            for e in pdg.edges:
                if not e.order_only:
                    readers.setdefault(e.src, []).append(e.sink)
            grew = True
            while grew:
                grew = False
                for nid in over - waits:
                    rs = readers.get(nid, [])
                    if rs and all(r in waits for r in rs):
                        waits.add(nid)
                        grew = True
        for nid in ok - waits:
            log.debug(
                "vectorize %s: %s stays per point (it can run before %s is known)",
                d,
                pdg.nodes[nid].label,
                bound,
            )
        ok &= waits
        # nothing the done signal depends on can wait for the end
        before = _ancestors(succ, [n.id for n in pdg if n.op.kind is OpKind.SET_SYMBOL])
        for nid in ok & before:
            log.debug(
                "vectorize %s: %s stays per point (the dynamic bound %s depends on it)",
                d,
                pdg.nodes[nid].label,
                bound,
            )
        ok -= before
    for nid in list(ok):
        n = pdg.nodes[nid]
        why = _local_reason(pdg, n, d, static)
        if not why and bound not in pdg.static_bounds:
            why = _dynamic_reason(pdg, n, d, enclosing)
        if why:
            log.debug("vectorize %s: %s stays per point (%s)", d, n.label, why)
            ok.discard(nid)
    if stream is not None and bound in pdg.static_bounds:
        ok = _streamed(pdg, d, ok, int(pdg.static_bounds[bound]), stream)
    pairs = _contraction_pairs(pdg) if bound not in pdg.static_bounds else []
    changed = True
    while changed:
        changed = False
        # a node reading, at d, a source that stays over d must read it at d itself or a
        # constant and with no other slice (the stacked axis becomes the batch axis)
        for e in pdg.edges:
            if e.sink not in ok or e.order_only:
                continue
            src = pdg.nodes[e.src]
            c = _comp(e, src, d)
            if c is None or e.src in ok or _constant(c):
                continue
            others = [
                x for s, x in zip(src.domain, e.phi, strict=True) if s is not d and isinstance(x, Slice)
            ]
            if c is not d or others or e.select is not None:
                ok.discard(e.sink)
                changed = True
        # a source read along d other than at d (a batch_read: a sink that stays per point,
        # or a vectorized one reading all rows, ``x[0:I, 0:T]``): the slice of d becomes the
        # first stacked dim, so it must come first in phi; a per-point sink's select reads at d
        for e in pdg.edges:
            if e.src not in ok or e.order_only:
                continue
            src = pdg.nodes[e.src]
            c = _comp(e, src, d)
            if c is None:
                continue
            first = next((x for x in e.phi if isinstance(x, Slice)), None)
            per_point = e.sink not in ok
            if (isinstance(c, Slice) and first is not c) or (
                per_point and e.select is not None and c is not d
            ):
                ok.discard(e.src)
                changed = True
        # trivial cycles: all or none
        for k in cyclic:
            members = [v for v in comps[k] if v in over]
            if any(v not in ok for v in members) and any(v in ok for v in members):
                ok.difference_update(members)
                changed = True
        # the two operands of a contraction over a padded axis: both or neither (the row
        # reshapes read both with the padding zeroed, or both cut to T rows)
        for pair in pairs:
            if len(pair & ok) == 1:
                ok.difference_update(pair)
                changed = True
    return ok


def _point_bytes(pdg: PDG, n: Node, oid: int = 0) -> int | None:
    spec = n.outputs[oid]
    env = dict(pdg.static_bounds)
    dims = [
        x if isinstance(x, int) else evaluate(x, env) if _syms(x) <= set(env) else None for x in spec.shape
    ]
    if None in dims or not all(isinstance(b, int) for b in n.batch):
        return None
    return int(np.prod(n.batch, dtype=np.int64) * np.prod(dims, dtype=np.int64)) * spec.dtype.numpy.itemsize


def _streamed(pdg: PDG, d: Sym, vec: set[int], size: int, stream: int) -> set[int]:
    """``vec`` without the nodes that read a source staying per point over ``d`` at ``d``
    (what vectorized would be a stack of all its points, ``size`` of them) holding more than
    ``stream`` bytes stacked, and whose output per point is at most a quarter of that input's
    (the value head's first layer on image observations): run per point, each reads the
    point just produced, which can then be freed or swapped (a memory choice, taken with
    ``CompileOptions(incrementalize=...)``); the chain after it stays vectorized (the edge
    rules of :func:`vectorizable_nodes` run after this). Readers that do not reduce (a row
    reshape of a weight gradient's contraction) stay vectorized: incrementalization tiles
    them along ``d``."""
    keep = set(vec)
    for e in pdg.edges:
        if e.sink not in keep or e.src in vec or e.order_only:
            continue
        src, sink = pdg.nodes[e.src], pdg.nodes[e.sink]
        if _comp(e, src, d) is not d:
            continue
        inp, out = _point_bytes(pdg, src, e.oid), _point_bytes(pdg, sink)
        if inp is None or out is None or inp * size <= stream or 4 * out > inp:
            continue
        log.debug(
            "vectorize %s: %s stays per point (it reduces %s, %d bytes per point: stacked over %s "
            "they would exceed %d bytes)", d, sink.label, src.label, inp, d, stream,
        )  # fmt: skip
        keep.discard(e.sink)
    return keep


def _contraction_pairs(pdg: PDG) -> list[set[int]]:
    """The sources read by the two row reshapes of each contracted matmul (``contract``)."""
    by_sink: dict[int, list[Edge]] = {}
    for e in pdg.edges:
        if not e.order_only:
            by_sink.setdefault(e.sink, []).append(e)

    def rows_source(nid: int) -> int | None:
        n = pdg.nodes[nid]
        if n.op.kind is OpKind.PERMUTE:
            ins = by_sink.get(nid, [])
            if len(ins) != 1:
                return None
            n = pdg.nodes[ins[0].src]
        if n.op.kind is not OpKind.RESHAPE or not n.op.attr("contracted_rows", False):
            return None
        ins = by_sink.get(n.id, [])
        return ins[0].src if len(ins) == 1 else None

    out = []
    for n in pdg:
        if n.op.kind is OpKind.MATMUL:
            srcs = [rows_source(e.src) for e in by_sink.get(n.id, [])]
            if len(srcs) == 2 and None not in srcs:
                out.append({s for s in srcs if s is not None})
    return out


def _local_reason(pdg: PDG, n: Node, d: Sym, static: set[Sym]) -> str:
    """Why ``n`` cannot be vectorized over ``d`` on its own (empty if it can)."""
    kind = n.op.kind
    if kind in _PER_POINT:
        return f"{kind.name} runs per point"
    if d in _syms(n.cond):
        return "its domain condition mentions the dim"
    if any(d in _shape_syms(spec) for spec in n.outputs):
        return "its per-point shape varies along the dim"
    if kind is OpKind.EVAL_SYMBOL:
        if not free_symbols(n.op.attr("expr")) <= static | {d}:
            return "its expression uses other dims"
    elif _row_of(pdg, n, d) is not None:
        pass  # row d of a value without d (a lifted scan): becomes a view of it
    elif d in n.op.symbols():
        return "an op attribute mentions the dim"
    for e in pdg.edges:
        if e.sink == n.id and e.order_only:
            return "it is ordered by an order edge"
        if e.src == n.id and e.order_only:
            return "it orders another node"
        if e.sink != n.id:
            continue
        src = pdg.nodes[e.src]
        if d in _syms(e.cond) or d in _syms(e.select):
            return "an input's condition mentions the dim"
        if d in _shape_syms(src.outputs[e.oid]):
            return f"the per-point shape of its input {src.label} varies along the dim"
        for s, c in zip(src.domain, e.phi, strict=True):
            if s is d:
                if c is not d and not _constant(c):
                    return f"it reads {src.label} at {d} = {c}"
            elif d in free_symbols(c):
                return f"it reads {src.label} with {s} = {c}"
    return ""


def _mentions_end(x: Expr | Slice | None, bound: Sym) -> bool:
    """Whether ``x`` uses ``bound`` outside a ``min``/``max`` (``T - 1``, ``t:T``, ``t < T - 1``
    need ``T`` itself; ``min(t + n, T)`` is known earlier, from ``T``'s lower bound)."""
    if x is None:
        return False
    if isinstance(x, Slice):
        return _mentions_end(x.start, bound) or _mentions_end(x.stop, bound)
    if x is bound:
        return True
    if isinstance(x, (Min, Max)) or not isinstance(x, Expr):
        return False
    return any(_mentions_end(a, bound) for a in x.args if isinstance(a, (Expr, Slice)))


def _streams(pdg: PDG, d: Sym, bound: Sym) -> bool:
    """Whether some edge reads along ``d`` through a window whose end uses ``bound`` inside a
    ``min``/``max`` (``r[t:min(t + n, T)]``): learning can run ``n`` steps behind acting."""
    for e in pdg.edges:
        for c in e.phi:
            if isinstance(c, Slice) and d in _syms(c) and bound in _syms(c) and not _mentions_end(c, bound):
                return True
    return False


def _exprs(values: Iterable[object]) -> Iterable[Expr | Slice]:
    """The symbolic expressions among ``values`` (nested in tuples and lists too)."""
    for v in values:
        if isinstance(v, (Expr, Slice)):
            yield v
        elif isinstance(v, (tuple, list)):
            yield from _exprs(v)


def _waits_for_end(pdg: PDG, bound: Sym, enclosing: frozenset[Sym]) -> set[int]:
    """The nodes that cannot run before the episode of ``bound`` ends: those reading at an
    index that needs ``bound``'s value, and everything that depends on them within the same
    episode (not through reads of an earlier enclosing point); nodes whose shape or attributes
    need it (``expand`` to ``T`` rows) too. Conditions (``t - 1 < T``,
    ``t < T - 1``) do not count: T's lower bound decides them at most a step later."""
    enc = [s for s, _ in pdg.dims if s in enclosing]
    carried = _carried_edges(pdg, enc)
    same = [e for k, e in enumerate(pdg.edges) if k not in carried]  # not an earlier episode
    seeds = {e.sink for e in same if any(_mentions_end(c, bound) for c in e.phi)}
    for n in pdg:  # shapes or attributes of size T (the VJP of a sum over 0:T expands to T)
        if n.op.kind is OpKind.SET_SYMBOL:
            continue  # names the bound, finds its value
        values = [x for spec in n.outputs for x in spec.shape] + [v for _, v in n.op.attrs]
        if any(_mentions_end(x, bound) for x in _exprs(values)):
            seeds.add(n.id)
    succ: dict[int, list[int]] = {}
    for e in same:
        succ.setdefault(e.src, []).append(e.sink)
    return _reach(succ, seeds)


def _reach(succ: dict[int, list[int]], starts: Iterable[int]) -> set[int]:
    """The nodes reachable from ``starts`` in the graph ``succ`` (starts included)."""
    seen = set(starts)
    stack = list(seen)
    while stack:
        for v in succ.get(stack.pop(), ()):
            if v not in seen:
                seen.add(v)
                stack.append(v)
    return seen


def _ancestors(succ: dict[int, list[int]], targets: list[int]) -> set[int]:
    """The nodes with a path to one of ``targets`` in the graph ``succ`` (targets included)."""
    pred: dict[int, list[int]] = {}
    for u, vs in succ.items():
        for v in vs:
            pred.setdefault(v, []).append(u)
    return _reach(pred, targets)


def _dynamic_reason(pdg: PDG, n: Node, d: Sym, enclosing: frozenset[Sym]) -> str:
    """Why ``n`` stays per point over ``d`` whose bound is dynamic (empty if it need not)."""
    kind = n.op.kind
    if not enclosing <= set(n.domain):
        return "it lacks a dim enclosing the dynamic bound's episodes"
    if kind is OpKind.EVAL_SYMBOL:
        return "the values of its expression along a dynamic dim are known only at run time"
    if kind in _RAND:
        return "its rows are seeded per point of a dynamic dim"
    row = _row_of(pdg, n, d)
    if row is not None and not pdg.nodes[row.src].op.attr("padded", False):
        # a SUFFIX_SUM's rows are padded to bucket(T) (pdg/passes/suffix_scan.py): a view
        return "a row of a lifted scan over a dynamic dim"
    return ""


def _row_of(pdg: PDG, n: Node, d: Sym) -> Edge | None:
    """The input edge of ``n = INDEX(x, dim=0, index=d)`` when ``x`` does not vary with ``d``,
    is read at one point and has ``D`` rows (``d < D``): vectorized, ``n`` is ``x`` itself
    with its first per-point axis as the batch axis of ``d``."""
    op = n.op
    if op.kind is not OpKind.INDEX or op.attr("dim") != 0 or op.attr("index") is not d:
        return None
    ins = [e for e in pdg.edges if e.sink == n.id]
    if len(ins) != 1:
        return None
    e = ins[0]
    src = pdg.nodes[e.src]
    if d in src.domain or e.order_only or e.select is not None or e.cond is not TRUE or e.to_batch:
        return None
    if any(isinstance(c, Slice) for c in e.phi) or e.batch_read or src.batch_dims != n.batch_dims:
        return None
    # the view's rows are the batch axis: exactly D of them (a table of 5 rows read at
    # t < T = 3 stays an INDEX per point; its first 3 rows would need a narrowing read)
    bound = pdg.bound_of(d)
    rows = src.outputs[e.oid].shape[0] if src.outputs[e.oid].shape else None
    if rows is not bound and not (isinstance(rows, int) and rows == pdg.static_bounds.get(bound)):
        return None
    return e


def vectorize_partial(pdg: PDG, d: Sym, dynamic: bool = True, stream: int | None = None) -> PDG:
    """Vectorize ``d`` on the nodes :func:`vectorizable_nodes` finds (module doc); a ``d``
    with a dynamic bound only when ``dynamic`` (batch axes padded to buckets of ``T``).
    With ``stream`` (bytes), a node that reduces a per-point input whose stack over ``d``
    would exceed ``stream`` stays per point (:func:`_streamed`)."""
    bound = pdg.bound_of(d)
    size: int | Sym
    if bound in pdg.static_bounds:
        size = int(pdg.static_bounds[bound])
    elif dynamic and bound in pdg.dynamic_bounds:
        size = bound
    else:
        log.debug("vectorize %s: its bound %s is dynamic (vectorize_dynamic is off)", d, bound)
        return pdg
    vec = vectorizable_nodes(pdg, d, stream if isinstance(size, int) else None)
    if not vec:
        return pdg
    env = dict(pdg.static_bounds)
    nodes = dict(pdg.nodes)
    rows: set[int] = set()
    for nid in vec:
        n = nodes[nid]
        dom = tuple(s for s in n.domain if s is not d)
        op = n.op
        if _row_of(pdg, n, d) is not None:
            op = Op.make(OpKind.IDENTITY)
            rows.add(nid)
        elif op.kind is OpKind.EVAL_SYMBOL and d in free_symbols(op.attr("expr")):
            assert isinstance(size, int)  # dynamic: such nodes stay per point (_dynamic_reason)
            dt = op.attr("dtype").numpy
            vals = np.array([evaluate(op.attr("expr"), {**env, d: k}) for k in range(size)], dtype=dt)
            value = np.ascontiguousarray(np.broadcast_to(vals, tuple(n.batch) + (size,)))
            op = Op.make(OpKind.CONST, value=value, batched=True)
        elif op.kind in _RAND:
            # drawn per point of d still (the runtime seeds each row as before: same values)
            op = Op.make(op.kind, **{**dict(op.attrs), "point_dims": (*op.attr("point_dims", ()), d)})
        nodes[nid] = replace(
            n, op=op, domain=dom, batch=tuple(n.batch) + (size,), batch_dims=tuple(n.batch_dims) + (d,)
        )
    edges = []
    for e in pdg.edges:
        src = pdg.nodes[e.src]
        c = _comp(e, src, d)
        if c is not None and e.src in vec:
            k = src.domain.index(d)
            phi = e.phi[:k] + e.phi[k + 1 :]
            if e.sink in vec and c is d:
                e = replace(e, phi=phi)
            else:
                e = replace(e, phi=phi, batch_read=e.batch_read + ((d, c),))
        elif e.sink in rows and not e.order_only:
            e = replace(e, to_batch=d)
        elif c is d and e.sink in vec:
            k = src.domain.index(d)
            phi = e.phi[:k] + (Slice(Const(0), bound),) + e.phi[k + 1 :]
            e = replace(e, phi=phi, to_batch=d)
        edges.append(e)
    log.debug("vectorize %s: %d of %d nodes over it", d, len(vec), sum(d in n.domain for n in pdg))
    assert all(e.cond is TRUE or d not in free_symbols(e.cond) or e.sink not in vec for e in edges)
    return pdg.with_(nodes=nodes, edges=tuple(edges))
