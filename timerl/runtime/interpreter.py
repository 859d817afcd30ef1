"""The AST interpreter: runs a :class:`~timerl.plan.plan.Plan` on a backend.

The Plan holds every decision (regions, donations, store kinds, the iteration loop, scanned
loops); the interpreter executes it and decides nothing.

The style follows jax's ``eval_jaxpr``: an environment (``self._env``: loop counters and
bound values) and a store (:class:`~timerl.runtime.store.PointStore`) with read/write
helpers. For speed, the AST is compiled once into nested Python closures and every node
into a *thunk* ``thunk(point)`` whose edge gathers are resolved up front; symbolic
expressions are compiled into Python lambdas.

**Edges.** Input ``iid`` of node ``n`` at point ``q`` is output ``oid`` of ``src`` at
``phi(q)``. A :class:`~timerl.symbolic.Slice` component stacks the source points along a
new axis right after the source's batch dims (several slice components give several
axes, in component order). ``select`` (gradient edges) takes, from each stacked source
tensor, element ``select(q, SLICE_VAR = source coordinate)`` of its first per-point axis
before stacking. ``order_only`` edges carry no data and are ignored here. A ``MERGE``
outputs the input of its first in-edge (by ``iid``) whose ``cond`` holds at ``q``.

**Storage.** Outputs that slices re-read (``r[i, t:T]`` at every ``t``) are kept in a block
store (:mod:`~timerl.runtime.block_store`, chosen by the plan; ``block_store=False``
keeps every output in the point store): a slice read along the block dim is one read of
the buffer's rows instead of a stack of points, with the same values and layout.

**Batching.** Input ``k`` is batched iff its source node has a non-empty ``batch``.

**Dynamic bounds** (``pdg.dynamic_bounds``, found by ``SET_SYMBOL`` nodes). A bound ``T``
of dim ``t`` has one value per *enclosing point*: the coordinates of the dims that
precede ``t`` in the SET_SYMBOL node's domain (``(i,)`` for an episode bound). Rules:

* When the SET_SYMBOL node runs at a point whose boolean input is all true (batched:
  every batch element), ``T = t + 1`` for that enclosing point; when it is not, that
  point's lower bound becomes ``lb = t + 2`` (``lb`` starts at 1). Values and lower
  bounds are kept per enclosing point, never forgotten during a run: a node reads, in
  its own ``env`` (edge ``phi``/``cond``/``select``, op attributes), the ``T`` of the
  enclosing point of *its* point (learning over ``t`` of episode ``i`` after acting,
  or even after later episodes acted).
* The AST uses one symbol ``T``. Which enclosing point it means at an expression site
  (a loop init/cond, an ``If``, an ``Exec``/``Dealloc`` point) is decided once, when the
  AST is compiled: the first ``Exec`` or ``Dealloc`` below the site of a node having all
  enclosing dims (``reset(c0)``, ``step(c0, c1)``, ``free g(c0, T - 1 - c1)``) gives the
  enclosing coordinates as expressions in the counters in scope (``i = c0`` for
  ``for (c1 = 0; c1 < T; ...)`` inside ``for c0``). So ``T`` "resets" exactly when the enclosing counters move to an
  episode whose ``T`` is not known yet, and a schedule that acts for every episode in one
  ``i`` loop and learns in a second one still reads each episode's own ``T``.
  Fallback, for a site without such a statement below it: the *current* enclosing point,
  the lexicographically greatest one of any executed node having all enclosing dims (it
  only moves forward, so a late exec of an older episode cannot swap it back).
* While ``T`` is unknown, an AST expression that uses it is evaluated with ``T = lb`` and
  ``T = BIG``: ``If`` conditions, ``Exec``/``Dealloc`` points and loop inits must agree,
  else :class:`~timerl.errors.BoundError`; a loop condition stops when its ``BIG``
  evaluation is false. A loop whose condition needs an unknown ``T`` but whose body
  never runs ``T``'s SET_SYMBOL node raises at once instead of spinning.

**Effects.** ``RAND_*`` ops are seeded per ``(seed, node id, point)``
(:func:`~timerl.runtime.common.point_seed`); UDFs get ``(inputs as NumPy, point dict)``
and return one array per output (with ``array_io = "dlpack"``: backend tensors in, DLPack
objects out, no host copies); sinks get ``(NumPy value, point dict)``. Exceptions from
user code become :class:`~timerl.errors.RuntimeExecutionError` naming the node and point.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from timerl.backends.base import AbstractBackend
from timerl.errors import BackendError, BoundError, RuntimeExecutionError, ScheduleError, TimeRLError
from timerl.pdg.ir import PDG, SLICE_VAR, Edge, Node
from timerl.pdg.ops import OpKind
from timerl.pdg.sizes import is_padded, resolve_batch
from timerl.plan.layout import input_layout, pads_to_bucket
from timerl.plan.plan import Plan, Target
from timerl.plan.regions import FusedExec
from timerl.plan.storage import BlockSpec, slice_axis
from timerl.runtime import tracing
from timerl.runtime.block_store import BlockTable
from timerl.runtime.common import (
    call_udf,
    draw_points,
    draw_seeds,
    draw_seeds_shifted,
    eval_shape,
    point_dict,
    run_seeds,
    user_code_error,
)
from timerl.runtime.fusion import make_fused_thunk
from timerl.runtime.gc import IterationCollector
from timerl.runtime.host_memory import keep_freed_host_memory
from timerl.runtime.points import PointBox
from timerl.runtime.rows_table import RowsTable
from timerl.runtime.store import DEFAULT_TOP, MemoryStats, MemoryTimeline, Point, PointStore
from timerl.schedule.ast import AstNode, Dealloc, Exec, Fetch, If, Loop, MemOp, Offload, Seq, walk
from timerl.symbolic import Expr, Slice, Sym, free_symbols
from timerl.symbolic.compile import compile_expr, compile_exprs, symbols_of

log = logging.getLogger(__name__)

BIG = 1 << 40
"""Stand-in for an unknown dynamic bound (the upper end of ``[lb, inf)``)."""

MAX_LOOP_ITERATIONS = 10**7
"""A loop running more iterations than this raises instead of hanging."""

Env = dict[Sym, int]


# -- dynamic bounds -------------------------------------------------------------------------
def _dyn_attr_exprs(node: Node, dyn: frozenset[Sym]) -> dict[Sym, list[Callable[[Env], Any]]]:
    """Per dynamic bound in ``dyn``, the compiled op-attribute expressions of ``node`` using it."""
    out: dict[Sym, list[Callable[[Env], Any]]] = {}

    def visit(x: Any) -> None:
        if isinstance(x, Expr):
            for b in free_symbols(x) & dyn:
                out.setdefault(b, []).append(compile_expr(x))
        elif isinstance(x, (tuple, list)):
            for y in x:
                visit(y)

    if node.op.symbols() & dyn:
        visit(tuple(v for _, v in node.op.attrs))
    return out


@dataclass(eq=False)
class _DynBound:
    """Runtime state of one dynamic bound ``sym`` of dim ``dim``."""

    sym: Sym
    dim: Sym
    setter: int  # the SET_SYMBOL node id
    enclosing: tuple[Sym, ...]  # dims before `dim` in the setter's domain
    set_key_idx: tuple[int, ...]  # positions of `enclosing` in the setter's domain
    t_idx: int  # position of `dim` in the setter's domain
    known: dict[Point, int] = field(default_factory=dict)  # enclosing point -> value
    lbs: dict[Point, int] = field(default_factory=dict)  # enclosing point -> lower bound (default 1)
    key: Point | None = None  # the current enclosing point (fallback for AST sites)
    most: int | None = None  # the user's max_bounds for it: an episode running past it raises

    def value(self, key: Point | None) -> int | None:
        return None if key is None else self.known.get(key)

    def lb(self, key: Point | None) -> int:
        return 1 if key is None else self.lbs.get(key, 1)


def _dyn_bounds(pdg: PDG) -> dict[Sym, _DynBound]:
    out: dict[Sym, _DynBound] = {}
    for n in pdg:
        if n.op.kind is not OpKind.SET_SYMBOL:
            continue
        b, d = n.op.attr("bound"), n.op.attr("dim")
        if b not in pdg.dynamic_bounds:
            raise BoundError(f"SET_SYMBOL {n.label} sets {b}, which is not a dynamic bound of the program")
        if d not in n.domain:
            raise BoundError(f"SET_SYMBOL {n.label} sets {b} for dim {d}, which is not in its domain")
        if b in out:
            raise BoundError(f"dynamic bound {b} is set by two nodes (%{out[b].setter} and %{n.id})")
        k = n.domain.index(d)
        out[b] = _DynBound(b, d, n.id, tuple(n.domain[:k]), tuple(range(k)), k)
    missing = set(pdg.dynamic_bounds) - set(out)
    if missing:
        names = ", ".join(sorted(s.name for s in missing))
        raise BoundError(f"dynamic bound(s) {names} have no SET_SYMBOL node that finds them")
    return out


# -- the executor ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Site:
    """An AST expression site using dynamic bounds: per bound, how to find its enclosing point."""

    keys: tuple[tuple[_DynBound, Callable[[Env], Point] | None], ...]


class Executor:
    """Interprets ``plan`` on ``backend``; ``execute()`` runs the whole program.

    After a run, :meth:`value` reads stored (not freed) values and :meth:`memory_stats`
    reports live and peak bytes of the point stores.
    """

    max_loop_iterations: int = MAX_LOOP_ITERATIONS

    def __init__(
        self,
        plan: Plan,
        backend: AbstractBackend,
        seed: int = 0,
        memory_timeline: bool = False,
    ) -> None:
        pdg, ast = plan.pdg, plan.ast
        have = Target.of(backend)
        if not have.runs(plan.target):
            raise ScheduleError(
                f"this plan was made for the {plan.target.name} backend (donation={plan.target.donates}, "
                f"scans={plan.target.scans}); {have.name} cannot run it: make the plan for Target.of(backend)"
            )
        self.plan = plan
        self.pdg = pdg
        self.record_timeline = memory_timeline  # sample live bytes per pool (store.MemoryTimeline)
        self.fuse = plan.options.fuse
        # regions reuse the buffers of inputs they read last (plan/donate.py)
        self.donate = plan.options.donate
        # (merge, input id): the merge is the only reader of that input's point and frees it
        # once it stored the tensor (plan/donate.merge_moves), so donation finds it unshared
        self.merge_moves = plan.merge_moves
        # [inputs donated, inputs not donated because something else held the tensor,
        #  bytes donated]
        self.donation_stats = [0, 0, 0]
        # slice-read outputs kept in preallocated buffers (plan/storage.py, runtime/block_store.py)
        self.block_plan: dict[tuple[int, int], BlockSpec] = dict(plan.blocks)
        # free whole iterations no longer read (see runtime/gc.py) at the plan's iteration loop
        self._collector: IterationCollector | None = None
        self._gc_loop: Loop | None = plan.gc_loop
        self._gc_offset = plan.iter_offset
        if self._gc_loop is not None and plan.iter_dim is not None:
            self._collector = IterationCollector(pdg, plan.iter_dim)
        elif plan.options.free_iterations:
            log.debug("not freeing iterations: the schedule is not iteration-major")
        self._fused: dict[Any, Callable[[Point], None]] = {}
        self._fused_fns: dict[Any, Callable[..., Any]] = {}  # kept across runs
        self.ast = ast
        self.backend = backend
        self.seeds = run_seeds(
            pdg.agent_dims, {d: pdg.static_bounds[pdg.bound_of(d)] for d in pdg.agent_dims}, seed
        )
        self.seed = self.seeds.base
        self._static: Env = {s: int(v) for s, v in pdg.static_bounds.items()}
        self._dyn = _dyn_bounds(pdg)
        for name, most in plan.options.max_bounds:
            for db in self._dyn.values():
                if db.sym.name == name:
                    db.most = most
        self._env: Env = dict(self._static)
        # outputs a scanned loop may store as rows of its stacked results (runtime/scan.py)
        self.row_outputs: set[tuple[int, int]] = set()
        self.store = self._new_store()
        self.exec_count = 0
        # statements the interpreter ran from Python (a region, a node, a scanned loop entry:
        # one call each); a scanned loop's iterations are not counted
        self.dispatches = 0
        self.scanned_entries = 0  # loop entries run as one lax.scan (runtime/scan.py)
        # (node, output) -> {point with None along a scanned dim: (first coordinate, rows, stacked
        # array with the rows after the batch dims)}: the rows a scanned loop stored, kept
        # stacked for slice reads (runtime/scan.py)
        self.stack_hints: dict[tuple[int, int], dict[Any, tuple[int, int, Any]]] = {}
        self._thunks: dict[int, Callable[[Point], None]] = {}
        self._iteration: Any = None  # the iteration loop's body as one call (runtime/iteration.py)
        self._run = self._compile(ast, frozenset())

    # -- public API ---------------------------------------------------------------------
    def execute(self) -> None:
        """Run the program from scratch (fresh stores and bounds)."""
        keep_freed_host_memory()
        self.store = self._new_store()
        self._env.clear()
        self._env.update(self._static)
        for db in self._dyn.values():
            db.known.clear()
            db.lbs.clear()
            db.key = None
        self._thunks.clear()  # thunks hold references to the store's tables
        self._fused.clear()
        for h in self.stack_hints.values():
            h.clear()
        self.exec_count = 0
        self.dispatches = 0
        self.donation_stats[:] = [0, 0, 0]
        if self._iteration is not None:
            self._iteration.reset()
        self._run()
        if self._iteration is not None:
            self._iteration.wait()
        log.debug("executed %d node points; %s", self.exec_count, self.store.stats())

    def _new_store(self) -> PointStore:
        be = self.backend
        budget = self.plan.options.memory_budget
        store = PointStore(
            be.nbytes,
            be.to_host,
            be.from_host,
            be.host_nbytes,
            budget=budget,
            labels={n.id: n.label for n in self.pdg} if budget is not None else None,
        )
        for n in self.pdg:
            store.declare(n.id, max(1, len(n.outputs)))
        for (nid, oid), spec in self.block_plan.items():
            store.declare_block(nid, oid, BlockTable(spec, self.backend, self.pdg.nodes[nid].label))
        for nid, oid in sorted(self.row_outputs - self.block_plan.keys()):
            store.declare_rows(nid, oid, RowsTable(self.backend.take, self.backend.nbytes))
        if getattr(self, "record_timeline", False):
            store.record_timeline()
        return store

    def memory_timeline(self) -> MemoryTimeline | None:
        """Live bytes per pool over the last run (None unless built with ``memory_timeline``)."""
        return self.store.timeline()

    def memory_stats(self, top: int = DEFAULT_TOP) -> MemoryStats:
        """Live and peak bytes held by the stores (block buffers whole, from allocation on), in
        total, per pool and for the ``top`` nodes with the largest peaks (see ``store.py``)."""
        return self.store.stats(top, {n.id: n.label for n in self.pdg})

    def value(self, node_id: int, point: Sequence[int], oid: int = 0) -> np.ndarray:
        """Output ``oid`` of node ``node_id`` at ``point`` as NumPy (only while not freed)."""
        p = tuple(int(x) for x in point)
        try:
            x = self.store.get(node_id, oid, p)
        except KeyError:
            if self.store.is_offloaded(node_id, p, oid):  # offloaded to the host pool (swapping)
                return np.array(self.store.host_value(node_id, oid, p), copy=True)
            raise KeyError(
                f"%{node_id} output {oid} has no stored value at {p} (never run or freed)"
            ) from None
        return np.array(self.backend.to_numpy(x))

    def points(self, node_id: int, oid: int = 0) -> list[Point]:
        """The points at which output ``oid`` of ``node_id`` is stored now."""
        return sorted(self.store.points(node_id, oid))

    def bound_values(self, bound: Sym) -> dict[Point, int]:
        """Values found so far for a dynamic bound, per enclosing point."""
        return dict(self._dyn[bound].known)

    # -- AST checks and compilation -----------------------------------------------------
    def _site(self, dyn: frozenset[Sym], sub: AstNode, scope: frozenset[Sym]) -> _Site | None:
        """How an AST expression site finds the values of the dynamic bounds it uses.

        For each bound ``T`` the enclosing point is read from the first ``Exec`` or ``Dealloc``
        in ``sub`` (the site's subtree) of a node with all of ``T``'s enclosing dims, when its
        coordinates for those dims only use counters in ``scope`` (``reset(c0)`` and
        ``step(c0, c1)`` inside ``for c0`` give ``i = c0`` for ``c1 < T``). Otherwise
        the current enclosing point is used (see the module doc).
        """
        if not dyn:
            return None
        allowed = scope | set(self._static)
        keys = []
        for b in sorted(dyn, key=lambda x: x.name):
            db = self._dyn[b]
            kf = None
            for st in walk(sub):
                if not isinstance(st, (Exec, *MemOp)):  # a free's point names its episode too
                    continue
                dom = self.pdg.nodes[st.node].domain
                if not set(db.enclosing) <= set(dom):
                    continue
                es = tuple(st.point[dom.index(d)] for d in db.enclosing)
                if symbols_of(es) <= allowed and not any(isinstance(x, Slice) for x in es):
                    kf = compile_exprs(es)
                    break
            keys.append((db, kf))
        return _Site(tuple(keys))

    def _bounds_at(self, site: _Site) -> tuple[Env, dict[Sym, int]]:
        """``(known values, lower bounds of the unknown ones)`` at an AST site now."""
        env = self._env
        known: Env = {}
        unknown: dict[Sym, int] = {}
        for db, kf in site.keys:
            key = kf(env) if kf is not None else db.key
            val = db.value(key)
            if val is None:
                unknown[db.sym] = db.lb(key)
            else:
                known[db.sym] = val
        return known, unknown

    def _agree(self, f: Callable[[Env], Any], site: _Site, what: Callable[[], str]) -> Any:
        """Evaluate ``f`` at an AST site; with unknown bounds, ``lb`` and ``BIG`` must agree."""
        env = self._env
        known, unknown = self._bounds_at(site)
        if not unknown:
            return f({**env, **known})
        lo = f({**env, **known, **unknown})
        hi = f({**env, **known, **{b: BIG for b in unknown}})
        if lo != hi:
            names = ", ".join(b.name for b in unknown)
            raise BoundError(
                f"the schedule needs {names} to evaluate {what()} before {names} is known "
                f"(with {names} = lower bound {list(unknown.values())}: {lo}; "
                f"with {names} unbounded: {hi}); counters: "
                f"{ {s.name: v for s, v in env.items() if s not in self._static} }"
            )
        return lo

    def _compile(self, node: AstNode, scope: frozenset[Sym]) -> Callable[[], None]:
        env = self._env
        dynamic = self._dyn
        if isinstance(node, Seq):
            fns = tuple(self._compile(c, scope) for c in node.children)

            def run_seq() -> None:
                for f in fns:
                    f()

            return run_seq
        if isinstance(node, Loop):
            return self._compile_loop(node, scope)
        if isinstance(node, If):
            cond = compile_expr(node.cond)
            site = self._site(free_symbols(node.cond) & dynamic.keys(), node, scope)
            then = self._compile(node.then, scope)
            else_ = self._compile(node.else_, scope) if node.else_ is not None else None

            def run_if() -> None:
                c = cond(env) if site is None else self._agree(cond, site, lambda: f"`if ({node.cond})`")
                if c:
                    then()
                elif else_ is not None:
                    else_()

            return run_if
        pt = compile_exprs(node.point)
        site = self._site(symbols_of(node.point) & dynamic.keys(), node, scope)
        nid = node.node
        if isinstance(node, FusedExec):
            fused, members, donate = self._fused, node.members, node.donate
            key: Any = (members, donate) if donate else members
            labels = ", ".join(self.pdg.nodes[m].label for m in members)

            def run_fused() -> None:
                self.dispatches += 1
                p = pt(env) if site is None else self._agree(pt, site, lambda: f"the point of exec {labels}")
                th = fused.get(key)
                if th is None:
                    th = fused[key] = make_fused_thunk(
                        self, [self.pdg.nodes[m] for m in members], self._fused_fns, donate
                    )
                th(p)

            return run_fused
        if isinstance(node, Exec):
            thunks = self._thunks
            label = self.pdg.nodes[nid].label

            def run_exec() -> None:
                self.dispatches += 1
                p = pt(env) if site is None else self._agree(pt, site, lambda: f"the point of exec {label}")
                th = thunks.get(nid)
                if th is None:
                    th = thunks[nid] = self._make_thunk(self.pdg.nodes[nid])
                th(p)

            return run_exec
        return self._compile_memory(node, pt, site)

    def _compile_memory(
        self, node: AstNode, pt: Callable[[Env], Any], site: _Site | None
    ) -> Callable[[], None]:
        """A ``Dealloc``, ``Offload`` or ``Fetch``: one point, or (a batched memory loop,
        ``schedule/swap.py``) ranges of points in one call to the store."""
        env, nid = self._env, node.node
        assert isinstance(node, MemOp)
        kind = {Dealloc: "free", Offload: "offload", Fetch: "fetch"}[type(node)]
        method = {Dealloc: "free_points", Offload: "offload", Fetch: "fetch"}[type(node)]
        batched = any(isinstance(c, Slice) for c in node.point)
        label = self.pdg.nodes[nid].label

        def points() -> Any:
            p = pt(env) if site is None else self._agree(pt, site, lambda: f"the point of {kind} %{nid}")
            return PointBox(tuple(p)) if batched else (p,)

        if isinstance(node, Fetch):
            outs = node.outputs

            def run_fetch() -> None:
                try:
                    self.store.fetch(nid, points(), outs)
                except KeyError as err:
                    raise RuntimeExecutionError(
                        f"internal error: the schedule fetches {label} at {err.args[0]}, which is neither "
                        "on the device nor offloaded (never computed, or freed: a swap-schedule bug)"
                    ) from None

            return run_fetch

        if isinstance(node, Dealloc) and node.outputs:
            frees = node.outputs

            def run_free() -> None:
                self.store.free_points(nid, points(), frees)

            return run_free

        def run_mem() -> None:  # the store is looked up per run (execute() makes a new one)
            getattr(self.store, method)(nid, points())

        return run_mem

    def _compile_loop(self, node: Loop, scope: frozenset[Sym]) -> Callable[[], None]:
        env = self._env
        dynamic = self._dyn
        var, inc = node.var, int(node.inc)
        init = compile_expr(node.init)
        init_site = self._site(free_symbols(node.init) & dynamic.keys(), node, scope)
        cond = compile_expr(node.cond)
        cond_site = self._site(free_symbols(node.cond) & dynamic.keys(), node, scope)
        # dynamic bounds whose SET_SYMBOL node runs inside this loop
        setters = {db.setter: b for b, db in dynamic.items()}
        found_inside = {setters[s.node] for s in walk(node.body) if isinstance(s, Exec) and s.node in setters}
        body = self._compile_body(node, scope | {var})

        def cond_value() -> bool:
            assert cond_site is not None
            known, unknown = self._bounds_at(cond_site)
            if not unknown:
                return cond({**env, **known})
            stuck = [b.name for b in unknown if b not in found_inside]
            if stuck:
                raise BoundError(
                    f"loop `for ({var} = {node.init}; {node.cond}; ...)` needs {', '.join(stuck)}, which is "
                    "unknown and is not found inside the loop (its SET_SYMBOL node never runs there)"
                )
            return cond({**env, **known, **{b: BIG for b in unknown}})

        collector = self._collector if node is self._gc_loop else None
        # the iteration loop's body as one call keeps the store lazily between calls: it runs
        # the collector itself and puts its last results in the store when the loop ends
        compiled = self._iteration if node is self.plan.iter_loop else None
        per_step = collector  # run by the loop before each step, unless the compiled body runs it
        if compiled is not None and collector is not None:
            gc, off = collector, self._gc_offset
            compiled.collector = lambda: gc.collect(self.store, env[var] + off)
            per_step = None

        def run_loop() -> None:
            if init_site is None:
                env[var] = init(env)
            else:
                env[var] = self._agree(init, init_site, lambda: f"the init of {var}")
            n, limit = 0, self.max_loop_iterations
            try:
                while cond(env) if cond_site is None else cond_value():
                    if per_step is not None:
                        per_step.collect(self.store, env[var] + self._gc_offset)
                    body()
                    env[var] += inc
                    n += 1
                    if n > limit:
                        raise RuntimeExecutionError(
                            f"loop over {var} ran more than {limit} iterations (condition `{node.cond}`); "
                            "a dynamic bound is probably never found (its done-signal never becomes true)"
                        )
            finally:
                if compiled is not None:
                    compiled.flush()
            del env[var]

        if collector is None and self.plan.scans:
            from timerl.runtime.scan import freeing_loop, scanned_loop

            scanned = scanned_loop(self, node, body, run_loop, scope) or freeing_loop(
                self, node, run_loop, scope
            )
            if scanned is not None:
                return scanned
        return run_loop

    def _compile_body(self, loop: Loop, scope: frozenset[Sym]) -> Callable[[], None]:
        """A loop's body; the iteration loop's runs as one compiled call where the plan says so
        (runtime/iteration.py)."""
        body = self._compile(loop.body, scope)
        if loop is self.plan.iter_loop and not self.plan.body:
            from timerl.runtime.iteration import CompiledIteration

            body = self._iteration = CompiledIteration(self, loop, body)
        return body

    # -- dynamic bounds -------------------------------------------------------------------
    def _activate(self, db: _DynBound, key: Point) -> None:
        db.key = key

    def _report(self, db: _DynBound, point: Point, done: bool, label: str) -> None:
        key = tuple(point[j] for j in db.set_key_idx)
        t = point[db.t_idx]
        prev = db.known.get(key)
        if done:
            if prev is not None and prev != t + 1:
                raise BoundError(
                    f"{label} ends {db.sym} at {t + 1} for {dict(zip(db.enclosing, key, strict=True))}, "
                    f"but it had already ended at {prev}"
                )
            db.known[key] = t + 1
            if db.key is None:
                db.key = key
            log.debug("dynamic bound %s = %d at %s", db.sym, t + 1, key)
        else:
            if prev is not None and t >= prev:
                raise BoundError(
                    f"{label} ran at {db.dim} = {t}, past the end {db.sym} = {prev} found before "
                    "(the schedule runs the done-signal beyond the episode)"
                )
            if db.most is not None and t + 2 > db.most:
                at = dict(zip(db.enclosing, key, strict=True))
                raise BoundError(
                    f"{label} did not end {db.sym} at {db.dim} = {t} for {at or 'the run'}: the episode runs past "
                    f"max_bounds {db.sym} <= {db.most}, which the memory_budget was checked against. "
                    f"Fix: raise max_bounds[{db.sym}], or end episodes by then (a done-signal true at "
                    f"{db.dim} = {db.most - 1})."
                )
            if db.key is None:
                db.key = key
            db.lbs[key] = max(db.lb(key), t + 2)

    def _node_expr(
        self, es: Sequence[Expr | Slice], node: Node, as_tuple: bool = True
    ) -> Callable[[Env], Any]:
        """Compile expressions evaluated at a node's point (``phi``, conds, ``select``).

        A dynamic bound missing from the point env (not found yet for that enclosing
        point) is handled like in the AST: evaluate with ``lb`` and ``BIG``, which must
        agree (``r[t:min(t + n, T)]`` while acting, once ``t + n <= lb``).
        """
        f = compile_exprs(es, as_tuple)
        dyn = tuple(s for s in symbols_of(es) if s in self._dyn)
        if not dyn:
            return f

        def ev(v: Env) -> Any:
            unknown = [b for b in dyn if b not in v]
            if not unknown:
                return f(v)
            lbs = {}
            for b in unknown:
                db = self._dyn[b]
                key = tuple(v.get(d, -1) for d in db.enclosing)
                lbs[b] = db.lb(key)
            lo, hi = f({**v, **lbs}), f({**v, **{b: BIG for b in unknown}})
            if lo != hi:
                names = ", ".join(b.name for b in unknown)
                here = point_dict(node.domain, tuple(v[d] for d in node.domain))
                exprs = ", ".join(map(str, es))
                raise BoundError(
                    f"{node.label} at {here} needs {names} to evaluate `{exprs}` before {names} is known "
                    f"(lower bound {list(lbs.values())}): the schedule runs it too early"
                )
            return lo

        return ev

    # -- node thunks ----------------------------------------------------------------------
    def _point_env_fns(self, node: Node) -> tuple[Callable[[Point], Env], Callable[[Point], None] | None]:
        """``(point_env, enter)`` for a node: the symbol values at a point (static bounds,
        the point's coordinates, known dynamic bounds), and the function that moves the
        current enclosing point of dynamic bounds forward (``None`` if the node has none)."""
        domain = node.domain
        static = self._static
        dom = set(domain)
        # dynamic bounds: per-point values (node has the enclosing dims) or the AST's current
        local = [
            (db, tuple(domain.index(d) for d in db.enclosing))
            for db in self._dyn.values()
            if set(db.enclosing) <= dom
        ]
        other = tuple(db for db in self._dyn.values() if not set(db.enclosing) <= dom)
        # op attributes using a bound that a window makes known before the episode ends
        # (``expand(min(t + n, T) - t)``, run n - 1 steps later by the schedule): an unknown
        # bound takes its lower bound when that gives every attribute its value for any T
        attr_exprs = _dyn_attr_exprs(node, frozenset(db.sym for db, _ in local))
        windowed = [(db, idx) for db, idx in local if db.sym in attr_exprs]

        def point_env(point: Point) -> Env:
            v = dict(static)
            v.update(zip(domain, point, strict=True))
            for db, idx in local:
                val = db.known.get(tuple(point[j] for j in idx))
                if val is not None:
                    v[db.sym] = val
            for db, idx in windowed:
                if db.sym not in v:
                    lb = db.lb(tuple(point[j] for j in idx))
                    if all(f({**v, db.sym: lb}) == f({**v, db.sym: BIG}) for f in attr_exprs[db.sym]):
                        v[db.sym] = lb
            for db in other:  # the node lacks T's enclosing dims: the current episode's T
                val = db.value(db.key)
                if val is not None:
                    v[db.sym] = val
            return v

        def enter(point: Point) -> None:  # move the current enclosing point forward
            for db, idx in local:
                key = tuple(point[j] for j in idx)
                if db.key is None or key > db.key:
                    self._activate(db, key)

        return point_env, (enter if local else None)

    def _make_thunk(self, node: Node) -> Callable[[Point], None]:
        """``thunk(point)``: gather inputs, run the op, store the outputs."""
        be, store = self.backend, self.store
        nid, domain, batch, op = node.id, node.domain, tuple(node.batch), node.op
        padb = is_padded(batch)  # an axis padded to bucket(T): resolved per episode
        kind = op.kind
        point_env, enter = self._point_env_fns(node)
        edges = self.pdg.data_in_edges(nid)
        inputs = [self._make_input(node, e) for e in edges]
        gathers = [g for g, _ in inputs]
        flags = tuple(b for _, b in inputs)
        put = store.put

        def where(point: Point) -> str:
            return f"{node.label} at {point_dict(domain, point)}"

        if kind is OpKind.MERGE:
            # a branch from an unbatched source is broadcast to the node's batch
            branches = [
                (self._node_expr((e.cond,), node, False), g, bool(batch) and not b, self._mover(node, e))
                for e, g, b in zip(edges, gathers, flags, strict=True)
            ]

            def compute(v: Env, point: Point) -> None:
                for c, g, bcast, move in branches:
                    if c(v):
                        x = g(v)
                        if bcast:
                            x = be.broadcast_batch(x, resolve_batch(batch, v) if padb else batch)
                        put(nid, 0, point, x)
                        if move is not None:
                            move(v)
                        return
                raise RuntimeExecutionError(
                    f"{where(point)}: no branch of this branching definition covers the point"
                )

        elif kind is OpKind.EVAL_SYMBOL:
            f = self._node_expr((op.attr("expr"),), node, False)
            dt = op.attr("dtype").numpy

            def compute(v: Env, point: Point) -> None:
                ctx = tracing.current
                if ctx is None:
                    x = be.from_numpy(np.asarray(f(v), dtype=dt))
                else:  # a compiled iteration: the value at the iteration the call runs
                    x = ctx.host_value(lambda d: f(point_env(ctx.shift(nid, point, d))), np.shape(f(v)), dt)
                put(nid, 0, point, be.broadcast_batch(x, batch) if batch else x)

        elif kind is OpKind.SET_SYMBOL:
            db = self._dyn[op.attr("bound")]
            g0 = gathers[0]
            has_out = bool(node.outputs)

            def compute(v: Env, point: Point) -> None:
                if tracing.current is not None:
                    raise tracing.NotTraceable(f"{node.label} sets the dynamic bound {db.sym}")
                x = g0(v)
                self._report(db, point, be.all_true(x), node.label)
                if has_out:
                    put(nid, 0, point, x)

        elif kind is OpKind.UDF:
            fn = op.attr("fn")
            make_pure = getattr(fn, "pure_step", None)
            pure = make_pure() if make_pure is not None else None
            dtypes = [spec.dtype.numpy for spec in node.outputs]

            def compute(v: Env, point: Point) -> None:
                if tracing.current is None:
                    outs = call_udf(node, fn, [g(v) for g in gathers], point_dict(domain, point), be)
                elif pure is None:
                    raise tracing.NotTraceable(f"the UDF {node.label} has no pure form")
                else:  # a compiled iteration: the pure form, as a scan runs it
                    st, outs = pure.step(pure.get_state(), [g(v) for g in gathers])
                    pure.set_state(st)
                    outs = [o.astype(dt) for o, dt in zip(outs, dtypes, strict=True)]
                for k, x in enumerate(outs):
                    put(nid, k, point, x)

        elif kind is OpKind.SINK:
            fn = op.attr("fn")

            def call(x: np.ndarray, point: Point) -> None:
                pd = point_dict(domain, point)
                try:
                    fn(x, pd)
                except Exception as exc:
                    raise user_code_error("sink", node, exc, pd) from exc

            def compute(v: Env, point: Point) -> None:
                ctx = tracing.current
                if ctx is None:
                    call(np.array(be.to_numpy(gathers[0](v))), point)
                else:  # a compiled iteration: called back with the value and the point moved on
                    ctx.sink(lambda x, d: call(x, ctx.shift(nid, point, d)), gathers[0](v))

        elif kind in (OpKind.RAND_UNIFORM, OpKind.RAND_NORMAL) and op.attr("point_dims", ()):
            seed, order = self.seeds, [s for s, _ in self.pdg.dims]

            def compute(v: Env, point: Point) -> None:
                ctx = tracing.current
                seeds = None
                if ctx is not None:  # a compiled iteration: the seeds of the iteration it runs
                    n = int(
                        np.prod([int(x) for x in node.batch[len(node.batch) - len(op.attr("point_dims")) :]])
                    )
                    j = ctx.ipos.get(nid)
                    dim = node.domain[j] if j is not None else None
                    seeds = ctx.host_value(
                        lambda d: draw_seeds(node, seed, ctx.shift(nid, point, d), order),
                        (n,),
                        np.int32,
                        many=lambda ds: draw_seeds_shifted(node, seed, point, order, dim, ds),
                    )
                put(nid, 0, point, draw_points(be, node, seed, point, order, v, seeds))

        else:
            run, seeds = be.run, self.seeds
            rand = kind in (OpKind.RAND_UNIFORM, OpKind.RAND_NORMAL)

            def compute(v: Env, point: Point) -> None:
                ins = [g(v) for g in gathers]
                if rand:
                    ctx = tracing.current
                    if ctx is None:
                        be.seed(seeds.point_seed(node, point))
                    else:  # a compiled iteration: the seed of the iteration it runs
                        be.seed(
                            ctx.host_value(
                                lambda d: seeds.point_seed(node, ctx.shift(nid, point, d)), (), np.int32
                            )
                        )
                try:
                    out = run(op, ins, resolve_batch(batch, v) if padb else batch, flags, v)
                except BackendError as exc:
                    raise BackendError(f"{exc}\n  while running {where(point)}") from exc
                except TimeRLError:
                    raise
                except Exception as exc:
                    raise RuntimeExecutionError(
                        f"{where(point)} failed: {type(exc).__name__}: {exc}"
                    ) from exc
                put(nid, 0, point, out)

        def thunk(point: Point) -> None:
            self.exec_count += 1
            if enter is not None:
                enter(point)
            compute(point_env(point), point)

        return thunk

    def _mover(self, node: Node, e: Edge) -> Callable[[Env], None] | None:
        """For a merge branch in the plan's ``merge_moves`` (the merge is the only statement
        reading its source from the store, and reads each source point once): free the point
        the branch read, where the source is kept in a plain dict table."""
        if (node.id, e.iid) not in self.merge_moves or type(self.store.table(e.src, e.oid)) is not dict:
            return None
        phi, free, src = self._node_expr(e.phi, node), self.store.free, e.src

        def move(v: Env) -> None:
            free(src, phi(v))

        return move

    def _make_input(self, node: Node, e: Edge) -> tuple[Callable[[Env], Any], bool]:
        """``(gather, batched)``: input ``e.iid`` of ``node`` in the layout its op expects
        (see :mod:`~timerl.plan.layout`), and whether it carries the node's batch dims."""
        layout = input_layout(self.pdg.nodes[e.src], node, e)
        g = self._make_gather(node, e)
        adapt = layout.compile(self.backend)
        if adapt is None:
            return g, layout.batched

        def gather_adapted(v: Env) -> Any:
            return adapt(g(v), v)

        return gather_adapted, layout.batched

    def _make_gather(self, node: Node, e: Edge) -> Callable[[Env], Any]:
        """``gather(env) -> tensor``: input ``e.iid`` of ``node`` at the point in ``env``."""
        be = self.backend
        src = self.pdg.nodes[e.src]
        tab = self.store.table(e.src, e.oid)
        nb = len(src.batch)
        phi = self._node_expr(e.phi, node)
        slices = [k for k, c in enumerate(e.phi) if isinstance(c, Slice)]

        def missing(q: Point, v: Env) -> RuntimeExecutionError:
            here = point_dict(node.domain, tuple(v[s] for s in node.domain))
            if self.store.is_offloaded(e.src, q, e.oid):
                return RuntimeExecutionError(
                    f"internal error: {node.label} at {here} reads {src.label} at {q}, which is offloaded to "
                    "the host pool and was not fetched back (a swap-schedule bug; compile with swap=False "
                    "to run without swapping)"
                )
            return RuntimeExecutionError(
                f"{node.label} at {here} reads {src.label} at {q}, which was not computed yet "
                "or was already freed (a schedule or deallocation bug)"
            )

        if not slices and e.select is None:

            def gather_point(v: Env) -> Any:
                q = phi(v)
                try:
                    return tab[q]
                except KeyError:
                    raise missing(q, v) from None

            return gather_point

        sel = self._node_expr((e.select,), node, False) if e.select is not None else None
        spec = src.outputs[e.oid]
        pad = be.static_shapes and len(slices) == 1 and e.to_batch is None and _zero_pad_safe(node)
        # stacked rows 0:T of a batch axis padded to bucket(T) (vectorize_partial, dynamic T)
        pad = pad or pads_to_bucket(node, e)
        if isinstance(tab, BlockTable) and slice_axis(e) == tab.spec.axis:
            return self._make_block_gather(node, e, tab, phi, pad, missing)

        def fetch(q: Point, v: Env, s: int | None) -> Any:
            try:
                x = tab[q]
            except KeyError:
                raise missing(q, v) from None
            if sel is not None:
                if s is not None:
                    v[SLICE_VAR] = s
                x = be.take(x, nb, int(sel(v)))
            return x

        def build(comps: tuple[Any, ...], k: int, prefix: tuple[int, ...], v: Env, s: int | None) -> Any:
            while k < len(comps) and not isinstance(comps[k], range):
                prefix += (comps[k],)
                k += 1
            if k == len(comps):
                return fetch(prefix, v, s)
            xs = [build(comps, k + 1, prefix + (c,), v, c) for c in comps[k]]
            if pad:
                return be.stack_padded(xs, nb, 1 << (len(xs) - 1).bit_length())
            return be.stack(xs, nb)

        hints = self.stack_hints.setdefault((e.src, e.oid), {}) if sel is None else None
        single = slices[0] if len(slices) == 1 else None

        def gather_slices(v: Env) -> Any:
            comps = phi(v)
            if any(len(comps[k]) == 0 for k in slices):
                return _empty(be, src, spec, comps, slices, sel is not None, v)
            if hints and single is not None:
                n = len(comps[single])
                hit = _stacked_hint(be, hints, comps, single, nb, 1 << (n - 1).bit_length() if pad else n)
                if hit is not None:
                    return hit
            return build(comps, 0, (), v, None)

        return gather_slices

    def _make_block_gather(
        self,
        node: Node,
        e: Edge,
        tab: BlockTable,
        phi: Callable[[Env], Any],
        pad: bool,
        missing: Callable[[Point, Env], RuntimeExecutionError],
    ) -> Callable[[Env], Any]:
        """A slice read along a block-stored tensor's block dim: one ``rows`` call on its buffer."""
        be, src = self.backend, self.pdg.nodes[e.src]
        k = tab.spec.axis
        spec = src.outputs[e.oid]
        nb = len(src.batch)
        rows = tab.rows

        def gather_block(v: Env) -> Any:
            comps = phi(v)
            r = comps[k]
            n = len(r)
            if n == 0:
                return _empty(be, src, spec, comps, [k], False, v)
            key = comps[:k] + comps[k + 1 :]
            try:
                x = rows(key, r.start, r.stop, 1 << (n - 1).bit_length() if pad else n)
            except KeyError as err:
                raise missing(err.args[0], v) from None
            if x is None:  # the table fell back to point storage
                try:
                    xs = [tab[comps[:k] + (c,) + comps[k + 1 :]] for c in r]
                except KeyError as err:
                    raise missing(err.args[0], v) from None
                return be.stack_padded(xs, nb, 1 << (n - 1).bit_length()) if pad else be.stack(xs, nb)
            return x

        return gather_block


def _stacked_hint(
    be: AbstractBackend, hints: dict[Any, Any], comps: tuple[Any, ...], k: int, nb: int, size: int
) -> Any:
    """The stack of the points ``comps`` (one range at ``k``), zero-padded to ``size`` rows,
    from a stacked array a scanned loop left (:mod:`~timerl.runtime.scan`), or None: the same
    values as stacking the points."""
    r = comps[k]
    hit = hints.get(comps[:k] + (None,) + comps[k + 1 :])
    if hit is None or r.step != 1:
        return None
    c0, n, arr = hit
    if not (c0 <= r.start and r.stop <= c0 + n):
        return None
    if not hasattr(arr, "shape"):  # rows joined on first use (runtime/scan.py)
        arr = arr.full()
        hints[comps[:k] + (None,) + comps[k + 1 :]] = (c0, n, arr)
    if size > len(r):
        return be.restack_padded(arr, r.start - c0, r.stop - c0, nb, size)
    return be.restack(arr, r.start - c0, r.stop - c0, nb)


def _zero_pad_safe(node: Node) -> bool:
    """Whether zero-padding the per-point dim 0 of the input leaves the output unchanged.

    Backends that compile per shape (``static_shapes``) then see power-of-two lengths of
    ``r[t:T]``-style reads instead of one new shape per length.
    """
    kind = node.op.kind
    if kind is OpKind.DISCOUNTED_SUM:
        return True
    if kind is OpKind.SUM:
        dims = node.op.attr("dims")
        return 0 in ((dims,) if isinstance(dims, int) else tuple(dims))
    return False


def _empty(
    be: AbstractBackend, src: Node, spec: Any, comps: tuple[Any, ...], slices: list[int], sel: bool, v: Env
) -> Any:
    """The zero-size tensor read by an empty slice (per-point shape from the source spec)."""
    shape = eval_shape(spec.shape, v, src)
    if sel:
        shape = shape[1:]
    return be.zeros(
        resolve_batch(tuple(src.batch), v) + tuple(len(comps[k]) for k in slices) + shape, spec.dtype
    )
