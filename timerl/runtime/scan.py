"""A loop whose body has no host effect runs as one call: one compiled ``lax.scan`` on JAX,
one Python loop over the statements' prepared kernels on Torch (``_build_host``); a loop
over a dynamic bound runs in chunks of such calls (below).

TimeRL's interpreter dispatches every statement of a loop body once per iteration. PPO's
acting loop on a JAX-native environment (gymnax, brax) is three statements per step — the
observation's branching definition, the fused policy region and the environment step — so
a 250-step rollout costs 750 dispatches and their bookkeeping. When every statement of a
loop body is traceable, the whole loop is one ``jax.jit``-compiled ``lax.scan`` instead
(TimeRL's future work, §9: "a loop whose body has no host effect"):

* **Members** are the body's ``Exec`` nodes in order: pure ops (the ones fused regions
  take: no symbolic attributes), ``MERGE`` nodes, and UDFs that offer a pure form
  (``fn.pure_step()``, see :class:`PureStep`: the environment's state threaded through
  the scan's carry). A body with a sink, a nested loop or an ``If``, or a member whose point
  or reads depend on a dynamic bound, is not scanned (the plan says why: ``plan/scans.py``, logged at INFO) and runs as before. The body's frees
  (``Dealloc``) run after the scan, for every scanned iteration in order.
* **Inputs** of a member are, per edge: an earlier member at the same point (a value
  inside the step), a member at the previous iteration (the scan's carry, e.g.
  ``o[t + 1] = step(...)[t]``), a value from outside the loop that does not change along
  it (passed once), or one that does (gathered per iteration before the scan and stacked
  as the scanned input).
* **Branches**: a ``MERGE`` must take the same branch at every scanned iteration. Where
  only the first iteration differs, and there only ``MERGE`` members whose branch reads a
  value the store holds before the loop while their later branch reads the carry
  (``o[i, 0] = reset`` or ``o[i - 1, T]``, ``o[t + 1] = step(...)[t]``), that value is the
  carry's first value and the scan starts at the first iteration (:meth:`ScannedLoop._first_values`). Otherwise the first iterations
  that take another branch run through the interpreter first (peeled); the scan starts after
  them.
* **Outputs** read after the loop (or by a branch the scan does not take) are stacked by
  the scan, with the rows after the batch dims (the layout the interpreter gives a stack of
  points), and recorded per point as rows of that array
  (:class:`~timerl.runtime.rows_table.RowsTable`: a row is copied out only when a point read
  needs it), so every other statement and the reference checks see the same store; slice
  reads of a whole entry's rows take the stacked array itself (``Executor.stack_hints``).

* **Random draws** are members too: their seeds at every iteration (those the interpreter
  seeds them with at their points) are one more scanned input, the draw made inside the step.
* **Dynamic bounds**: a loop ``for (t = 0; t < T; ...)`` whose ``T`` is found inside it (its
  ``SET_SYMBOL`` member: ``T = t + 1`` at the first step whose done-signal holds) runs in
  chunks (:meth:`ScannedLoop._run_dynamic`). A chunk is one ``lax.while_loop`` over up to a
  bucket of iterations (:data:`CHUNKS`: the smallest that holds the loop's previous entry,
  the next one for each further chunk of an entry) that stops after the step whose done-signal holds; its
  outputs are buffers of the bucket's length whose rows after the last step are never read
  (:class:`~timerl.runtime.rows_table.RowsTable` records the rows that ran). Per chunk the
  host reads one count and one flag; each bucket length compiles once. Branch conditions
  that use ``T`` are evaluated as the interpreter does (at ``T``'s lower bound and
  unbounded, which must agree); ``max_bounds`` caps a chunk so the step past the bound runs
  through the interpreter and raises there. A loop whose ``T`` is already known at entry
  (learning after acting) is scanned as a static loop. Torch's host loop stops at the same
  step.

Values are those of the interpreted loop: the same ops on the same inputs, with XLA free
to fuse across the statements (float results may differ in the last bits where XLA
reorders, as in fused regions; Torch's host loop runs the very kernels the interpreter
would one by one, where the interpreter runs a fused region's kernels, and a GEMM over the
rows it stacks may round differently in the last bit: in REINFORCE on gymnax, 16 envs, the
weights differ by ~1e-8 from the second iteration, the episodes stay the same for ~35
iterations, then the differences grow). The switch is
``CompileOptions.scan_loops``.

**Torch** (``AbstractBackend.scans == "host"``): what a scan saves there is the
interpreter's work per statement and iteration (gathers, store puts and frees, point
environments); the kernels still run one by one. A UDF's pure form (a JAX env's step) is
called eagerly with NumPy views of the actions and its outputs imported through DLPack.
``torch.compile`` of the loop body is not used: on the 2-core CPU inductor took 27 s to
compile PPO's actor (512 x 4 -> 64 -> 64 -> 2) and ran it in 512 us against 425 us eager.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import compress
from typing import TYPE_CHECKING, Any

import numpy as np

from timerl.errors import RuntimeExecutionError, TimeRLError
from timerl.pdg.ir import Edge, Node
from timerl.pdg.ops import OpKind
from timerl.plan.fusable import fusable
from timerl.plan.scans import flat, frees_only, scan_members
from timerl.runtime import host_loop, tracing
from timerl.runtime.points import PointRows, member_mask
from timerl.schedule.ast import AstNode, Dealloc, Exec, If, Loop, Seq
from timerl.symbolic import TRUE, Expr, Slice, Sym, evaluate, free_symbols, lift, substitute
from timerl.symbolic.compile import compile_exprs_elementwise
from timerl.symbolic.expr import Not
from timerl.symbolic.simplify import affine_difference, affine_in

if TYPE_CHECKING:
    from timerl.runtime.interpreter import Executor

log = logging.getLogger(__name__)
_RANDOM = (OpKind.RAND_UNIFORM, OpKind.RAND_NORMAL)
CHUNKS = (16, 64, 256, 1024)
"""The lengths of the chunks a loop over a dynamic bound runs in (each compiles once): the
first of an entry the smallest that holds the loop's previous entry, then the next ones."""


@dataclass(frozen=True)
class PureStep:
    """The pure form of a stateful UDF: ``step(state, inputs) -> (state, outputs)`` traceable
    by JAX, with ``get_state()`` / ``set_state(state)`` to move the live state in and out."""

    get_state: Callable[[], Any]
    set_state: Callable[[Any], None]
    step: Callable[[Any, list[Any]], tuple[Any, list[Any]]]


@dataclass
class _Member:
    node: Node
    point: Callable[[dict[Sym, int]], tuple[int, ...]]
    edges: list[Edge]
    inputs: list[tuple[Callable[[dict[Sym, int]], Any], bool]]  # interpreter gathers
    varies: list[bool]  # per edge: whether its read point moves with the loop variable
    penv: Callable[[tuple[int, ...]], dict[Sym, int]]
    moving: set[Sym]
    pure: PureStep | None = None
    branch_conds: list[Callable[[dict[Sym, int]], Any]] | None = None
    # the point (and a MERGE's branch conditions) for every iteration at once (NumPy arrays of
    # the loop variable); None where a condition needs a dynamic bound
    vpoint: Callable[[dict[Sym, Any]], tuple[Any, ...]] | None = None
    vconds: Callable[[dict[Sym, Any]], tuple[Any, ...]] | None = None
    point_exprs: tuple[Expr | Slice, ...] = ()  # the point, in the loop variables
    # per edge: whether it reads a member at this member's own point at every loop entry
    own_point: list[bool] = field(default_factory=list)
    # one coordinate of the point is ``k * var + c`` with ``k != 0``: distinct every iteration
    distinct: bool = False
    # a MERGE's branch conditions elementwise where they use the loop's dynamic bound
    dconds: Callable[[dict[Sym, Any]], tuple[Any, ...]] | None = None
    pure_jit: Any = None  # ``pure.step`` jitted, for a host loop (``_host_pure_step``)
    enter: Callable[[tuple[int, ...]], None] | None = None  # moves a dynamic bound's current episode


