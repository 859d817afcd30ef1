"""The iteration loop's body as one compiled call per iteration (JAX; the plan decides where:
``plan/iteration_body.py``).

Statement by statement, an iteration of PPO on a JAX-native environment is ~50 dispatches
(regions, scans, merges of the parameters) with the scans' host bookkeeping between them;
on few environments the host, not the device, sets the pace. Here the body is traced once,
as a function of the values the store holds when the iteration starts, and then runs as one
``jax.jit``-compiled call:

* **State.** The store's tables (their points relative to the iteration: a point's
  coordinate along the iteration dim minus ``i``), the stacked rows of scans and the pure
  environments' states are flattened into leaves. The body is traced with those leaves as
  tracers put in place in the store (the thunks keep their tables), so every read, write and
  free of the traced iteration happens on tracers; what the store holds at the end gives the
  outputs and, per table, how to rebuild it. The store is then restored, and every call
  rebuilds the tables the body changed from the outputs, its points moved to the iteration
  it runs.
* **Between calls** the store is kept lazily. A call's inputs and outputs stay pending; where
  the next iteration's key is known to compile, its inputs are taken straight from them (the
  successor layout, learned once by identity from a rebuilt store: which input or output
  each of the next call's inputs is), so no table is rebuilt, flattened or freed between
  calls. The tables are rebuilt (:meth:`CompiledIteration.flush`) only where something reads
  them: statements, a checkpoint, an error, the loop's end. The iteration collector
  (``runtime/gc.py``) runs here for that reason: a fed call's successor layout includes its
  frees. PPO with CleanRL's settings, one agent: 8.1-9.1 -> 5.8-7.7 ms per iteration.
* **When a traced body is reused.** Its key is the body's conditions on ``i`` evaluated for
  all iterations of the inner loops (``Plan.body_conds``) and the relative layout of the
  store (every point, shape and dtype): a call runs only where both equal the traced
  iteration's. A new key is traced once it was seen twice (the first iterations, which
  reset the environment or initialise the parameters, run statement by statement as before);
  at most :data:`MAX_BODIES` bodies per loop.
* **Whether it pays** (``compile_iterations="auto"``, the default). One call saves at most
  the host's share of an iteration, and XLA's one large module is not always as fast as the
  statements' small ones (PPO on gymnax at 512 envs x 250 steps: slower on a CPU core). So
  the loop first times :data:`SAMPLES` steady iterations statement by statement (wall clock
  and the host thread's CPU time); it traces only where the host took at least
  :data:`HOST_SHARE` of them, at least :data:`MIN_LEFT` iterations remain, and the host's time
  over the iterations left exceeds the compile the trace would cost (estimated as the
  backend's compile time since the loop started: the statements' programs, which the body
  compiles again as one; PPO on gymnax at 8 envs x 1,000 steps: 5.6 s statement by statement,
  3.6-4.4 s for the body), then times
  :data:`SAMPLES` calls and keeps whichever way was faster (logged at INFO, and
  ``Executor.iteration_body`` says which and why). ``compile_iterations=True`` always
  compiles where the plan allows.
* **The host.** Nothing host-side runs inside a call (on a GPU a host callback stops the
  device until the host answers). ``EVAL_SYMBOL`` values and the seeds of random draws are
  inputs, computed on the host before each call from the distance in iterations (the same
  values as the interpreter's; a first trace finds them, a second takes them as inputs); the
  seeds, a pure function of the distance, for :data:`HOST_CHUNK` calls at once (PPO with
  CleanRL's settings: ~0.4 ms per call before).
  Sinks' values are outputs: their callbacks run, in program order and with their points
  moved on, once the next call is on its way (or before the loop runs statement by statement
  again, and at the end of the run), so the host's sink work overlaps the device's next call.

Values are those of the interpreted body (XLA may fuse across statements: float results may
differ in the last bits, as in regions and scans). A trace that fails (a statement not
traceable in that iteration: the reset UDF of the first one, say) leaves the store as it was
and that key runs statement by statement, logged once.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from timerl.pdg.ops import OpKind
from timerl.runtime import tracing
from timerl.runtime.rows_table import RowsTable
from timerl.schedule.ast import Exec, Loop, walk
from timerl.symbolic import Sym
from timerl.symbolic.compile import compile_expr, compile_exprs_elementwise

if TYPE_CHECKING:
    from timerl.runtime.interpreter import Executor

log = logging.getLogger(__name__)

MAX_BODIES = 4
"""Traced bodies kept per loop (distinct keys); past that, new keys run statement by statement."""
TRACE_AFTER = 2
"""A key is traced the ``TRACE_AFTER``-th time it is seen."""
NEW_IN_A_ROW = 4
"""After this many iterations in a row with a key never seen before (live values that change
every iteration: a history kept to the end, say), the loop stops computing keys."""
HOST_SHARE = 0.3
"""auto: the body is traced only where the host thread's CPU time was at least this share of
an iteration run statement by statement (the most one call can save)."""
MIN_LEFT = 50
"""auto: ... and at least this many iterations remain (a trace compiles for seconds)."""
SAMPLES = 3
"""auto: steady iterations timed each way before choosing."""
_MAX_GRID = 1 << 22  # inner iterations a condition is checked over
HOST_CHUNK = 64
"""Calls whose vectorizable host inputs (the seeds of random draws) are computed at once."""
HOST_CHUNK_ELEMENTS = 1 << 20
"""... fewer calls where a chunk would hold more elements than this."""
CHECK_FED = False
"""Tests: every call fed from the last call's results also rebuilds and reads the store and
checks that it holds the same layout and values."""
SIGNATURE_CHUNK = 64
"""Iterations whose conditions are evaluated in one vectorized pass (one pass per iteration cost
~55 us per condition: 1.5 ms of a 10 ms iteration for PPO with CleanRL's settings)."""


@dataclass
class _Body:
    fn: Callable[..., Any]  # compiled(delta, leaves, states) -> (new leaves, states)
    base: int  # the traced iteration
    # per table the body changes: (nid, oid, entries [(relative point, src)], stacks
    # [(src, axis, share, relative cols, alive)]); src: ("in", k) or ("out", k)
    rebuild: list[tuple[int, int, list[tuple[Any, tuple[str, int]]], list[tuple[Any, ...]]]]
    hosts: list[tracing.Host]  # inputs computed per call
    sinks: list[Callable[[np.ndarray, int], None]]  # called back with the call's last outputs
    execs: int
    # the store's layout at the next iteration's start (after the collector) and where each of
    # its values comes from: an index into this call's inputs + outputs; learned once, from the
    # first call whose next iteration rebuilt and flattened the store (None until then)
    succ: tuple[tuple[Any, ...], list[int]] | None = None
    # the host values with a vectorized form, computed for a chunk of deltas ahead:
    # delta -> one value per host (None for those computed per call)
    ahead: dict[int, list[Any]] = field(default_factory=dict)


@dataclass
class _Pending:
    """A call whose results are not in the store yet (the store is kept lazily between calls)."""

    body: _Body
    base: int
    pool: list[Any]  # the call's inputs, then its outputs
    nout: int


class CompiledIteration:
    """Runs the iteration loop's body (``body``: the interpreter's) as one compiled call where
    it can (see the module doc)."""

    def __init__(self, ex: Executor, loop: Loop, body: Callable[[], None]) -> None:
        plan = ex.plan
        self.ex, self.loop, self.body, self.var = ex, loop, body, loop.var
        self.offset = plan.iter_offset
        dim = plan.iter_dim
        self.ipos = {n.id: n.domain.index(dim) for n in ex.pdg if dim in n.domain}
        self.conds = [(compile_exprs_elementwise([c.expr]), c.loops) for c in plan.body_conds]
        # by the loops' identities: hashing a Loop hashes its whole body (a frozen dataclass)
        self._grids: dict[tuple[int, ...], dict[Sym, np.ndarray]] = {}
        self._sigs: dict[int, tuple[Any, ...]] = {}  # signatures of the current chunk of iterations
        nodes = {s.node for s in walk(loop.body) if isinstance(s, Exec)}
        nodes |= {m for s in walk(loop.body) for m in getattr(s, "members", ())}
        self.pures = []
        for nid in sorted(nodes):
            n = ex.pdg.nodes[nid]
            make = getattr(n.op.attr("fn"), "pure_step", None) if n.op.kind is OpKind.UDF else None
            pure = make() if make is not None else None
            if pure is not None:
                self.pures.append(pure)
        self.bodies: dict[Any, _Body] = {}
        self.seen: dict[Any, int] = {}
        self.refused: dict[Any, str] = {}
        self.off = ""  # why the loop stopped trying ('' while it tries)
        self._new_in_a_row = 0
        self.calls = 0  # iterations run as one call
        self.ran = False  # whether the last iteration ran as one call
        # per call whose sinks have not run yet: (callbacks, their values, distance)
        self.queued: list[tuple[list[Callable[[np.ndarray, int], None]], list[Any], int]] = []
        self.auto = plan.options.compile_iterations == "auto"
        self.chosen = ""  # auto: why the compiled body was kept ('' until measured)
        # auto: (wall, host cpu) seconds of steady iterations run each way
        self.timed: dict[str, list[tuple[float, float]]] = {"statements": [], "compiled": []}
        self._last: tuple[float, float, str, bool] | None = None  # the previous iteration's start
        self._compiled0: float | None = None  # auto: the backend's compile seconds at the loop's start
        self._after_call = False  # the last iteration ran as one call (its sinks may be running)
        # the last call, while its results are not in the store: the next call with a known key
        # takes them straight from it (no store rebuilt, flattened and freed between calls)
        self._pending: _Pending | None = None
        # the iteration collector (runtime/gc.py) where it frees at this loop: run here, once per
        # iteration, before the store is read (a call fed from the last one skips it: its effect
        # is part of the successor layout)
        self.collector: Callable[[], None] | None = None
        self._collected = False
        self._learn_from: _Pending | None = None  # the last call, put in the store, to learn from
        self.fed = 0  # calls fed from the previous call's results (the store not rebuilt)

    @property
    def status(self) -> str:
        """How the iteration loop's body runs, and why."""
        if self.off:
            return f"statement by statement: {self.off}"
        if self.chosen:
            return f"one compiled call per iteration: {self.chosen}"
        if self.calls:
            return f"one compiled call per iteration ({self.calls} so far)"
        return "statement by statement so far (a body is traced once an iteration repeats)"

    # -- the key ---------------------------------------------------------------------------
    def _grid(self, loops: tuple[Loop, ...]) -> dict[Sym, np.ndarray]:
        key = tuple(id(lp) for lp in loops)
        g = self._grids.get(key)
        if g is None:
            static = self.ex._static
            axes = []
            for lp in loops:
                env = dict(static)
                init, cond = compile_expr(lp.init), compile_expr(lp.cond)
                env[lp.var] = init(env)
                vals = []
                while cond(env):
                    vals.append(env[lp.var])
                    env[lp.var] += lp.inc
                    if len(vals) > _MAX_GRID:
                        raise tracing.NotTraceable(f"the loop over {lp.var} runs over {_MAX_GRID} times")
                axes.append(np.asarray(vals, dtype=np.int64))
            size = int(np.prod([len(a) for a in axes])) if axes else 1
            if size > _MAX_GRID:
                raise tracing.NotTraceable(f"{size} inner iterations to check a condition over")
            mesh = np.meshgrid(*axes, indexing="ij") if axes else []
            g = self._grids[key] = {lp.var: m.ravel() for lp, m in zip(loops, mesh, strict=True)}
        return g

    def _signature(self, v: int) -> tuple[Any, ...]:
        """The conditions' values at iteration ``v`` over the inner loops' iterations (taken
        from a cache filled :data:`SIGNATURE_CHUNK` iterations at a time)."""
        sig = self._sigs.get(v)
        if sig is None:
            self._sigs = self._signatures(v)
            sig = self._sigs[v]
        return sig

    def _signatures(self, v0: int) -> dict[int, tuple[Any, ...]]:
        """:meth:`_signature` of the iterations ``v0, v0 + inc, ...`` (:data:`SIGNATURE_CHUNK`
        of them; those past the loop's end are evaluated too, harmlessly), each condition
        evaluated once over (iterations x inner iterations)."""
        vs = v0 + int(self.loop.inc) * np.arange(SIGNATURE_CHUNK, dtype=np.int64)
        cols: list[list[Any]] = []
        for fn, loops in self.conds:
            env: dict[Sym, Any] = dict(self.ex._static)
            if loops:
                grid = self._grid(loops)
                env.update(grid)
                env[self.var] = vs[:, None]
                size = len(next(iter(grid.values())))
                with np.errstate(all="ignore"):
                    (c,) = fn(env)
                a = np.broadcast_to(np.asarray(c).astype(bool), (len(vs), size))
                packed = np.packbits(a, axis=1)
                tail = bytes([size % 8])
                cols.append([row.tobytes() + tail for row in packed])
            else:
                env[self.var] = vs
                with np.errstate(all="ignore"):
                    (c,) = fn(env)
                cols.append(np.broadcast_to(np.asarray(c).astype(bool), vs.shape).tolist())
        return {int(v): tuple(col[k] for col in cols) for k, v in enumerate(vs)}

    # -- the state -------------------------------------------------------------------------
    def _flatten(self, base: int) -> tuple[tuple[Any, ...], list[Any]]:
        """The store's layout relative to iteration ``base`` and its values, in table order."""
        struct: list[Any] = []
        leaves: list[Any] = []
        for (nid, oid), (entries, stacks) in self._tables_state(base).items():
            for p, v in entries:
                struct.append((nid, oid, p, v.shape, v.dtype))
                leaves.append(v)
            for arr, axis, share, cols, alive in stacks:
                key = (cols.tobytes(), cols.shape, alive.tobytes())
                struct.append((nid, oid, "rows", axis, share, key, arr.shape, arr.dtype))
                leaves.append(arr)
        return tuple(struct), leaves

    def _load(self, leaves: list[Any]) -> None:
        """Put ``leaves`` in place of the store's values, in :meth:`_flatten`'s order."""
        k = 0
        for tabs in self.ex.store.all_tables().values():
            for tab in tabs:
                t = type(tab)
                if t is dict or t is RowsTable:
                    for p in list(dict.keys(tab)):
                        dict.__setitem__(tab, p, leaves[k])
                        k += 1
                    if t is RowsTable:
                        for st in tab.stacks():
                            st.arr = leaves[k]
                            k += 1

    # -- one iteration ---------------------------------------------------------------------
    def __call__(self) -> None:
        self._collected = False
        if self.off:
            self._statements()
            return
        if not self.auto:
            self._step()
            return
        now, cpu = time.perf_counter(), time.thread_time()
        if self._compiled0 is None:
            self._compiled0 = self.ex.backend.compile_seconds()
        if self._last is not None:  # the previous iteration's time, where it was steady
            t0, c0, mode, steady = self._last
            if steady:
                self.timed[mode].append((now - t0, cpu - c0))
        prev = self._last[2] if self._last is not None else ""
        mode, steady = self._step()
        self._last = (now, cpu, mode, steady and mode == prev)

    def _step(self) -> tuple[str, bool]:
        """Run one iteration; returns how it ran ('statements', 'compiled' or 'trace') and
        whether it was steady (its key seen before: no compilation in it)."""
        ex = self.ex
        v = ex._env[self.var]
        try:
            sig = self._signature(v)
            fed = self._feed(sig, v)
            if fed is None:
                self._settle()
                struct, leaves = self._flatten(v + self.offset)
                self._learn(struct, leaves)
        except tracing.NotTraceable as exc:
            self._refuse(None, str(exc))
            self._statements()
            return "statements", False
        if fed is not None:  # the last call's results feed this one: a key known to compile
            if self.auto and not self.chosen and len(self.timed["compiled"]) >= SAMPLES:
                self._choose()
                if self.off:
                    self._statements()
                    return "statements", False
            self._run(*fed, v)
            self.fed += 1
            return "compiled", True
        key = (sig, struct)
        self.ran = False
        body = self.bodies.get(key)
        if body is None:
            n = self.seen[key] = self.seen.get(key, 0) + 1
            self._new_in_a_row = self._new_in_a_row + 1 if n == 1 else 0
            if self._new_in_a_row >= NEW_IN_A_ROW:
                self.off = (
                    f"its live values differed from every earlier iteration's {NEW_IN_A_ROW} times in a row"
                )
                self.seen.clear()
                log.info(
                    "iteration loop over %s runs statement by statement from now on: %s", self.var, self.off
                )
            if key in self.refused or n < TRACE_AFTER or self.off or not self._worth_tracing(v):
                self._statements()
                return "statements", n >= TRACE_AFTER
            if len(self.bodies) >= MAX_BODIES:
                self._refuse(key, f"{MAX_BODIES} bodies were traced already")
                self._statements()
                return "statements", True
            body = self._trace(key, v, leaves)
            if body is None:
                self._statements()
                return "statements", False
            self._new_in_a_row = 0
            self._run(body, leaves, v)
            return "trace", False
        self._new_in_a_row = 0
        if self.auto and not self.chosen and len(self.timed["compiled"]) >= SAMPLES:
            self._choose()
            if self.off:
                self._statements()
                return "statements", False
        self._run(body, leaves, v)
        return "compiled", True

    def _statements(self) -> None:
        """The body statement by statement, after the sinks of earlier calls have run."""
        if self._after_call:
            self.wait()
            self._after_call = False
        self._settle()
        self._learn_from = None  # a transition is learned between consecutive calls only
        self.body()

    # -- the store between calls -----------------------------------------------------------
    def _settle(self) -> None:
        """The store as the statements see it at this iteration's start: the last call's
        results put in, then the collector's frees."""
        self.flush()
        if self.collector is not None and not self._collected:
            self.collector()
            self._collected = True

    def flush(self) -> None:
        """Put the last call's results in the store (statements, checkpoints and the end of the
        loop read it; between two calls it is not kept up to date)."""
        pend = self._pending
        if pend is None:
            return
        self._pending = None
        store, ipos, pool, base = self.ex.store, self.ipos, pend.pool, pend.base
        nin = len(pool) - pend.nout
        for nid, oid, entries, stacks in pend.body.rebuild:
            j = ipos.get(nid)
            got = {}
            for p, (kind, k) in entries:
                got[_moved(p, j, base)] = pool[k if kind == "in" else nin + k]
            rows = []
            for (kind, k), axis, share, cols, alive in stacks:
                rows.append(
                    (pool[k if kind == "in" else nin + k], axis, share, _moved_cols(cols, j, base), alive)
                )
            store.load_table(nid, oid, got, rows)
        if pend.body.succ is None:
            self._learn_from = pend

    def _learn(self, struct: tuple[Any, ...], leaves: list[Any]) -> None:
        """Record where the store's values at this iteration's start came from, when the last
        iteration was a call whose successor layout is not known yet (:attr:`_Body.succ`)."""
        src, self._learn_from = self._learn_from, None
        if src is None or src.body.succ is not None:
            return
        index = {id(x): j for j, x in enumerate(src.pool)}
        feed = [index.get(id(x), -1) for x in leaves]
        if -1 in feed:  # a value neither in the call's inputs nor its outputs: never fed
            log.debug("iteration %s: a live value did not come from the last call", self.var)
            return
        src.body.succ = (struct, feed)

    def _feed(self, sig: tuple[Any, ...], v: int) -> tuple[_Body, list[Any]] | None:
        """The body and inputs of iteration ``v`` taken from the last call, where its key is
        known to compile; None where the store must be rebuilt and read."""
        pend = self._pending
        if pend is None or pend.body.succ is None:
            return None
        struct, feed = pend.body.succ
        body = self.bodies.get((sig, struct))
        if body is None:
            return None
        pool = pend.pool
        leaves = [pool[j] for j in feed]
        if CHECK_FED:  # tests: the store rebuilt and read gives the same layout and values
            self._settle()
            got_struct, got = self._flatten(v + self.offset)
            same = len(got) == len(leaves) and all(a is b for a, b in zip(got, leaves, strict=True))
            if got_struct != struct or not same:
                raise AssertionError(
                    f"iteration {v}: the inputs fed from the last call differ from the store's"
                )
        return body, leaves

    def _worth_tracing(self, v: int) -> bool:
        """auto: whether a trace may pay (module doc); False while the statements' times are
        still being taken, and for good (``off``) once they say it would not."""
        if not self.auto or self.chosen or self.bodies:
            return True
        runs = self.timed["statements"]
        if len(runs) < SAMPLES:
            return False
        wall = statistics.median(w for w, _ in runs)
        host = statistics.median(c for _, c in runs)
        share = statistics.median(c / max(w, 1e-9) for w, c in runs)
        compiling = self.ex.backend.compile_seconds() - (self._compiled0 or 0.0)
        left = self._left(v)
        if share < HOST_SHARE:
            self.off = (
                f"the host took {share:.0%} of an iteration ({wall * 1e3:.1f} ms) run statement by "
                f"statement, under {HOST_SHARE:.0%}: one compiled call would save too little "
                "(compile_iterations=True compiles it anyway)"
            )
        elif left is not None and left < MIN_LEFT:
            self.off = f"only {left} iterations remain (fewer than {MIN_LEFT}: compiling would not pay)"
        elif left is not None and left * host < compiling:
            self.off = (
                f"compiling it would take about {compiling:.1f} s (what its iterations' statements took "
                f"to compile), more than the host's {host * 1e3:.1f} ms per iteration can save over the "
                f"{left} iterations left"
            )
        if self.off:
            log.info("iteration loop over %s runs statement by statement: %s", self.var, self.off)
            return False
        return True

    def _left(self, v: int) -> int | None:
        """Iterations of the loop after ``v``, or None where its bounds are not static."""
        try:
            vals = self._grid((self.loop,))[self.var]
        except (tracing.NotTraceable, KeyError, NameError, TypeError):
            return None
        return int(np.count_nonzero(vals > v))

    def _choose(self) -> None:
        """auto: keep the compiled body where its calls were no slower than the statements."""
        c = statistics.median(w for w, _ in self.timed["compiled"])
        s = statistics.median(w for w, _ in self.timed["statements"])
        figures = f"{c * 1e3:.1f} ms per iteration against {s * 1e3:.1f} ms statement by statement"
        if c <= s:
            self.chosen = f"measured {figures}"
            log.info("iteration loop over %s: one compiled call per iteration, %s", self.var, self.chosen)
            return
        self.off = f"one compiled call took {figures} (compile_iterations=True keeps it anyway)"
        log.info("iteration loop over %s runs statement by statement: %s", self.var, self.off)
        self.wait()
        self.bodies.clear()  # the compiled calls' memory

    def _run(self, body: _Body, leaves: list[Any], v: int) -> None:
        ex = self.ex
        base = v + self.offset
        d = base - body.base
        states = [p.get_state() for p in self.pures]
        hosts = self._hosts(body, d) if body.hosts else None
        outs, new_states, sunk = body.fn(np.int32(d), leaves, states, hosts)
        # the previous call's sinks run while this one computes (an error leaves the store as
        # that call left it)
        try:
            self.wait()
        except BaseException:
            self.flush()
            raise
        if body.sinks:
            self.queued.append((body.sinks, sunk, d))
        for p, st in zip(self.pures, new_states, strict=True):
            p.set_state(st)
        # the store is rebuilt from the results only when something reads it (flush)
        self._pending = _Pending(body, base, [*leaves, *outs], len(outs))
        for h in ex.stack_hints.values():
            h.clear()
        ex.dispatches += 1
        ex.exec_count += body.execs
        self.calls += 1
        self.ran = self._after_call = True

    def _hosts(self, body: _Body, d: int) -> list[Any]:
        """The host inputs of a call at distance ``d``: those with a vectorized form from a chunk
        computed for the next :data:`HOST_CHUNK` calls at once (fewer where they are large),
        the others now."""
        got = body.ahead.get(d)
        if got is None:
            size = sum(int(np.prod(shape)) for _, shape, _, many in body.hosts if many is not None)
            n = max(1, min(HOST_CHUNK, HOST_CHUNK_ELEMENTS // max(size, 1)))
            ds = d + int(self.loop.inc) * np.arange(n, dtype=np.int64)
            cols = [
                None if many is None else np.asarray(many(ds), dtype=dt).reshape((n, *shape))
                for _, shape, dt, many in body.hosts
            ]
            body.ahead = {int(x): [None if c is None else c[k] for c in cols] for k, x in enumerate(ds)}
            got = body.ahead[d]
        return [
            tracing.host_array(fn, shape, dt, d) if g is None else g
            for g, (fn, shape, dt, _) in zip(got, body.hosts, strict=True)
        ]

    def reset(self) -> None:
        """Forget the last run's calls (a new run starts from a new store)."""
        self.queued.clear()
        self._pending = self._learn_from = None
        self._after_call = False

    def wait(self) -> None:
        """Run the sinks of the calls so far, in order, as their values arrive (a sink's error
        propagates); at the end of a run, the last call's."""
        while self.queued:
            calls, values, d = self.queued.pop(0)
            for call, x in zip(calls, values, strict=True):
                call(np.array(x), d)

    # -- tracing ---------------------------------------------------------------------------
    def _refuse(self, key: Any, why: str) -> None:
        if key is None:
            self.off = why
            log.info("iteration loop over %s runs statement by statement: %s", self.var, why)
            return
        self.refused[key] = why
        log.info(
            "iteration %d of the loop over %s (and those like it) runs statement by statement: %s",
            self.ex._env[self.var],
            self.var,
            why,
        )

    def _trace(self, key: Any, v: int, leaves: list[Any]) -> _Body | None:
        import time

        import jax

        ex = self.ex
        base = v + self.offset
        t0 = time.perf_counter()
        try:
            states = [p.get_state() for p in self.pures]
        except Exception as exc:  # noqa: BLE001 - an env before its reset: not this iteration
            self._refuse(key, f"an environment's state is not readable ({exc})")
            return None
        ctx = tracing.TraceContext(None, self.ipos)
        rebuild: list[Any] = []
        counted = [0]

        def traced(
            delta: Any, xs: list[Any], sts: list[Any], hosts: list[Any] | None
        ) -> tuple[list[Any], list[Any], list[Any]]:
            ctx.begin(delta, hosts)
            self._load(xs)
            for p, st in zip(self.pures, sts, strict=True):
                p.set_state(st)
            before = self._tables_state(base)
            start = ex.exec_count
            tracing.current = ctx
            try:
                self.body()
            finally:
                tracing.current = None
            counted[0] = ex.exec_count - start
            after = self._tables_state(base)
            index = {id(x): k for k, x in enumerate(xs)}
            new: list[Any] = []
            made: dict[int, int] = {}

            def src(x: Any) -> tuple[str, int]:
                k = index.get(id(x))
                if k is not None:
                    return ("in", k)
                if id(x) not in made:
                    made[id(x)] = len(new)
                    new.append(x)
                return ("out", made[id(x)])

            rebuild.clear()
            for tk in sorted(before.keys() | after.keys()):
                b, a = before.get(tk, ([], [])), after.get(tk, ([], []))
                if _same(b, a):
                    continue
                entries = [(p, src(x)) for p, x in a[0]]
                stacks = [(src(x), axis, share, cols, alive) for x, axis, share, cols, alive in a[1]]
                rebuild.append((tk[0], tk[1], entries, stacks))
            return new, [p.get_state() for p in self.pures], list(ctx.sink_values)

        counters = (ex.exec_count, ex.dispatches)

        def trace(hosts: list[Any] | None) -> Any:
            snap = ex.store.snapshot()
            hints = {k: dict(h) for k, h in ex.stack_hints.items()}
            try:
                return jax.jit(traced).trace(np.int32(0), leaves, states, hosts)
            finally:  # the trace ran the body on tracers: put back what the store held
                ex.store.restore(snap)
                self._restore_hints(hints)
                for p, st in zip(self.pures, states, strict=True):
                    p.set_state(st)
                ex.exec_count, ex.dispatches = counters

        fn, why = None, ""
        try:
            found = trace(None)  # finds the host values the body needs
            if ctx.hosts:  # again, with them as inputs instead of callbacks
                found = trace([np.zeros(shape, dt) for _, shape, dt, _ in ctx.hosts])
            fn = found.lower().compile()
        except Exception as exc:  # noqa: BLE001 - any failure: this key runs as before
            why = (
                str(exc)
                if isinstance(exc, tracing.NotTraceable)
                else f"tracing it failed ({type(exc).__name__}: {exc})"
            )
        if fn is None:
            self._refuse(key, why)
            return None
        body = self.bodies[key] = _Body(fn, base, list(rebuild), list(ctx.hosts), list(ctx.sinks), counted[0])
        log.info(
            "iteration loop over %s: the body of iteration %d traced and compiled as one call in "
            "%.1f s (%d live values in, %d tables rebuilt per call)",
            self.var,
            v,
            time.perf_counter() - t0,
            len(leaves),
            len(rebuild),
        )
        return body

    def _tables_state(self, base: int) -> dict[tuple[int, int], tuple[list[Any], list[Any]]]:
        """Per non-empty table: its entries ``(relative point, value)`` and stacks ``(array,
        axis, share, relative cols, alive)``."""
        out = {}
        ipos = self.ipos
        for nid, tabs in self.ex.store.all_tables().items():
            j = ipos.get(nid)
            for oid, tab in enumerate(tabs):
                t = type(tab)
                if not len(tab):
                    continue
                if t is not dict and t is not RowsTable:
                    raise tracing.NotTraceable("a block-stored table holds values")
                entries = [(_moved(p, j, -base), x) for p, x in dict.items(tab)]
                stacks = []
                if t is RowsTable:
                    for st in tab.stacks():
                        stacks.append(
                            (st.arr, st.axis, st.share, _moved_cols(st.cols, j, -base), st.alive.copy())
                        )
                out[(nid, oid)] = (entries, stacks)
        return out

    def _restore_hints(self, hints: dict[Any, dict[Any, Any]]) -> None:
        for k, h in self.ex.stack_hints.items():
            h.clear()
            h.update(hints.get(k, {}))


def _moved(p: tuple[int, ...], j: int | None, by: int) -> tuple[int, ...]:
    """Point ``p`` moved ``by`` along coordinate ``j`` (the iteration dim; None: not moved)."""
    return p if j is None else (*p[:j], p[j] + by, *p[j + 1 :])


def _moved_cols(cols: np.ndarray, j: int | None, by: int) -> np.ndarray:
    """:func:`_moved` for the points of a stack, one per row of ``cols`` (a copy when moved)."""
    if j is None:
        return cols
    cols = cols.copy()
    cols[:, j] += by
    return cols


def _same(b: tuple[list[Any], list[Any]], a: tuple[list[Any], list[Any]]) -> bool:
    """Whether a table holds the same points and values (by identity) before and after."""
    if len(b[0]) != len(a[0]) or len(b[1]) != len(a[1]):
        return False
    if any(p != q or x is not y for (p, x), (q, y) in zip(b[0], a[0], strict=True)):
        return False
    for x, y in zip(b[1], a[1], strict=True):
        if (
            x[0] is not y[0]
            or x[1:3] != y[1:3]
            or not np.array_equal(x[3], y[3])
            or not np.array_equal(x[4], y[4])
        ):
            return False
    return True
