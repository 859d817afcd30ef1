"""Polyhedral execution scheduling of a PDG (paper §6.1, §6.3).

:func:`schedule_pdg` turns a PDG into an execution order:

1. every node becomes an isl statement over its domain (static bounds substituted,
   dynamic bounds kept as parameters ``>= 1``);
2. every edge (data and ``order_only``) becomes a validity dependence
   (source points before the reading sink point) and a proximity constraint
   (slices reduced to their last point, constant ``min`` / ``max`` arguments dropped);
3. every statement over a dynamically bounded dim ``t`` (bound ``T``, found per enclosing
   point ``e`` by its ``SET_SYMBOL`` node ``Z``) runs its point ``t`` after ``Z[e, t - 1]``,
   and every statement over ``e`` without ``t`` whose reads or condition use ``T`` runs
   after ``Z[e, T - 1]`` (validity only, see :func:`bound_order_edges`): the runtime
   knows that a point exists before running it, and ``T`` before a read of ``0:T``;
   and every statement over ``t`` keeps the dims enclosing ``t`` outside it
   (:func:`episode_order_edges`): one loop over ``t`` has one ``T``;
4. isl's scheduler (default options, with proximity) computes a schedule tree with the
   static bounds as parameters (so its work does not grow with their values; the
   substituted bounds are the fallback), within a time budget (Feautrier's algorithm
   past it, see :func:`_solve`), and isl's AST generator turns it into loops for the
   actual bounds, which are converted to timerl's AST; a statement isl placed by the
   value of a dynamic bound before the runtime knows it (``T + di``) is kept after the
   episode (else before it) and the problem solved again (:func:`_known_bounds`,
   ``timerl.schedule.bound_known``);
5. the AST is checked against the dependences (isl's tree code generator can misorder
   statements of one iteration); a wrong one is regenerated from the flattened schedule
   map (:func:`_checked_ast`).

Preconditions: the PDG's index expressions are affine (see ``timerl.schedule.isl``),
every bound is static or dynamic.

Postconditions: the returned :class:`Schedule` executes every domain point of every
node exactly once, after all the points it reads (for every value of the dynamic
bounds ``>= 1``); its AST uses counters ``_c{k}`` and the PDG's bound symbols.
Raises :class:`~timerl.errors.ScheduleError` when no such order exists.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace

from timerl.errors import NonAffineIndexError, ScheduleError
from timerl.pdg.ir import PDG, Edge, Node, strongly_connected_components
from timerl.pdg.passes.enclose import enclosing_dims
from timerl.schedule import ast as tast
from timerl.schedule.ast import AstNode
from timerl.schedule.bound_known import (
    BOUND_ORDER_IID,
    Setter,
    after_setter_edges,
    before_setter_edges,
    early_bound_statements,
    setter_point,
)
from timerl.schedule.cluster import cluster_pdg, expand_ast, split_prologue
from timerl.schedule.dealloc import FreeRequest, expand_frees, graft_frees, sink_frees
from timerl.schedule.distance import edge_offsets
from timerl.schedule.isl import IslProgram, ScheduleBudgetExceeded
from timerl.schedule.swap import expand_swaps, postprocess
from timerl.symbolic import Const, Expr, Slice, Sym, free_symbols
from timerl.symbolic.expr import cmp_le, cmp_lt

log = logging.getLogger(__name__)


MAX_UNCLUSTERED = 40
"""Largest statement count for which a failed clustered schedule is retried unclustered."""

WINDOW_ORDER_IID = -3
"""``iid`` of :func:`bound_order_edges`' edges that wait a few steps for a dynamic bound
(``Z[e, min(t + k, T - 1)]``): validity and proximity, so isl keeps the node ``k`` steps
behind the setter (an n-step window's gradient inside the acting loop) rather than after
the episode."""


@dataclass(frozen=True)
class Schedule:
    """A computed execution schedule.

    ``ast``: timerl's AST to interpret; ``isl_text``: the isl schedule tree (for debugging
    and caching; re-readable with ``isl.Schedule.read_from_str``); ``c_text``: isl's
    C-like listing of the generated AST.
    """

    ast: AstNode
    isl_text: str
    c_text: str = ""

    def pretty(self) -> str:
        return tast.pretty(self.ast)


def schedule_pdg(
    pdg: PDG,
    cluster: bool = True,
    _clustered: bool = False,
    *,
    dealloc: bool = False,
    keep: frozenset[int] = frozenset(),
    swap: frozenset[int] = frozenset(),
    _frees: FreeRequest | None = None,
    _episodes: tuple[tuple[Sym, tuple[Sym, ...]], ...] | None = None,
    _setters: tuple[Setter, ...] | None = None,
) -> Schedule:
    """Compute the execution schedule of ``pdg`` (see the module docstring).

    With ``cluster`` (default), identity-linked nodes are scheduled as one statement
    (``timerl.schedule.cluster``), which keeps isl fast on large programs. With
    ``dealloc``, ``Dealloc`` statements free every read point after its last reader
    (``timerl.schedule.dealloc``; nodes in ``keep`` are never freed), grafted into the
    computed schedule without changing the compute order; nodes in ``swap`` get offloads
    and fetches as well (``timerl.schedule.swap``; needs ``dealloc``). The memory
    statements are then post-processed (``swap.postprocess``: redundant moves dropped,
    memory-only static loops batched).
    """
    if not _clustered and not any(e.iid in (BOUND_ORDER_IID, WINDOW_ORDER_IID) for e in pdg.edges):
        pdg = pdg.with_(edges=pdg.edges + bound_order_edges(pdg))
    if _episodes is None:
        _episodes = episode_dims(pdg)
    if _setters is None:
        _setters = tuple(
            Setter(b, t, enc, z)
            for b, (t, enc, z) in sorted(enclosing_dims(pdg).items(), key=lambda kv: kv[0].name)
        )
    if cluster:
        rest, prologue = split_prologue(pdg)
        small, members = cluster_pdg(rest)
        if len(small.nodes) < len(pdg.nodes) and small.nodes:
            _check_own_self_reads(pdg)
            req = None
            rep = {m: r for r, ms in members.items() for m in ms}
            if dealloc:
                req = FreeRequest(pdg, rep, keep, swap)
            setters = tuple(replace(z, stmt=rep.get(z.stmt, z.stmt)) for z in _setters)
            try:
                s = schedule_pdg(
                    small, cluster=False, _clustered=True, _frees=req, _episodes=_episodes, _setters=setters
                )
            except ScheduleError:
                if len(rest.nodes) > MAX_UNCLUSTERED:
                    raise  # isl takes minutes on hundreds of statements; the cluster error names them
                # re-run unclustered for a precise error (or a schedule)
                return schedule_pdg(
                    pdg,
                    cluster=False,
                    dealloc=dealloc,
                    keep=keep,
                    swap=swap,
                    _episodes=_episodes,
                    _setters=_setters,
                )
            pro = tuple(tast.Exec(n, ()) for n in prologue)
            body = expand_ast(s.ast, members)
            body = postprocess(sink_frees(body), frozenset(pdg.dynamic_bounds)) if dealloc else body
            return Schedule(tast.Seq((*pro, body)), s.isl_text, s.c_text)
    if dealloc and _frees is None:
        _frees = FreeRequest(pdg, {n.id: n.id for n in pdg}, keep, swap)
    t0 = time.perf_counter()
    if not _clustered:  # a cluster's self-edges include member-to-member reads at one point
        static = IslProgram(pdg)
        _check_self_reads(pdg, static, static.dependences(proximity=False))
    work = pdg.with_(edges=pdg.edges + episode_order_edges(pdg, _episodes))
    prog, validity, sched = _known_bounds(work, _solve(work), _setters)
    t1 = time.perf_counter()
    freed = None if _frees is None else _with_frees(prog, sched, validity, _clustered, _frees)
    if freed is not None:  # checked with the compute dependences too
        ast, c_text, sched = freed
        if not _clustered:
            ast = postprocess(sink_frees(ast), frozenset(pdg.dynamic_bounds))
    else:
        ast, c_text = _checked_ast(pdg, prog, sched, validity, _clustered)
    t2 = time.perf_counter()
    log.debug(
        "scheduled %d nodes / %d edges: isl schedule %.3fs, AST (frees included) %.3fs\n%s",
        len(pdg.nodes), len(pdg.edges), t1 - t0, t2 - t1, c_text,
    )  # fmt: skip
    return Schedule(ast=ast, isl_text=prog.schedule_text(sched), c_text=c_text)


def _known_bounds(
    pdg: PDG, solved: tuple[IslProgram, object, object], setters: tuple[Setter, ...]
) -> tuple[IslProgram, object, object]:
    """``solved`` again, with order edges, while it places statements by the value of a dynamic
    bound before the bound is known (``timerl.schedule.bound_known``): such a statement
    runs after the episode that finds the bound, else before it. A schedule that cannot be
    repaired is kept (the runtime then refuses it with a ``BoundError``), with a warning."""
    added: tuple[Edge, ...] = ()
    for _ in range(_BOUND_ROUNDS):
        early = early_bound_statements(solved[0], solved[2], setters)
        if not early:
            return solved
        names = ", ".join(pdg.nodes[n].label for ns in early.values() for n in ns)
        for make in (after_setter_edges, before_setter_edges):
            extra = tuple(e for z, ns in early.items() for e in make(pdg, ns, z))
            try:
                got = _solve(pdg.with_(edges=pdg.edges + added + extra))
            except ScheduleError:
                continue
            log.debug(
                "%s placed by a dynamic bound before it is known; scheduled again (%s)", names, make.__name__
            )
            added, solved = added + extra, got
            break
        else:
            log.warning(
                "isl placed %s by a dynamic bound before it is known, and no other order was found", names
            )
            return solved
    return solved


_BOUND_ROUNDS = 3
"""Schedules computed again at most by :func:`_known_bounds` (each round adds edges for the
statements the last one placed too early)."""


def _with_frees(
    prog: IslProgram,
    sched: object,
    validity: object,
    clustered: bool,
    req: FreeRequest,
    order: object | None = None,
) -> tuple[AstNode, str, object] | None:
    """The AST of ``sched`` with frees grafted (``timerl.schedule.dealloc``), checked against
    the compute and the free dependences; ``None`` (with a warning: nothing is freed early)
    when isl's AST for it is wrong.

    Last uses come from the schedule's map first. isl's AST generator may run the children of
    a ``set`` node of the tree in another order than that map (a statement of the second
    child first: its free then ran before a reader in the first child); an AST that
    misorders the frees is then made again with the last uses taken from the order of the
    compute AST itself (``order``), before anything is given up."""
    got = graft_frees(req, prog, sched, order)
    if got is None:
        return None
    grafted, free_validity, free_domain, members, plan = got
    what = "deallocation statements" if plan is None else "swapping"

    def fallback() -> tuple[AstNode, str, object] | None:
        if order is None:
            compute, _ = prog.build_ast(sched)
            return _with_frees(prog, sched, validity, clustered, req, prog.ast_order(compute))
        return _with_frees(prog, sched, validity, clustered, replace(req, swap=frozenset())) if plan else None

    try:
        ast, c_text = prog.build_ast(grafted)
    except ScheduleError as exc:
        log.warning("no %s: %s", what, exc)
        return _with_frees(prog, sched, validity, clustered, replace(req, swap=frozenset())) if plan else None
    bad = prog.ast_violations(
        ast, validity.union(free_validity), same_point_ok=clustered, extra_domain=free_domain
    )
    if not bad.is_empty():
        (log.debug if order is None else log.warning)(
            "%s%s: isl's AST with them misorders %s",
            "no " if order is not None else "",
            what,
            bad.to_str()[:500],
        )
        return fallback()
    ast = expand_frees(ast, members)
    if plan is not None:
        ast = expand_swaps(ast, plan.offloads, plan.fetches, {n.id: len(n.outputs) for n in req.pdg})
    return ast, c_text, grafted


ISL_BUDGET_S = 8.0
"""Seconds isl's scheduler may run on one problem before timerl falls back to a cheaper one."""