class ScannedLoop:
    """Runs one AST loop as a ``lax.scan`` when it can at this entry, else as before."""

    def __init__(
        self,
        ex: Executor,
        loop: Loop,
        execs: list[Exec],
        body: Callable[[], None],
        fallback: Callable[[], None],
        scope: frozenset[Sym] = frozenset(),
    ) -> None:
        from timerl.symbolic.compile import compile_expr, compile_exprs

        self.ex, self.loop, self.body, self.fallback = ex, loop, body, fallback
        self.var = loop.var
        self.init, self.cond, self.inc = compile_expr(loop.init), compile_expr(loop.cond), int(loop.inc)
        try:  # the condition for many values of the loop variable at once (``_values``)
            self._vcond: Callable[[Mapping[Sym, Any]], tuple[Any, ...]] | None = compile_exprs_elementwise(
                [loop.cond]
            )
        except (NotImplementedError, KeyError, TypeError, ValueError):
            self._vcond = None
        self.members: list[_Member] = []
        self.index = {c.node: k for k, c in enumerate(execs)}
        for c in execs:
            n = ex.pdg.nodes[c.node]
            edges = list(ex.pdg.data_in_edges(n.id))
            pt_exprs = c.point
            moving = {s for s, e in zip(n.domain, pt_exprs, strict=True) if self.var in free_symbols(e)}
            varies = [_edge_varies(e, moving) for e in edges]
            steps = [affine_in(e, self.var) for e in pt_exprs if not isinstance(e, Slice)]
            m = _Member(
                n,
                compile_exprs(pt_exprs),
                edges,
                [ex._make_input(n, e) for e in edges],
                varies,
                ex._point_env_fns(n)[0],
                moving,
                point_exprs=tuple(pt_exprs),
                distinct=any(a is not None and a[0] != 0 for a in steps),
            )
            if n.op.kind is OpKind.UDF:
                pure_step = getattr(n.op.attr("fn"), "pure_step", None)
                m.pure = pure_step() if pure_step is not None else None  # None: a host loop calls it
            if n.op.kind is OpKind.MERGE:
                m.branch_conds = [ex._node_expr((e.cond,), n, False) for e in edges]
                if not any(free_symbols(e.cond) & ex._dyn.keys() for e in edges):
                    m.vconds = compile_exprs_elementwise([e.cond for e in edges])
                else:
                    try:
                        m.dconds = compile_exprs_elementwise([e.cond for e in edges])
                    except (NotImplementedError, KeyError, TypeError, ValueError):
                        m.dconds = None
            m.enter = ex._point_env_fns(n)[1]
            if not any(isinstance(x, Slice) or free_symbols(x) & ex._dyn.keys() for x in pt_exprs):
                m.vpoint = compile_exprs_elementwise(pt_exprs)
            self.members.append(m)
            ex.row_outputs.update((n.id, oid) for oid in range(len(n.outputs)))
            for e in ex.pdg.out_edges(n.id):  # slice reads take the stacked rows (``_hint``),
                if e.select is None and any(isinstance(c, Slice) for c in e.phi):  # first entry too
                    ex.stack_hints.setdefault((n.id, e.oid), {})
        for m in self.members:
            m.own_point = [e.src in self.index and self._reads_own_point(m, e) for e in m.edges]
        body_nodes = flat(loop.body)
        inner = scope | {loop.var}
        self.frees = [ex._compile(c, inner) for c in body_nodes if frees_only(c)]
        # the same frees for every scanned iteration at once, where their points and
        # conditions evaluate elementwise (else None: replayed per iteration)
        self.range_frees = _range_frees([c for c in body_nodes if frees_only(c)], ex)
        self._compiled: dict[Any, Callable[..., Any]] = {}
        self._row_fns: dict[Expr, Callable[..., Any]] = {}  # _rows_read's compiled row expressions
        self._warned = False
        self._broken: str | None = None
        self._peel_first = False  # the scan with the first iteration's values failed: peel it
        self._store = ex.store
        # a loop over a dynamic bound (``t < T``): its end, the member that finds it, and the
        # first chunk's length (the bucket of the previous entry's length)
        self.ends = frozenset(free_symbols(loop.cond) & ex._dyn.keys())
        self.cond_site = ex._site(self.ends, loop, scope) if self.ends else None
        self.setter = next(
            (k for k, m in enumerate(self.members) if m.node.op.kind is OpKind.SET_SYMBOL), None
        )
        self._bucket = CHUNKS[0]

    def _fresh_inputs(self) -> None:
        """Gathers read the store's tables: remake them for a new run's store."""
        if self._store is self.ex.store:
            return
        self._store = self.ex.store
        for m in self.members:
            m.inputs = [self.ex._make_input(m.node, e) for e in m.edges]

    # -- one loop entry --------------------------------------------------------------------
    def __call__(self) -> None:
        ex, env, var = self.ex, self.ex._env, self.var
        if self.ends:
            assert self.cond_site is not None
            known, unknown = ex._bounds_at(self.cond_site)
            if unknown or self.setter is not None:
                if tracing.current is not None:
                    raise tracing.NotTraceable(f"the loop over {var} ends at a dynamic bound found inside it")
                self._fresh_inputs()
                if unknown and self.setter is not None and self._broken is None:
                    self._run_dynamic(unknown)
                else:  # the interpreter's loop (an unknown bound it cannot find raises there)
                    self.fallback()
                return
            vals = self._values({**env, **known})
        else:
            vals = self._values(env)
        self._fresh_inputs()
        plan = self._plan(vals) if self._broken is None else self._broken
        if isinstance(plan, str):
            if tracing.current is not None:  # a compiled iteration: no statement-by-statement loop
                raise tracing.NotTraceable(f"the loop over {var} runs statement by statement here: {plan}")
            if not self._warned:
                log.debug("loop over %s runs statement by statement: %s", var, plan)
                self._warned = True
            self.fallback()
            return
        start, stop, choice, kinds = plan
        first: dict[tuple[int, int], Any] = {}
        if start == 1 and not self._peel_first:  # the first iteration's branch as the carry's first value
            entered = self._first_values(vals[:stop], choice)
            if entered is not None:
                (first, kinds), start = entered, 0
        for v in vals[:start]:  # peeled iterations (other branches)
            env[var] = v
            self.body()
        env.pop(var, None)
        try:
            self._scan(vals[:start], vals[start:stop], choice, kinds, first, vals[stop:])
        except TimeRLError:
            raise
        except Exception as exc:
            if first and ex.backend.scans == "compiled":  # nothing ran: peel the first iteration
                self._peel_first = True
                log.debug(
                    "loop over %s: its first iteration is peeled (%s: %s)", var, type(exc).__name__, exc
                )
                self()
                return
            # tracing or compiling the scan failed: say so, run as before
            # a host loop ran its UDFs (no second run of them); a compiled iteration's trace fails
            if ex.backend.scans != "compiled" or tracing.current is not None:
                raise
            self._break(exc, "as one scan")
            for v in vals[start:]:
                env[var] = v
                self.body()
            env.pop(var, None)
            return
        ex.scanned_entries += 1
        ex.dispatches += 1

    # -- a loop over a dynamic bound, in chunks ------------------------------------------------
    def _run_dynamic(self, unknown: Mapping[Sym, int]) -> None:
        """The loop from its start until the member that finds its bound ends it: chunks of
        iterations, each one compiled ``lax.while_loop`` (a host loop on Torch) that stops
        after the step whose done-signal holds. Chunks double from the bucket of the previous
        entry's length (each length compiles once); where a chunk cannot be planned the rest
        runs statement by statement, as the interpreter would."""
        ex, env, var = self.ex, self.ex._env, self.var
        setter = self.members[self.setter]  # type: ignore[index]
        db = ex._dyn[setter.node.op.attr("bound")]
        v, ran, size, chunks = self.init(env), 0, self._bucket, 0
        limit, inc = ex.max_loop_iterations, self.inc
        while True:
            unknown = ex._bounds_at(self.cond_site)[1]  # type: ignore[arg-type]  # lower bounds now
            if db.most is not None:  # never past the user's bound inside a chunk: the rest raises
                t0 = self._point_env(setter, v)[0][db.t_idx]
                size = min(size, db.most - 1 - t0)
            vals = self._while_unbounded(v, size, unknown) if size >= 2 and self._broken is None else []
            if len(vals) < 2:
                ran += self._rest(v)
                break
            plan = self._plan_chunk(vals, unknown)
            if isinstance(plan, str):
                if not self._warned:
                    log.debug("loop over %s runs statement by statement from %s = %d: %s", var, var, v, plan)
                    self._warned = True
                ran += self._rest(v)
                break
            start, choice, kinds = plan
            first: dict[tuple[int, int], Any] = {}
            if start == 1 and not self._peel_first:
                entered = self._first_values(vals, choice)
                if entered is not None:
                    (first, kinds), start = entered, 0
            found = False
            for u in vals[:start]:  # peeled iterations (other branches)
                env[var] = u
                self.body()
                ran += 1
                v = u + 1
                found = not ex._bounds_at(self.cond_site)[1]  # type: ignore[arg-type]
                if found:
                    break
            env.pop(var, None)
            if found:  # a peeled iteration ended the loop
                ran += self._rest(v)
                break
            try:
                n, done = self._scan(
                    vals[:start],
                    vals[start:],
                    choice,
                    kinds,
                    first,
                    (),
                    setter=self.setter,
                    extend=chunks > 0,
                )
            except TimeRLError:
                raise
            except Exception as exc:
                if (
                    first and ex.backend.scans == "compiled"
                ):  # nothing ran: peel the first iteration next time
                    self._peel_first = True
                    continue
                if ex.backend.scans != "compiled":
                    raise
                self._break(exc, "in chunks")
                ran += self._rest(vals[start])
                break
            ex.scanned_entries += 1
            ex.dispatches += 1
            chunks += 1
            ran += n
            v = vals[start] + n * inc
            if done or len(vals) < size:  # the rest (the condition may go on once the bound is known)
                ran += self._rest(v)
                break
            size = next((c for c in CHUNKS if c > size), CHUNKS[-1])
            if ran > limit:
                raise self._too_many(limit)
        self._bucket = next((c for c in CHUNKS if c >= ran), CHUNKS[-1])

    def _break(self, exc: Exception, how: str) -> None:
        """Run this loop statement by statement from now on, and say why (a failed trace or
        compile)."""
        self._broken = f"the scan failed before ({type(exc).__name__})"
        log.warning(
            "loop over %s [%s] failed to run %s (%s: %s); running it statement by statement (slower)",
            self.var,
            ", ".join(m.node.label for m in self.members),
            how,
            type(exc).__name__,
            exc,
        )

    def _too_many(self, limit: int) -> RuntimeExecutionError:
        return RuntimeExecutionError(
            f"loop over {self.var} ran more than {limit} iterations (condition `{self.loop.cond}`); "
            "a dynamic bound is probably never found (its done-signal never becomes true)"
        )

    def _while_unbounded(self, v: int, size: int, unknown: Mapping[Sym, int]) -> list[int]:
        """Up to ``size`` values of the loop variable from ``v`` while the loop's condition
        holds with its unknown bound unbounded (``t <= min(1, T - 1)`` stops after two)."""
        from timerl.runtime.interpreter import BIG

        arr = v + self.inc * np.arange(size, dtype=np.int64)
        env = {**self.ex._env, **{b: BIG for b in unknown}}
        if self._vcond is not None:
            (ok,) = self._vcond({**env, self.var: arr})
            ok = np.broadcast_to(np.asarray(ok, dtype=bool), arr.shape)
        else:
            ok = np.asarray([bool(self.cond({**env, self.var: int(u)})) for u in arr])
        bad = np.flatnonzero(~ok)
        return arr[: int(bad[0]) if bad.size else size].tolist()

    def _rest(self, v: int) -> int:
        """The iterations from ``v`` on, statement by statement while the loop's condition
        holds (an unknown bound unbounded, as the interpreter's loop); how many ran."""
        from timerl.runtime.interpreter import BIG

        ex, env, var = self.ex, self.ex._env, self.var
        n, limit = 0, ex.max_loop_iterations
        while True:
            known, unknown = ex._bounds_at(self.cond_site)  # type: ignore[arg-type]
            if not self.cond({**env, var: v, **known, **{b: BIG for b in unknown}}):
                break
            env[var] = v
            self.body()
            v += self.inc
            n += 1
            if n > limit:
                raise self._too_many(limit)
        env.pop(var, None)
        return n

    def _plan_chunk(
        self, vals: list[int], unknown: Mapping[Sym, int]
    ) -> str | tuple[int, list[int | None], list[list[str]]]:
        """:meth:`_plan_head` for a chunk of a loop whose bound is not known yet: a branch
        condition that uses it is evaluated at every iteration ``v`` with the bound at its
        lower bound then (``v + 1``: the loop reached ``v``) and unbounded, which must agree
        (else the interpreter's loop decides, and raises where they truly differ)."""
        from timerl.runtime.interpreter import BIG

        for m in self.members:
            if any(
                isinstance(d, Expr) and free_symbols(d) & m.moving for o in m.node.outputs for d in o.shape
            ):
                return f"the per-point shape of {m.node.label} varies along the loop"
        n = len(vals)
        arr = np.asarray(vals, dtype=np.int64)
        env = {**self.ex._env, self.var: arr}
        # the lower bound at each iteration: the entry's, then one past the step before it
        sm = self.members[self.setter]  # type: ignore[index]
        t0 = self._point_env(sm, vals[0])[0][self.ex._dyn[sm.node.op.attr("bound")].t_idx]
        steps = int(t0) + np.arange(n, dtype=np.int64)  # the setter's t at each iteration
        lo = {b: np.maximum(lb, np.concatenate([[lb], steps[:-1] + 2])) for b, lb in unknown.items()}
        hi = {b: BIG for b in unknown}
        rows: list[np.ndarray | None] = []
        for m in self.members:
            if m.branch_conds is None:
                rows.append(None)
                continue
            conds = m.vconds or m.dconds
            if conds is None or m.vpoint is None:
                return f"the branch conditions of {m.node.label} do not evaluate elementwise"
            penv = {**self.ex._static, **dict(zip(m.node.domain, m.vpoint(env), strict=True))}
            taken = []
            for extra in (lo, hi) if m.dconds is not None else ({},):
                t = np.full(n, -1, dtype=np.int64)
                for k, c in reversed(list(enumerate(conds({**penv, **extra})))):
                    t = np.where(np.broadcast_to(np.asarray(c, dtype=bool), (n,)), k, t)
                taken.append(t)
            if any((t != taken[0]).any() for t in taken[1:]):
                return (
                    f"a branch of {m.node.label} depends on where {', '.join(b.name for b in unknown)} ends"
                )
            rows.append(taken[0])
        same = np.ones(n, dtype=bool)
        for t in rows:
            if t is not None:
                same &= t == t[-1]
        bad = np.flatnonzero(~same)
        start = int(bad[-1]) + 1 if bad.size else 0
        choice = [None if t is None else int(t[-1]) for t in rows]
        return self._kinds(vals, start, choice)

    def _first_values(
        self, vals: list[int], choice: list[int | None]
    ) -> tuple[dict[tuple[int, int], Any], list[list[str]]] | None:
        """Scan from the first iteration too where only ``MERGE`` members take another branch
        there, that branch reads a value the store holds before the loop (from outside it, or
        from an earlier entry of it), and the branch they take after it reads a member at the
        previous iteration (``o[0] = reset``, ``o[t + 1] = step(...)[t]``): that value is then
        the carry's first value, and the first step runs inside the scan instead of through
        the interpreter (no join of its rows, no compilation of its statements on their own).
        ``(first carry values by (member, output), the kinds from the first iteration)``, or
        None to peel the first iteration."""
        plan = self._kinds(vals, 0, choice)
        if isinstance(plan, str):
            return None
        _, _, kinds = plan
        carried = {}
        for k, m in enumerate(self.members):
            for e, kind in zip(m.edges, kinds[k], strict=True):
                if kind == "carry":
                    slot = (self.index[e.src], e.oid)
                    carried[slot] = carried.get(slot, 0) + 1
        first: dict[tuple[int, int], Any] = {}
        be = self.ex.backend
        for k, m in enumerate(self.members):
            if m.branch_conds is None:
                continue
            _, penv = self._point_env(m, vals[0])
            j0 = next((j for j, c in enumerate(m.branch_conds) if c(penv)), -1)
            j = choice[k]
            if j0 == j:
                continue
            if j0 < 0 or j is None or kinds[k][j] != "carry":
                return None
            slot = (self.index[m.edges[j].src], m.edges[j].oid)
            if carried[slot] != 1 or slot in first:  # another read of it would see this value
                return None
            try:  # from outside the loop, or from a member at an earlier entry of it
                y = m.inputs[j0][0](penv)
            except Exception:  # noqa: BLE001 - not in the store before the loop: peel
                return None
            if m.node.batch and not m.inputs[j0][1]:
                y = be.broadcast_batch(y, tuple(m.node.batch))
            first[slot] = y
        return (first, kinds) if first else None

    def _values(self, env: dict[Sym, Any]) -> list[int]:
        """The loop variable's values at this entry: from ``init`` by ``inc`` while ``cond``
        holds, the condition evaluated for many values at once (NumPy) where it compiles
        elementwise, so the host work does not grow by a Python step per iteration."""
        v0, inc, limit = self.init(env), self.inc, self.ex.max_loop_iterations
        if self._vcond is None:
            vals = []
            env[self.var] = v0
            while self.cond(env):
                vals.append(env[self.var])
                env[self.var] += inc
                self._check_limit(len(vals), limit)
            del env[self.var]
            return vals
        done, chunk = 0, 256
        while True:
            arr = v0 + inc * np.arange(done, done + chunk, dtype=np.int64)
            (ok,) = self._vcond({**env, self.var: arr})
            bad = np.flatnonzero(~np.broadcast_to(np.asarray(ok, dtype=bool), arr.shape))
            if bad.size:
                n = done + int(bad[0])
                break
            done += chunk
            self._check_limit(done, limit)
            chunk *= 4
        self._check_limit(n, limit)
        return list(range(v0, v0 + inc * n, inc))

    def _check_limit(self, n: int, limit: int) -> None:
        if n > limit:
            raise RuntimeExecutionError(
                f"loop over {self.var} runs more than {limit} iterations (condition `{self.loop.cond}`)"
            )

    def _point_env(self, m: _Member, v: int) -> tuple[tuple[int, ...], dict[Sym, int]]:
        env = dict(self.ex._env)
        env[self.var] = v
        p = m.point(env)
        return p, m.penv(p)

    def _plan(self, vals: list[int]) -> str | tuple[int, int, list[int | None], list[list[str]]]:
        """``(first scanned index, end of the scanned ones, branch per member, input kind per
        member edge)`` or why not. The iterations before the first scanned one (other branches:
        a reset at ``t = 0``) and after the scanned ones (only the last, when it alone takes
        another branch: ``v_next[T - 1] = v_last`` run forwards) run statement by statement."""
        if len(vals) < 2:
            return "fewer than two iterations"
        stop = len(vals) - 1 if len(vals) >= 4 and self._last_differs(vals) else len(vals)
        got = self._plan_head(vals[:stop])
        return got if isinstance(got, str) else (got[0], stop, got[1], got[2])

    def _last_differs(self, vals: list[int]) -> bool:
        """Whether some ``MERGE`` member takes another branch at the last iteration than at
        the one before it."""
        for m in self.members:
            if m.branch_conds is None:
                continue
            a, b = (
                next((k for k, c in enumerate(m.branch_conds) if c(self._point_env(m, v)[1])), -1)
                for v in vals[-2:]
            )
            if a != b:
                return True
        return False

    def _plan_head(self, vals: list[int]) -> str | tuple[int, list[int | None], list[list[str]]]:
        """:meth:`_plan` for ``vals`` scanned up to their last (no iteration after them)."""
        for m in self.members:  # stacked rows need one shape (an incrementalized short last block)
            if any(
                isinstance(d, Expr) and free_symbols(d) & m.moving for o in m.node.outputs for d in o.shape
            ):
                return f"the per-point shape of {m.node.label} varies along the loop"
        # branch choices per iteration; the scan starts where they stop changing
        start = self._vector_start(vals)
        if start is not None:
            return self._kinds(vals, start)
        choices: list[list[int | None]] = []
        for v in vals:
            row: list[int | None] = []
            for m in self.members:
                if m.branch_conds is None:
                    row.append(None)
                    continue
                _, penv = self._point_env(m, v)
                row.append(next((k for k, c in enumerate(m.branch_conds) if c(penv)), -1))
            choices.append(row)
        start = len(vals) - 1
        while start > 0 and choices[start - 1] == choices[-1]:
            start -= 1
        return self._kinds(vals, start, choices[-1])

    def _vector_start(self, vals: list[int]) -> int | None:
        """The first iteration from which every ``MERGE`` member takes the branch it takes at
        the last one, from the branch conditions evaluated for all iterations at once; None
        when some condition cannot be (it needs a dynamic bound)."""
        if any(m.branch_conds is not None and (m.vconds is None or m.vpoint is None) for m in self.members):
            return None
        n = len(vals)
        arr = np.arange(vals[0], vals[0] + self.inc * n, self.inc, dtype=np.int64)
        env = {**self.ex._env, self.var: arr}
        same = np.ones(n, dtype=bool)
        for m in self.members:
            if m.vconds is None or m.vpoint is None:
                continue
            penv = {**self.ex._static, **dict(zip(m.node.domain, m.vpoint(env), strict=True))}
            taken = np.full(n, -1, dtype=np.int64)
            for k, c in reversed(list(enumerate(m.vconds(penv)))):  # the first branch that holds
                taken = np.where(np.broadcast_to(np.asarray(c, dtype=bool), (n,)), k, taken)
            same &= taken == taken[-1]
        bad = np.flatnonzero(~same)
        return int(bad[-1]) + 1 if bad.size else 0

    def _kinds(
        self, vals: list[int], start: int, choice: list[int | None] | None = None
    ) -> str | tuple[int, list[int | None], list[list[str]]]:
        """The scan's plan from its first scanned iteration: the branch per member (taken
        at the last iteration) and the kind of every member edge; or why not."""
        if len(vals) - start < 2:
            return "the branches taken change up to the last iterations"
        if choice is None:
            choice = []
            for m in self.members:
                if m.branch_conds is None:
                    choice.append(None)
                    continue
                _, penv = self._point_env(m, vals[-1])
                choice.append(next((k for k, c in enumerate(m.branch_conds) if c(penv)), -1))
        if any(c == -1 for c in choice):
            return "a branching definition has no branch at the loop's last point"
        first, second, last = vals[start], vals[start + 1], vals[-1]
        kinds: list[list[str]] = []
        for k, m in enumerate(self.members):
            used = range(len(m.edges)) if choice[k] is None else [choice[k]]
            row_k = ["unused"] * len(m.edges)
            for j in used:
                e = m.edges[j]
                if e.src in self.index:
                    kind = self._member_edge(m, e, first, second, last)
                    if kind is None:
                        return f"{m.node.label} reads {self.ex.pdg.nodes[e.src].label} at another point"
                    if kind == "local" and self.index[e.src] >= k:
                        return f"{m.node.label} reads a later statement"
                    row_k[j] = kind
                elif e.cond is not TRUE and m.node.op.kind is not OpKind.MERGE:
                    return f"{m.node.label} reads {self.ex.pdg.nodes[e.src].label} under a condition"
                else:
                    row_k[j] = "xs" if m.varies[j] else "inv"
            kinds.append(row_k)
        return start, choice, kinds

    def _member_edge(self, m: _Member, e: Edge, *ts: int) -> str | None:
        """'local' (same iteration) or 'carry' (previous iteration) for a member's read of a
        member, checked at the given loop values; None if it is neither."""
        if (
            e.cond is not TRUE
            and m.node.op.kind is not OpKind.MERGE
            or e.select is not None
            or e.batch_read
            or e.to_batch is not None
            or any(isinstance(c, Slice) for c in e.phi)
        ):
            return None
        src = self.members[self.index[e.src]]
        if src.node.batch_dims != m.node.batch_dims:
            return None
        phi = self.ex._node_expr(e.phi, m.node)
        kinds = set()
        for v in ts:
            _, penv = self._point_env(m, v)
            q = tuple(phi(penv))
            here, _ = self._point_env(src, v)
            before, _ = self._point_env(src, v - self.inc)
            kinds.add("local" if q == here else "carry" if q == before else None)
        return kinds.pop() if len(kinds) == 1 else None

    # -- the scan ---------------------------------------------------------------------------
    def _scan(
        self,
        peeled: list[int],
        vals: list[int],
        choice: list[int | None],
        kinds: list[list[str]],
        first_values: Mapping[tuple[int, int], Any] | None = None,
        tail: Sequence[int] = (),
        setter: int | None = None,
        extend: bool = False,
    ) -> tuple[int, bool]:
        """Run ``vals`` as one scan, after ``peeled`` ran statement by statement and before
        ``tail`` does (here, once the scanned rows are stored). With ``setter`` (the member
        that finds the loop's dynamic bound) the scan stops after the iteration where its
        done-signal holds: ``(iterations run, whether it held)``; ``extend``: a later chunk of
        the same loop entry (slice reads see the rows of every chunk)."""
        ex = self.ex
        store = ex.store
        first = vals[0]
        carry_src: list[tuple[int, int]] = []  # (member index, oid) read at the previous iteration
        inv: list[Any] = []
        xs: list[Any] = []
        plan: list[list[tuple[str, int]]] = []
        for k, m in enumerate(self.members):
            row: list[tuple[str, int]] = []
            _, penv0 = self._point_env(m, first)
            for j, e in enumerate(m.edges):
                kind = kinds[k][j]
                if kind == "unused":
                    row.append(("unused", -1))
                elif kind == "local":
                    row.append(("local", self.index[e.src] * host_loop.SLOT + e.oid))
                elif kind == "carry":
                    key = (self.index[e.src], e.oid)
                    if key not in carry_src:
                        carry_src.append(key)
                    row.append(("carry", carry_src.index(key)))
                elif kind == "inv":
                    row.append(("inv", len(inv)))
                    inv.append(m.inputs[j][0](penv0))
                else:
                    row.append(("xs", len(xs)))
                    xs.append(self._scanned_input(m, j, vals))
            if m.node.op.kind in _RANDOM:  # the draw's seeds, per iteration, after its inputs
                row.append(("xs", len(xs)))
                xs.append(self._draw_seeds(m, vals))
            plan.append(row)
        carry0 = []
        for mk, oid in carry_src:
            if first_values and (mk, oid) in first_values:
                carry0.append(first_values[(mk, oid)])
                continue
            src = self.members[mk]
            q, _ = self._point_env(src, first - self.inc)
            carry0.append(store.table(src.node.id, oid)[q])
        # outputs the interpreter would keep: read outside the loop, read at another
        # iteration (the carry: a recurrence's values stay readable, as unscanned), read by no
        # edge, or a MERGE/UDF output (never inside a fused region); a pure op read only at
        # its own point inside the body stays inside the scan, as in a fused region
        # (a read that is local at this entry only, ``x[max(t - 1, 0)]`` at ``t = 0``, reads
        # another point at the next entries, which may run unscanned: its source is kept)
        local = {
            (self.index[e.src], e.oid)
            for m, r in zip(self.members, kinds, strict=True)
            for e, kd, own in zip(m.edges, r, m.own_point, strict=True)
            if kd == "local" and own
        }
        carried = set(carry_src)
        stored: list[tuple[int, int]] = []
        for k, m in enumerate(self.members):
            for oid in range(len(m.node.outputs)):
                outs = [e for e in ex.pdg.out_edges(m.node.id) if e.oid == oid and not e.order_only]
                external = any(e.sink not in self.index for e in outs)
                keep = (
                    not outs
                    or external
                    or not fusable(m.node)
                    or (k, oid) in carried
                    or (k, oid) not in local
                    or self._read_unscanned(m, oid, kinds)
                )
                if keep:
                    stored.append((k, oid))
        states0 = [m.pure.get_state() if m.pure is not None else None for m in self.members]
        # a loop that counts a member's points down (GAE's ``t = T - 1 - c``) gives its rows
        # in descending order: the scan flips them, so every stacked array ascends
        flips = tuple(self._descends(self.members[k], vals) for k, _ in stored)
        if setter is not None and any(flips):  # a chunk's rows after the last that ran are padding
            raise NotImplementedError("a loop over a dynamic bound whose points count down")
        sig = (tuple(map(tuple, kinds)), tuple(choice), len(vals), flips, setter)
        fn = self._compiled.get(sig)
        if fn is None:
            fn = self._compiled[sig] = self._build(plan, choice, carry_src, stored, len(vals), flips, setter)
            log.debug(
                "loop over %s: %d iterations of [%s] as one scan (%d peeled before, %d after), %d "
                "carried, %d scanned inputs, %d outputs stored",
                self.var,
                len(vals),
                ", ".join(m.node.label for m in self.members),
                len(peeled),
                len(tail),
                len(carry_src),
                len(xs),
                len(stored),
            )
        keeps: list[np.ndarray | None] = [None] * len(stored)
        done = False
        if ex.backend.scans == "compiled":
            out = fn(tuple(carry0), tuple(inv), tuple(xs), tuple(states0))
        else:
            keeps = self._host_keeps(stored, vals)
            out = fn(tuple(carry0), tuple(inv), tuple(xs), tuple(states0), vals, keeps)
        if setter is None:
            states, ys = out
        else:  # the iterations that ran: up to the one whose done-signal held
            count, flag, states, ys = out
            vals = vals[: int(count)]
            done = bool(flag)
            keeps = [None if kp is None else kp[: len(vals)] for kp in keeps]
            sm = self.members[setter]
            ex._report(
                ex._dyn[sm.node.op.attr("bound")], self._point_env(sm, vals[-1])[0], done, sm.node.label
            )
        for m, st in zip(self.members, states, strict=True):
            if m.pure is not None:
                m.pure.set_state(st)
        n = len(vals)
        for m in self.members:  # a dynamic bound's current episode, as the interpreter moves it
            if m.enter is not None:
                m.enter(self._point_env(m, vals[-1])[0])
        hints: list[tuple[_Member, int, Any, bool]] = []
        for (k, oid), y, flip, keep in zip(stored, ys, flips, keeps, strict=True):
            m = self.members[k]
            axis = len(m.node.batch)  # the scan's rows come after the batch dims
            pts = self._points(m, list(reversed(vals)) if flip else vals)
            if keep is not None:  # a host loop kept only the rows its body does not free
                if not keep.any():
                    continue
                keep = keep[::-1] if flip else keep
                pts = PointRows(pts.cols[keep]) if isinstance(pts, PointRows) else list(compress(pts, keep))
            if not store.put_rows(m.node.id, oid, pts, y, axis, distinct=m.distinct):
                rows = self.ex.backend.unstack(y, axis)
                for p, row in zip(pts, rows if len(rows) == len(pts) else rows[: len(pts)], strict=True):
                    store.put(m.node.id, oid, p, row)
            hints.append((m, oid, y, flip))
        ex.exec_count += n * len(self.members)
        if self.range_frees is not None:  # the body's frees, for every scanned iteration at once
            arr = np.asarray(vals, dtype=np.int64)
            env = {**ex._env, self.var: arr}
            for free in self.range_frees:
                free(store, env, len(vals))
        elif self.frees:  # the body's frees (and their conditions), per iteration, after the scan
            env = ex._env
            for v in vals:
                env[self.var] = v
                for free in self.frees:
                    free()
            env.pop(self.var, None)
        env = ex._env
        for v in tail:  # after the scan: the last iteration's other branches
            env[self.var] = v
            self.body()
        env.pop(self.var, None)
        for m, oid, y, flip in hints:
            self._hint(m, oid, peeled, vals, y, flip, list(tail), extend)
        return n, done

    def _host_keeps(self, stored: list[tuple[int, int]], vals: list[int]) -> list[np.ndarray | None]:
        """Per stored output of a host loop, which iterations' rows to keep (None: all): the
        rows whose points the loop body itself frees are read inside the loop only (by the
        carry), so the host loop drops them as it goes and the peak does not grow with the
        loop (the interpreter frees them one by one). Outputs read as stacked slices
        (``stack_hints``) keep every row."""
        out: list[np.ndarray | None] = [None] * len(stored)
        if not self.range_frees:
            return out
        n = len(vals)
        env = {**self.ex._env, self.var: np.asarray(vals, dtype=np.int64)}
        freed_by: dict[tuple[int, int], list[PointRows]] = {}
        for free in self.range_frees:
            pts = free.points(env, n)
            if pts is None:
                continue
            for k, oid in stored:
                if free.node == self.members[k].node.id and (not free.outputs or oid in free.outputs):
                    freed_by.setdefault((k, oid), []).append(pts)
        for s, (k, oid) in enumerate(stored):
            m = self.members[k]
            frees = freed_by.get((k, oid))
            if not frees or (m.node.id, oid) in self.ex.stack_hints:
                continue
            own = self._points(m, vals)
            cols = own.cols if isinstance(own, PointRows) else np.asarray(own, dtype=np.int64).reshape(n, -1)
            freed = np.zeros(n, dtype=bool)
            for pts in frees:
                freed |= member_mask(cols, pts)
            if freed.any():
                out[s] = ~freed
        return out

    def _points(self, m: _Member, vals: list[int]) -> PointRows | list[tuple[int, ...]]:
        """``m``'s point at each of ``vals`` (elementwise, as rows, where its point expressions
        allow)."""
        if m.vpoint is None:
            return [self._point_env(m, v)[0] for v in vals]
        n = len(vals)
        cols = m.vpoint({**self.ex._env, self.var: np.asarray(vals, dtype=np.int64)})
        return PointRows(_columns(cols, n))

    def _descends(self, m: _Member, vals: list[int]) -> bool:
        """Whether one coordinate of ``m``'s points counts down by one as the loop goes on."""
        a, b = (self._point_env(m, v)[0] for v in vals[:2])
        moved = [y - x for x, y in zip(a, b, strict=True) if x != y]
        return moved == [-1]

    def _hint(
        self,
        m: _Member,
        oid: int,
        peeled: list[int],
        vals: list[int],
        ys: Any,
        flip: bool,
        tail: list[int],
        extend: bool = False,
    ) -> None:
        """Leave the rows of every iteration of this entry (peeled ones, before and after the
        scan, too) stacked for slice reads of them (``x[i, 0:T]``), when one coordinate of
        ``m``'s points counts up (or, with ``flip``, down) by one with the loop and the others
        stay; ``ys`` holds the scanned rows, ascending, after the batch dims."""
        hints = self.ex.stack_hints.get((m.node.id, oid))
        if hints is None:  # no slice read of it was planned
            return
        if flip:
            order = list(reversed(tail)) + list(reversed(vals)) + list(reversed(peeled))
        else:
            order = peeled + vals + tail
        if len(order) < 2:  # one row (a chunk that ended at once): read as a point
            hints.clear()
            return
        pts = [self._point_env(m, v)[0] for v in order[:2]]
        moved = [k for k, (a, b) in enumerate(zip(*pts, strict=True)) if a != b]
        if len(moved) != 1 or pts[1][moved[0]] - pts[0][moved[0]] != 1:
            return
        k = moved[0]
        key = pts[0][:k] + (None,) + pts[0][k + 1 :]
        prev = hints.get(key) if extend and not (flip or peeled or tail) else None
        if prev is not None and prev[0] + prev[1] == pts[0][k]:  # the entry's earlier chunks, then these rows
            parts = prev[2].parts if isinstance(prev[2], _Chunks) else [(prev[2], prev[1])]
            hints[key] = (
                prev[0],
                prev[1] + len(order),
                _Chunks([*parts, (ys, len(order))], len(m.node.batch), self.ex.backend),
            )
            return
        hints.clear()  # one loop entry's rows at a time
        if peeled or tail:  # joined on first use: no third copy of the rows unless a read needs them
            tab = self.ex.store.table(m.node.id, oid)
            try:
                head = [tab[self._point_env(m, v)[0]] for v in (reversed(peeled) if flip else peeled)]
                last = [tab[self._point_env(m, v)[0]] for v in (reversed(tail) if flip else tail)]
            except KeyError:  # freed already: nothing reads them as a slice
                return
            before, after = (last, head) if flip else (head, last)
            hints[key] = (
                pts[0][k],
                len(order),
                _Joined(before, ys, after, len(m.node.batch), self.ex.backend),
            )
        else:
            hints[key] = (pts[0][k], len(order), ys)

    def _draw_seeds(self, m: _Member, vals: list[int]) -> Any:
        """The seeds of a random member's draw at each of ``vals`` (those the interpreter
        seeds it with at its point): ``(n,)`` int32, or ``(n, draws)`` for a draw vectorized
        over ``point_dims``; a list of rows for a host loop."""
        from timerl.runtime.common import draw_seeds

        ex, node = self.ex, m.node
        if node.op.attr("point_dims", ()):
            order = [d for d, _ in ex.pdg.dims]
            rows = np.stack([draw_seeds(node, ex.seeds, self._point_env(m, v)[0], order) for v in vals])
        else:
            pts = self._points(m, vals)
            cols = pts.cols if isinstance(pts, PointRows) else np.asarray(pts, dtype=np.int64)
            rows = ex.seeds.point_seeds(node, cols.reshape(len(vals), -1)).astype(np.int32)
        if ex.backend.scans != "compiled":
            return list(rows)
        return rows

    def _scanned_input(self, m: _Member, j: int, vals: list[int]) -> Any:
        """Input ``j`` of ``m`` at every scanned iteration, stacked on a new leading axis. A row
        read of a value vectorized along the loop's dim (``batch_read`` at ``t``) is one
        ``take`` of those rows; anything else is gathered per iteration and stacked."""
        if self.ex.backend.scans != "compiled":  # a host loop reads them one by one
            g = m.inputs[j][0]
            return [g(self._point_env(m, v)[1]) for v in vals]
        import jax.numpy as jnp

        from timerl.plan.layout import input_layout

        e = m.edges[j]
        src = self.ex.pdg.nodes[e.src]
        steps = input_layout(src, m.node, e).steps
        phi_moves = any(free_symbols(c) & m.moving for c in e.phi)
        if len(steps) == 1 and steps[0][0] == "take" and e.select is None and not phi_moves:
            ax, c = steps[0][1]
            rows = self._rows_read(m, c, vals)
            penv0 = self._point_env(m, vals[0])[1]
            raw = self.ex.store.table(e.src, e.oid)[tuple(self.ex._node_expr(e.phi, m.node)(penv0))]
            if rows.size and rows.min() >= 0 and rows.max() < raw.shape[ax]:
                return _take_rows(ax)(raw, rows)
        g = m.inputs[j][0]
        return jnp.stack([g(self._point_env(m, v)[1]) for v in vals])

    def _rows_read(self, m: _Member, c: Expr, vals: list[int]) -> np.ndarray:
        """The row ``c`` (an expression over ``m``'s point) at each of ``vals``: for all of
        them at once where ``m``'s point evaluates elementwise, else one by one."""
        n = len(vals)
        if m.vpoint is not None and not free_symbols(c) & self.ex._dyn.keys():
            env = {**self.ex._env, self.var: np.asarray(vals, dtype=np.int64)}
            penv = {**self.ex._static, **dict(zip(m.node.domain, m.vpoint(env), strict=True))}
            fn = self._row_fns.get(c)
            if fn is None:  # compiled once per expression, not per loop entry
                fn = self._row_fns[c] = compile_exprs_elementwise([c])
            (col,) = fn(penv)
            return np.broadcast_to(np.asarray(col, dtype=np.int64), (n,))
        return np.asarray([int(evaluate(c, self._point_env(m, v)[1])) for v in vals], dtype=np.int64)

    def _reads_own_point(self, m: _Member, e: Edge) -> bool:
        """Whether ``e`` (from a member) reads its source at the point where ``m`` runs, for
        every value of the loop variables (the points composed symbolically, not evaluated)."""
        src = self.members[self.index[e.src]]
        at = dict(zip(m.node.domain, m.point_exprs, strict=True))
        for c, want in zip(e.phi, src.point_exprs, strict=True):
            if isinstance(c, Slice) or isinstance(want, Slice):
                return False
            got = substitute(c, at)
            if isinstance(got, Slice) or affine_difference(lift(got), want) != 0:
                return False
        return True

    def _read_unscanned(self, m: _Member, oid: int, kinds: list[list[str]]) -> bool:
        """Whether a member reads this output through an edge the scan does not use."""
        for k2, m2 in enumerate(self.members):
            for e, kd in zip(m2.edges, kinds[k2], strict=True):
                if e.src == m.node.id and e.oid == oid and kd == "unused":
                    return True
        return False

    def _build(
        self,
        plan: list[list[tuple[str, int]]],
        choice: list[int | None],
        carry_src: list[tuple[int, int]],
        stored: list[tuple[int, int]],
        length: int,
        flips: tuple[bool, ...],
        setter: int | None = None,
    ) -> Callable[..., Any]:
        if self.ex.backend.scans != "compiled":
            return self._build_host(plan, choice, carry_src, stored, length, flips, setter)
        import jax
        import jax.numpy as jnp
        from jax import lax

        from timerl.backends.jax_backend import jit
        from timerl.runtime.common import draw_points

        be = self.ex.backend
        static = dict(self.ex._static)
        members = self.members
        done: list[Any] = []  # the setter's done-signal at the step being traced

        def step(c: tuple[Any, Any], x: tuple[Any, ...], inv: tuple[Any, ...]) -> tuple[Any, Any]:
            carry, states = c
            states = list(states)
            vals: dict[int, Any] = {}
            done.clear()

            def get(kind: str, k: int) -> Any:
                if kind == "local":
                    return vals[k]
                if kind == "carry":
                    return carry[k]
                if kind == "inv":
                    return inv[k]
                return x[k]

            for k, m in enumerate(members):
                n = m.node
                row = plan[k]
                if n.op.kind is OpKind.MERGE:
                    j = choice[k]
                    assert j is not None
                    y = get(*row[j])
                    if n.batch and not m.inputs[j][1]:
                        y = be.broadcast_batch(y, tuple(n.batch))
                    outs = [y]
                elif m.pure is not None:
                    ins = [get(*r) for r in row]
                    states[k], outs = m.pure.step(states[k], ins)
                    outs = [o.astype(spec.dtype.numpy) for o, spec in zip(outs, n.outputs, strict=True)]
                elif n.op.kind is OpKind.SET_SYMBOL:
                    y = get(*row[0])
                    done.append(jnp.all(y))
                    outs = [y] if n.outputs else []
                elif n.op.kind in _RANDOM:
                    ins = [get(*r) for r in row[:-1]]
                    seeds = get(*row[-1])
                    if n.op.attr("point_dims", ()):
                        outs = [draw_points(be, n, self.ex.seeds, (), (), static, seeds)]
                    else:
                        be.seed(seeds)
                        flags = [b for _, b in m.inputs]
                        outs = [be.run(n.op, ins, tuple(n.batch), flags, static)]
                else:
                    ins = [get(*r) for r in row]
                    flags = [b for _, b in m.inputs]
                    outs = [be.run(n.op, ins, tuple(n.batch), flags, static)]
                for oid, o in enumerate(outs):
                    vals[k * host_loop.SLOT + oid] = o
            new_carry = tuple(vals[mk * host_loop.SLOT + oid] for mk, oid in carry_src)
            ys = tuple(vals[k * host_loop.SLOT + oid] for k, oid in stored)
            return (new_carry, tuple(states)), ys

        axes = [len(members[k].node.batch) for k, _ in stored]

        def run(carry0: tuple[Any, ...], inv: tuple[Any, ...], xs: tuple[Any, ...], states0: tuple[Any, ...]):
            (_, states), ys = lax.scan(lambda c, x: step(c, x, inv), (carry0, states0), xs, length=length)
            # rows after the batch dims, as the interpreter stacks points (``stack(xs, nb)``):
            # slice reads of the whole rollout then take the array as it is
            return states, tuple(
                jnp.moveaxis(jnp.flip(y, 0) if f else y, 0, a)
                for y, a, f in zip(ys, axes, flips, strict=True)
            )

        def run_until(
            carry0: tuple[Any, ...], inv: tuple[Any, ...], xs: tuple[Any, ...], states0: tuple[Any, ...]
        ):
            # a loop over a dynamic bound: up to ``length`` steps, stopping after the one whose
            # done-signal holds; the rows after it stay zero
            x0 = tuple(a[0] for a in xs)
            _, y_shapes = jax.eval_shape(lambda c, x: step(c, x, inv), (carry0, states0), x0)
            ys0 = tuple(jnp.zeros((length, *y.shape), y.dtype) for y in y_shapes)

            def body(st: tuple[Any, ...]) -> tuple[Any, ...]:
                k, c, ys, _ = st
                c, y = step(c, tuple(lax.dynamic_index_in_dim(a, k, 0, keepdims=False) for a in xs), inv)
                ys = tuple(lax.dynamic_update_index_in_dim(b, v, k, 0) for b, v in zip(ys, y, strict=True))
                return k + 1, c, ys, done[0]

            init = (jnp.int32(0), (carry0, states0), ys0, jnp.bool_(False))
            k, (_, states), ys, flag = lax.while_loop(lambda st: (st[0] < length) & ~st[3], body, init)
            return k, flag, states, tuple(jnp.moveaxis(y, 0, a) for y, a in zip(ys, axes, strict=True))

        return jit(run if setter is None else run_until)

    def _build_host(
        self,
        plan: list[list[tuple[str, int]]],
        choice: list[int | None],
        carry_src: list[tuple[int, int]],
        stored: list[tuple[int, int]],
        length: int,
        flips: tuple[bool, ...],
        setter: int | None = None,
    ) -> Callable[..., Any]:
        """The scan as one Python loop (a backend that does not compile loops: Torch): per
        iteration, each member's prepared kernel (``AbstractBackend.prepare``) on the values
        of this iteration, the carry and the loop-invariant inputs, and the pure form of a
        UDF called eagerly; no store, gather or free per iteration. The stored outputs are
        stacked once at the end, after the batch dims."""
        be = self.ex.backend
        static = dict(self.ex._static)
        members = self.members
        calls: list[host_loop.HostMember] = []
        for k, m in enumerate(members):
            n = m.node
            if n.op.kind is OpKind.MERGE:
                j = choice[k]
                assert j is not None
                widen = tuple(n.batch) if n.batch and not m.inputs[j][1] else None

                def merge(ins: list[Any], j: int = j, widen: Any = widen) -> Any:
                    return ins[j] if widen is None else be.broadcast_batch(ins[j], widen)

                calls.append(host_loop.HostMember("kernel", merge))
            elif m.pure is not None:
                calls.append(host_loop.HostMember("pure", _host_pure_step(m, be)))
            elif n.op.kind is OpKind.UDF:
                calls.append(host_loop.HostMember("step", self._host_udf(m)))
            elif n.op.kind is OpKind.SET_SYMBOL:
                out = bool(n.outputs)
                calls.append(
                    host_loop.HostMember("step", lambda ins, state, v, out=out: ins[:1] if out else [])
                )
            elif n.op.kind in _RANDOM:
                calls.append(host_loop.HostMember("step", self._host_draw(m)))
            else:
                calls.append(
                    host_loop.HostMember(
                        "kernel", be.prepare(n.op, tuple(n.batch), [b for _, b in m.inputs], static)
                    )
                )
        axes = [len(members[k].node.batch) for k, _ in stored]
        loop = host_loop.generate(plan, calls, carry_src, stored, setter, be.all_true)

        def run(
            carry0: tuple[Any, ...],
            inv: tuple[Any, ...],
            xs: tuple[Any, ...],
            states0: tuple[Any, ...],
            vals: Sequence[int],
            keeps: Sequence[np.ndarray | None],
        ) -> tuple[list[Any], tuple[Any, ...]]:
            states, rows, count, done = loop(carry0, inv, xs, states0, vals, keeps)
            ys = tuple(
                be.stack(r[::-1] if f else r, a) if r else None
                for r, a, f in zip(rows, axes, flips, strict=True)
            )
            return (states, ys) if setter is None else (count, done, states, ys)

        return run

    def _host_draw(self, m: _Member) -> Callable[[list[Any], Any, int], list[Any]]:
        """A random member called from a host loop: seeded with its seeds at the iteration
        (its last input), as the interpreter seeds it at its point."""
        from timerl.runtime.common import draw_points

        be, node, static = self.ex.backend, m.node, dict(self.ex._static)
        flags = [b for _, b in m.inputs]
        if node.op.attr("point_dims", ()):
            return lambda ins, state, v: [
                draw_points(be, node, self.ex.seeds, (), (), static, ins[-1].tolist())
            ]

        def draw(ins: list[Any], state: Any, v: int) -> list[Any]:
            be.seed(int(ins[-1]))
            return [be.run(node.op, ins[:-1], tuple(node.batch), flags, static)]

        return draw

    def _host_udf(self, m: _Member) -> Callable[[list[Any], Any, int], list[Any]]:
        """A UDF without a pure form called from a host loop as the interpreter calls it, at
        its point for the loop value."""
        from timerl.runtime.common import call_udf, point_dict

        be, node, fn = self.ex.backend, m.node, m.node.op.attr("fn")

        def udf(ins: list[Any], state: Any, v: int) -> list[Any]:
            return call_udf(node, fn, ins, point_dict(node.domain, self._point_env(m, v)[0]), be)

        return udf