_ATTEMPTS = (  # (label, static bounds as isl parameters, isl schedule algorithm: 0 Pluto-like, 1 Feautrier)
    ("parametric", True, 0),
    ("static", False, 0),
    ("parametric Feautrier", True, 1),
    ("static Feautrier", False, 1),
)


def _coefficients(pdg: PDG) -> tuple[int, ...]:
    """isl's schedule coefficient bounds to try, in order: unbounded first when an edge reads a
    slice that starts at a multiple (> 1) of one of the sink's dims (incrementalized block reads
    ``x[bs*di : bs*di + bs]``: with coefficients of 1 isl runs the blocks after the whole loop
    producing them, so frees cannot keep one block live), else small ones first."""
    from timerl.symbolic import Slice
    from timerl.symbolic.simplify import affine_in

    for e in pdg.edges:
        for c in e.phi:
            if not isinstance(c, Slice):
                continue
            for d in pdg.nodes[e.sink].domain:
                got = affine_in(c.start, d)
                if got is not None and abs(got[0]) > 1:
                    return (-1, 1)
    return (1, -1)


def _solve(pdg: PDG) -> tuple[IslProgram, object, object]:
    """isl's schedule of ``pdg``: (program, validity, schedule).

    Static bounds are isl parameters first, so the scheduler's work does not depend on
    their values (with the bounds as constants, isl took minutes on a 40-statement
    program with a batch bound of 4, and longer with 8); the schedule is valid for every
    value and the AST is generated for the actual ones. A program whose indices are
    affine only once the bounds are known (``t * T``), or that has no schedule for all
    values, is scheduled with the bounds substituted. When isl runs past
    :data:`ISL_BUDGET_S`, Feautrier's algorithm (one coarser problem per dimension, far
    cheaper, less locality) is used instead, with a warning.
    """
    over_budget = False
    for label, parametric, algorithm in _ATTEMPTS:
        if over_budget != (algorithm == 1):
            continue
        try:
            prog = IslProgram(pdg, parametric=parametric)
            prog.ctx.set_schedule_algorithm(algorithm)
            validity = prog.dependences(proximity=False)
            proximity = prog.dependences(proximity=True, edges=proximity_edges(pdg))
        except NonAffineIndexError:
            if parametric:
                continue
            raise
        t0 = time.perf_counter()
        try:
            sched = prog.compute_schedule(
                validity, proximity, budget_s=ISL_BUDGET_S, coefficients=_coefficients(pdg)
            )
        except ScheduleBudgetExceeded:
            log.warning(
                "isl's %s scheduler ran past %.0fs on %d statements; falling back to a coarser schedule",
                label, ISL_BUDGET_S, len(pdg.nodes),
            )  # fmt: skip
            over_budget = True
            continue
        log.debug("isl %s schedule of %d statements: %.3fs", label, len(pdg.nodes), time.perf_counter() - t0)
        if sched is not None:
            return prog, validity, sched
        if not parametric and algorithm == 0:
            break  # no schedule even with the actual bounds
    if over_budget:
        raise ScheduleError(
            f"isl found no schedule for {len(pdg.nodes)} statements within its budget of {ISL_BUDGET_S:.0f}s "
            "(nor with Feautrier's algorithm). Hint: fewer symbolic dims per tensor (vectorizable batch dims "
            "read at their own point instead of a fixed one) make the problem smaller"
        )
    raise _unschedulable(pdg, IslProgram(pdg))


def _checked_ast(
    pdg: PDG, prog: IslProgram, sched: object, validity: object, clustered: bool
) -> tuple[AstNode, str]:
    """isl's AST for ``sched``, checked against the dependences it must respect.

    isl's code generator can misorder statements that share a loop iteration when it
    builds from a schedule tree (the isl of islpy 2026.2.2: two statements at inner-band
    positions 0 and 1 emitted in the wrong order under one strided ``if``, see
    ``tests/reliability/test_repros.py``); the AST is generated again from
    the flattened schedule map then, and a schedule whose AST is still wrong is refused
    rather than run.
    """
    for flat in (False, True):
        ast, c_text = prog.build_ast(sched, flat=flat)
        bad = prog.ast_violations(ast, validity, same_point_ok=clustered)
        if bad.is_empty():
            return ast, c_text
        log.warning(
            "isl generated an AST (%s) that misorders dependences %s; %s",
            "flat map" if flat else "schedule tree",
            bad.to_str()[:500],
            "refusing it" if flat else "regenerating it from the flattened schedule",
        )
    raise ScheduleError(
        f"isl generated no AST that respects the dependences of {len(pdg.nodes)} statements; "
        "this is a bug in the scheduler, please report it with the PDG"
    )


def proximity_edges(pdg: PDG) -> list[Edge]:
    """Per (source, sink) pair, the edges reading the latest source points.

    isl minimises the largest proximity distance, so an identity read next to a window
    read ``r[t:t + n]`` of the same statement would keep the two apart (distance 0
    versus n - 1) and stop isl from interleaving n-step learning with acting. Only the
    reads that bound how early the sink can run matter for locality.
    """
    groups: dict[tuple[int, int], list[tuple[Edge, dict]]] = {}
    for e in pdg.edges:
        if e.order_only and e.iid == BOUND_ORDER_IID:
            continue
        groups.setdefault((e.src, e.sink), []).append((e, edge_offsets(e, pdg)))
    out: list[Edge] = []
    for items in groups.values():
        for k, (e, off) in enumerate(items):
            dominated = any(
                j != k
                and other.keys() == off.keys()
                and all(other[d][1] >= off[d][1] for d in off)
                and (any(other[d][1] > off[d][1] for d in off) or j < k)
                for j, (_, other) in enumerate(items)
            )
            if not dominated:
                out.append(e)
    return out