def _host_pure_step(m: _Member, be: Any) -> Callable[[list[Any], Any, int], Any]:
    """A UDF's pure form called from a host loop as one jitted JAX call (the wrapper's own
    casts and reshapes included: called eagerly they were a JAX dispatch each; PPO on
    gymnax, 8 envs x 1,000 steps, Torch: 0.456 -> 0.373 s per iteration), the inputs handed
    over as JAX takes them (host buffers as NumPy views), the outputs imported as backend
    tensors (``udf_dlpack_outputs``: shapes checked, dtypes cast to the declared ones, on the
    first call; later calls import them as they are when the first needed no cast: a jitted
    function returns the same shapes and dtypes)."""
    import jax

    from timerl.runtime.common import udf_dlpack_outputs

    pure, node = m.pure, m.node
    assert pure is not None
    if m.pure_jit is None:
        m.pure_jit = jax.jit(pure.step)
    fn = m.pure_jit
    plain: bool | None = None  # set by the first call: whether its outputs needed no cast

    def step(ins: list[Any], state: Any, v: int) -> tuple[Any, list[Any]]:
        nonlocal plain
        state, outs = fn(state, [_jax_input(be.to_dlpack(x)) for x in ins])
        if plain:
            return state, [be.from_dlpack(o) for o in outs]
        got = udf_dlpack_outputs(node, outs, {"loop value": v}, be)
        if plain is None:
            plain = all(a.dtype == be.from_dlpack(o).dtype for a, o in zip(got, outs, strict=True))
        return state, got

    return step