def bound_order_edges(pdg: PDG) -> tuple[Edge, ...]:
    """Order-only edges that keep every statement over a dynamic dim after its bound's setter.

    isl sees a dynamic bound ``T`` as one parameter, but the runtime finds it per enclosing
    point ``e`` (``i`` for an episode) while running ``T``'s ``SET_SYMBOL`` node ``Z``
    over ``(e, t)``. A statement over ``t`` that reads nothing along ``t``
    (``as_tensor(t % 2, domain=(i,))``) could otherwise get a ``t`` loop of its own before
    ``Z``'s loop, and that loop cannot know ``T``. For every node ``S`` (other than ``Z``)
    whose domain has ``e`` and ``t``: ``S[.., t, ..]`` after ``Z[e, t - 1]`` (for
    ``t >= 1``), so ``S`` runs inside ``Z``'s loop (at ``t`` or later) or after it. For
    every node ``N`` over ``e`` but not ``t`` that reads with ``T`` (a data edge's ``T`` is
    the reader's) or has ``T`` in its condition or attributes (``x[i, 0:T].sum(0)``):
    ``N[e]`` after ``Z[e, T - 1]``. Nodes lacking some of ``e`` get no edge (see ``timerl.pdg.passes.enclose``), and so
    does a node over ``t`` that always reads another such node at ``(e, t + k)``, ``k >= 0``
    (the order follows from that node's edge; this keeps the edges few).
    """
    ins: dict[int, list[Edge]] = {}
    for e in pdg.edges:
        ins.setdefault(e.sink, []).append(e)
    out: list[Edge] = []
    made: list[IslProgram] = []

    def prog() -> IslProgram:
        if not made:
            made.append(IslProgram(pdg))
        return made[0]

    for bound, (t, enclosing, zid) in sorted(enclosing_dims(pdg).items(), key=lambda kv: kv[0].name):
        z = pdg.nodes[zid]
        over = {n.id for n in pdg if t in n.domain and set(enclosing) <= set(n.domain)} - {zid}
        for n in pdg:
            if n.id == zid or not set(enclosing) <= set(n.domain):
                continue
            if t in n.domain:
                exprs = _value_exprs(n, ins.get(n.id, ()))
                if not all(prog().known_early(x, n.domain, t, bound) for x in exprs):
                    # its value or the point it reads needs T itself (`as_tensor(T - 1 - t)`,
                    # `x[T - 1 - t]`: after the episode's end), or T within a window
                    # (`expand(min(t + n, T) - t)`, an n-step window's gradient: n - 1 steps
                    # later, or at the end)
                    lag = _window_lag(prog(), exprs, n.domain, t, bound)
                    if lag is None:
                        phi = setter_point(pdg, z, t, bound - 1)
                        out.append(Edge(n.id, zid, BOUND_ORDER_IID, 0, phi, order_only=True))
                    else:  # Z[e, t + lag] while the episode lasts, Z[e, T - 1] near its end
                        near = cmp_le(t + lag, bound - 1)
                        phi = setter_point(pdg, z, t, t + lag)
                        out.append(Edge(n.id, zid, WINDOW_ORDER_IID, 0, phi, near, None, True))
                        phi = setter_point(pdg, z, t, bound - 1)
                        out.append(
                            Edge(n.id, zid, BOUND_ORDER_IID, 0, phi, cmp_lt(bound - 1, t + lag), None, True)
                        )
                    continue
                if any(_reads_later(pdg, e, t, enclosing) for e in ins.get(n.id, ()) if e.src in over):
                    continue
                phi = setter_point(pdg, z, t, t - 1)
                out.append(Edge(n.id, zid, BOUND_ORDER_IID, 0, phi, cmp_le(Const(1), t), None, True))
            elif bound in _node_syms(n, ins.get(n.id, ())):
                phi = setter_point(pdg, z, t, bound - 1)
                out.append(Edge(n.id, zid, BOUND_ORDER_IID, 0, phi, order_only=True))
    return tuple(out)


MAX_WINDOW_LAG = 64
"""Steps after ``t`` a node over ``t`` may wait for its dynamic bound (:func:`_window_lag`)."""


def _window_lag(prog: IslProgram, exprs: list[Expr], dims: tuple[Sym, ...], t: Sym, bound: Sym) -> int | None:
    """The fewest steps ``k <= MAX_WINDOW_LAG`` after ``t`` once which every expression of
    ``exprs`` is known (``bound > t + k``): 7 for ``min(t + 8, T)``; None when some needs
    ``bound``'s value itself (``T - 1 - t``). Found by bisection (known at ``k`` implies
    known at every larger ``k``)."""
    if not all(prog.known_early(x, dims, t, bound, MAX_WINDOW_LAG) for x in exprs):
        return None
    lo, hi = 0, MAX_WINDOW_LAG  # known at hi, not at lo
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if all(prog.known_early(x, dims, t, bound, mid) for x in exprs):
            hi = mid
        else:
            lo = mid
    return hi


def episode_dims(pdg: PDG) -> tuple[tuple[Sym, tuple[Sym, ...]], ...]:
    """Per dynamic bound found per enclosing point: (its dim ``t``, the enclosing dims)."""
    return tuple((t, enc) for t, enc, _ in enclosing_dims(pdg).values() if enc)