@functools.cache
def _take_rows(axis: int) -> Callable[[Any, np.ndarray], Any]:
    """``rows`` of an array along ``axis``, moved to the front: one compiled call (the
    eager ``take`` and ``moveaxis`` cost a Python dispatch each per loop entry)."""
    import jax.numpy as jnp

    from timerl.backends.jax_backend import jit

    return jit(lambda x, rows: jnp.moveaxis(jnp.take(x, rows, axis=axis), axis, 0))


def _jax_input(x: Any) -> Any:
    """``x`` (a backend tensor) as an argument of a JAX function: a NumPy view of a host
    buffer, else imported through DLPack."""
    import jax

    if isinstance(x, jax.Array):
        return x
    try:
        return np.from_dlpack(x)
    except (BufferError, RuntimeError, TypeError):
        return jax.dlpack.from_dlpack(x)


class _Chunks:
    """The rows of a loop entry that ran in chunks: the first ``n`` rows (after ``axis`` batch
    dims) of each chunk's buffer, concatenated along ``axis`` when first read."""

    def __init__(self, parts: list[tuple[Any, int]], axis: int, be: Any) -> None:
        self.parts, self.axis, self.be = parts, axis, be

    def full(self) -> Any:
        be, ax = self.be, self.axis
        return be.concat([be.restack(y, 0, n, ax) for y, n in self.parts], ax)