def episode_order_edges(pdg: PDG, episodes: tuple[tuple[Sym, tuple[Sym, ...]], ...]) -> tuple[Edge, ...]:
    """Order-only self-edges that keep each dim enclosing a dynamic dim outside it.

    The runtime finds a dynamic bound ``T`` per enclosing point ``e`` (an episode's
    length per iteration ``i``), so a loop over ``t`` must sit inside the loops over ``e``:
    ``for t < T: for i: S(i, t)`` has one ``T`` for every episode. isl sees ``T`` as one
    parameter and would accept that order when ``S`` reads nothing along ``e``. For every
    node over ``t`` and its enclosing dims, and every enclosing dim ``d``:
    ``S[.., d, .., t, ..]`` after ``S[.., d - 1, .., 0:T, ..]`` (other dims unchanged),
    which no schedule with ``t`` before ``d`` satisfies (``S[d - 1, T - 1]`` would follow
    ``S[d, 0]``). Validity only, added to the problem isl solves (after clustering).
    """
    out: list[Edge] = []
    for t, enclosing in episodes:
        for n in pdg:
            if t not in n.domain or not set(enclosing) <= set(n.domain):
                continue
            for d in enclosing:
                phi = tuple(
                    d - 1 if x is d else Slice(Const(0), pdg.bound_of(t)) if x is t else x for x in n.domain
                )
                out.append(Edge(n.id, n.id, BOUND_ORDER_IID, 0, phi, cmp_le(Const(1), d), None, True))
    return tuple(out)