class _Joined:
    """Peeled rows ``before`` and ``after`` the scan's stacked rows (after ``axis`` batch
    dims), concatenated along ``axis`` when first read."""

    def __init__(self, before: list[Any], tail: Any, after: list[Any], axis: int, be: Any) -> None:
        self.before, self.tail, self.after, self.axis, self.be = before, tail, after, axis, be
        self._full: Any = None

    def full(self) -> Any:
        if self._full is None:
            ax, be = self.axis, self.be
            on_host = (
                be.scans == "compiled"
                and tracing.current is None
                and all(d.platform == "cpu" for d in self.tail.devices())
            )
            key = (len(self.before), len(self.after), ax, self.tail.shape, str(self.tail.dtype))
            if on_host and key in _JOIN_SEEN:  # a shape seen before: one compiled join
                self._full = _join(len(self.before), len(self.after), ax)(self.before, self.tail, self.after)
            elif on_host:
                import jax  # a new shape: joined in NumPy (no compilation for a shape seen once)

                from timerl.backends.jax_backend import host_empty

                _JOIN_SEEN.add(key)
                parts = (
                    [np.expand_dims(np.asarray(x), ax) for x in self.before]
                    + [np.asarray(self.tail)]
                    + [np.expand_dims(np.asarray(x), ax) for x in self.after]
                )
                shape = list(parts[0].shape)
                shape[ax] = sum(p.shape[ax] for p in parts)
                joined = np.concatenate(parts, axis=ax, out=host_empty(shape, np.result_type(*parts)))
                self._full = jax.device_put(joined)  # fresh and aligned: adopted without a copy
            else:
                parts = [be.stack(self.before, ax)] if self.before else []
                parts.append(self.tail)
                if self.after:
                    parts.append(be.stack(self.after, ax))
                self._full = be.concat(parts, ax)
            self.before, self.tail, self.after = [], None, []
        return self._full


_JOIN_SEEN: set[tuple[Any, ...]] = set()  # shapes _Joined joined in NumPy (bounded by the program)


@functools.cache
def _join(n_before: int, n_after: int, axis: int) -> Callable[[list[Any], Any, list[Any]], Any]:
    """One compiled call joining peeled rows and a scan's stacked rows along ``axis`` (a
    NumPy join and ``device_put`` cost ~8x more per call on the host)."""
    import jax.numpy as jnp

    def join(before: list[Any], tail: Any, after: list[Any]) -> Any:
        parts = [jnp.expand_dims(x, axis) for x in before] + [tail]
        return jnp.concatenate(parts + [jnp.expand_dims(x, axis) for x in after], axis=axis)

    from timerl.backends.jax_backend import jit

    return jit(join)


def _range_frees(stmts: list[AstNode], ex: Executor) -> list[_RangeFree] | None:
    """The frees of a scanned body (``Dealloc``s, under ``If``s) as functions ``(store, env,
    n)`` freeing their points for the ``n`` iterations whose loop variable ``env`` maps to an
    array: conditions and points evaluated elementwise, one batched store call per free.
    None when some free cannot be (a batched free, or a point or condition that needs a
    dynamic bound): the frees are then replayed per iteration."""
    out: list[_RangeFree] = []
    dyn = ex._dyn.keys()

    def leaves(node: AstNode, conds: tuple[Expr, ...]) -> bool:
        if isinstance(node, Seq):
            return all(leaves(c, conds) for c in node.children)
        if isinstance(node, If):
            if free_symbols(node.cond) & dyn:
                return False
            ok = leaves(node.then, conds + (node.cond,))
            return ok and (node.else_ is None or leaves(node.else_, conds + (Not(node.cond),)))
        if not isinstance(node, Dealloc) or any(
            isinstance(c, Slice) or free_symbols(c) & dyn for c in node.point
        ):
            return False
        out.append(_range_free(node, conds))
        return True

    if not all(leaves(s, ()) for s in stmts):
        return None
    return out