def _reads_later(pdg: PDG, e: Edge, t: Sym, enclosing: tuple[Sym, ...]) -> bool:
    """Whether ``e`` always reads one point ``(e, t + k)`` (``k >= 0``) of its source."""
    if e.order_only or not (isinstance(e.cond, Const) and e.cond.value is True):
        return False
    src = pdg.nodes[e.src]
    for d, comp in zip(src.domain, e.phi, strict=True):
        if isinstance(comp, Slice):
            return False
        if d in enclosing and comp is not d:
            return False
        if d is t:
            lo, hi = edge_offsets(e, pdg)[t]
            if lo != hi or lo < 0:
                return False
    return True


def _value_exprs(n: Node, edges: list[Edge] | tuple[Edge, ...]) -> list[Expr]:
    """Expressions whose value (not only truth at the point) a node needs: index-expression
    attributes (``as_tensor``'s expression, an ``INDEX`` position) and the points its data
    edges read (slice bounds and conditions are left to the reads' own order, which lets
    n-step windows ``r[t:min(t + n, T)]`` run inside the acting loop)."""
    out: list[Expr] = []

    def attr(v: object) -> None:
        if isinstance(v, Expr):
            out.append(v)
        elif isinstance(v, (tuple, list)):
            for x in v:
                attr(x)

    attr(tuple(v for _, v in n.op.attrs))
    for e in edges:
        if not e.order_only:
            out.extend(c for c in e.phi if isinstance(c, Expr))
    return out


def _node_syms(n: Node, edges: list[Edge] | tuple[Edge, ...]) -> frozenset[Sym]:
    syms = free_symbols(n.cond) | n.op.symbols()
    for e in edges:
        syms |= free_symbols(e.cond)
        if e.order_only:  # bounds in an order edge's phi are the source's
            continue
        for c in e.phi:
            syms |= free_symbols(c)
        if e.select is not None:
            syms |= free_symbols(e.select)
    return syms


def _check_own_self_reads(pdg: PDG) -> None:
    """The self-read check on the nodes' own self-edges (before clustering)."""
    selfish = {e.src for e in pdg.edges if e.src == e.sink}
    if not selfish:
        return
    sub = pdg.with_(
        nodes={k: pdg.nodes[k] for k in selfish},
        edges=tuple(e for e in pdg.edges if e.src == e.sink),
    )
    prog = IslProgram(sub)
    _check_self_reads(sub, prog, prog.dependences(proximity=False))


def _check_self_reads(pdg: PDG, prog: IslProgram, validity: object) -> None:
    """A point that depends on itself can never run (isl silently ignores such pairs)."""
    for nid in prog.self_dependent(validity):
        node = pdg.nodes[nid]
        raise ScheduleError(
            f"cannot schedule {node.label}: some of its points read themselves "
            f"({prog.self_dependent(validity)[nid]}). Hint: a recurrence must read only strictly "
            "earlier points (e.g. x[t - 1], not x[t]); check the edge conditions."
        )


def _sccs(pdg: PDG) -> list[list[int]]:
    """Strongly connected components of the node graph that hold a cycle, each sorted."""
    succ: dict[int, set[int]] = {n: set() for n in pdg.nodes}
    for e in pdg.edges:
        succ[e.src].add(e.sink)
    comps = strongly_connected_components(sorted(pdg.nodes), {v: sorted(w) for v, w in succ.items()})
    return [sorted(c) for c in comps if len(c) > 1 or c[0] in succ[c[0]]]


def _unschedulable(pdg: PDG, prog: IslProgram) -> ScheduleError:
    """Name the smallest cycle of nodes isl cannot order on its own."""
    culprits: list[int] | None = None
    for comp in sorted(_sccs(pdg), key=len):
        members = set(comp)
        sub = pdg.with_(
            nodes={k: pdg.nodes[k] for k in comp},
            edges=tuple(e for e in pdg.edges if e.sink in members and e.src in members),
        )
        sp = IslProgram(sub, prog.ctx)
        if sp.compute_schedule(sp.dependences(False), sp.dependences(True)) is None:
            culprits = comp
            break
    if culprits is None:
        culprits = sorted(pdg.nodes)
    labels = ", ".join(pdg.nodes[k].label for k in culprits)
    return ScheduleError(
        f"cannot schedule {labels}: their dependences form a cycle with no legal execution order. "
        "Hint: a recurrence must read only strictly earlier points (e.g. x[t - 1], not x[t] or x[t + 1]); "
        "check the branch conditions of recursive definitions."
    )