@dataclass(frozen=True)
class _RangeFree:
    """One free of a scanned body for every scanned iteration at once: its points and
    conditions evaluated elementwise, one batched store call."""

    node: int
    outputs: tuple[int, ...]
    k: int  # coordinates of a point (the expressions after them are conditions)
    exprs: Callable[[dict[Sym, Any]], Any]

    def points(self, env: dict[Sym, Any], n: int) -> PointRows | None:
        """The points freed over the ``n`` iterations ``env`` maps the loop variable to."""
        vals = self.exprs(env)
        cols = [np.broadcast_to(c, (n,)) for c in vals[: self.k]]
        mask = np.ones(n, dtype=bool)
        for c in vals[self.k :]:
            mask &= np.broadcast_to(np.asarray(c, dtype=bool), (n,))
        return PointRows(_columns(cols, n)[mask]) if mask.any() else None

    def __call__(self, store: Any, env: dict[Sym, Any], n: int) -> None:
        pts = self.points(env, n)
        if pts is None:
            return
        if self.outputs:
            store.free_points(self.node, pts, self.outputs)
        else:
            store.free_points(self.node, pts)


def _range_free(node: Dealloc, conds: tuple[Expr, ...]) -> _RangeFree:
    f = compile_exprs_elementwise(list(node.point) + list(conds))
    return _RangeFree(node.node, tuple(node.outputs), len(node.point), f)


def _columns(cols: Sequence[Any], n: int) -> np.ndarray:
    """The ``(n, len(cols))`` int64 array of points whose coordinates are ``cols`` (each an
    array of ``n`` values or one value)."""
    out = np.empty((n, len(cols)), dtype=np.int64)
    for j, c in enumerate(cols):
        out[:, j] = c
    return out


def _edge_varies(e: Edge, moving: set[Sym]) -> bool:
    syms: set[Sym] = set()
    for c in e.phi:
        syms |= free_symbols(c)
    for _, c in e.batch_read:
        syms |= free_symbols(c)
    if e.select is not None:
        syms |= free_symbols(e.select)
    return bool(syms & moving)


def scanned_loop(
    ex: Executor,
    loop: Loop,
    body: Callable[[], None],
    fallback: Callable[[], None],
    scope: frozenset[Sym] = frozenset(),
) -> Callable[[], None] | None:
    """A runner for ``loop`` as a scan where the plan scans it (``plan/scans.py``), else None."""
    if not ex.plan.scanned(loop):
        return None
    return ScannedLoop(ex, loop, scan_members(loop), body, fallback, scope)


def freeing_loop(
    ex: Executor, loop: Loop, fallback: Callable[[], None], scope: frozenset[Sym] = frozenset()
) -> Callable[[], None] | None:
    """A runner for a loop whose body only frees (``for t < T: free g[i, t]``, after an
    episode's learning): the frees of every iteration at once, their points and conditions
    evaluated elementwise (one batched store call per free), once the loop's bounds are known
    at entry; else (or where some free cannot be evaluated so) the loop as before."""
    if not frees_only(loop.body):
        return None
    frees = _range_frees(flat(loop.body), ex)
    if frees is None:
        return None
    from timerl.symbolic.compile import compile_expr

    dyn = frozenset((free_symbols(loop.init) | free_symbols(loop.cond)) & ex._dyn.keys())
    site = ex._site(dyn, loop, scope) if dyn else None
    init, var, inc = compile_expr(loop.init), loop.var, int(loop.inc)
    try:
        vcond = compile_exprs_elementwise([loop.cond])
    except (NotImplementedError, KeyError, TypeError, ValueError):
        return None

    def run_frees() -> None:
        known: dict[Sym, int] = {}
        if site is not None:
            known, unknown = ex._bounds_at(site)
            if unknown:
                fallback()
                return
        env = {**ex._env, **known}
        v0, n, chunk = init(env), 0, 256
        while True:  # the trip count, the condition evaluated for many values at once
            arr = v0 + inc * np.arange(n, n + chunk, dtype=np.int64)
            (ok,) = vcond({**env, var: arr})
            bad = np.flatnonzero(~np.broadcast_to(np.asarray(ok, dtype=bool), arr.shape))
            if bad.size:
                n += int(bad[0])
                break
            n += chunk
            if n > ex.max_loop_iterations:
                fallback()  # the interpreter's loop reports it
                return
            chunk *= 4
        if n:
            env[var] = v0 + inc * np.arange(n, dtype=np.int64)
            for free in frees:
                free(ex.store, env, n)

    return run_frees
