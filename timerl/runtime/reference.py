"""A schedule-free reference evaluator: demand-driven, memoised, one point at a time.

It is the independent check of the interpreter: it uses no AST, gathers inputs with its
own NumPy code (``np.stack``/``np.take`` on stored NumPy values) and shares only the op
kernels (``backend.run``) and the RNG-seed contract with the executor.

Order of evaluation: the dims that occur in some node's domain are walked in
lexicographic order (``pdg.dims`` order). At each prefix point, the nodes whose domain
ends at that prefix are evaluated, effectful ones first (UDF, SINK, SET_SYMBOL, RAND_*,
so sinks fire and environments step), then, with ``all_points=True``, the pure ones.
Each evaluation pulls its inputs (data and ``order_only`` edges) on demand, with an
explicit stack (no recursion limit), memoising every ``(node, point)``.

A dynamic bound ``T`` of dim ``t`` is found per enclosing point (the coordinates of the
dims before ``t`` in its SET_SYMBOL node's domain) by evaluating the SET_SYMBOL node at
``t = 0, 1, ...`` until its input is all true; ``T = t + 1``. A node that needs ``T``
(in an edge ``phi``/``cond``/``select``, its ``cond`` or op attributes) before it is
known triggers that probing; a node needed to find its own bound is a cycle and raises
:class:`~timerl.errors.BoundError`.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable
from typing import Any

import numpy as np

from timerl.backends.base import AbstractBackend
from timerl.errors import BoundError, RuntimeExecutionError
from timerl.pdg.ir import PDG, SLICE_VAR, Edge, Node
from timerl.pdg.ops import EFFECTFUL_OPS, OpKind
from timerl.pdg.sizes import bucket, resolve_batch
from timerl.plan.layout import NumpyOps, input_layout, pads_to_bucket
from timerl.runtime.common import (
    draw_points,
    eval_shape,
    point_dict,
    run_seeds,
    udf_outputs,
    user_code_error,
)
from timerl.symbolic import Sym, evaluate, free_symbols

log = logging.getLogger(__name__)

Point = tuple[int, ...]
Key = tuple[int, Point]  # (node id, point)

MAX_PROBES = 10**6
"""A dynamic bound not found after this many points raises."""


class ReferenceEvaluator:
    """Evaluates every effectful node point (and, optionally, every node point) of a PDG."""

    def __init__(self, pdg: PDG, backend: AbstractBackend, seed: int = 0, all_points: bool = True) -> None:
        self.pdg = pdg
        self.backend = backend
        self.seeds = run_seeds(
            pdg.agent_dims, {d: pdg.static_bounds[pdg.bound_of(d)] for d in pdg.agent_dims}, seed
        )
        self.seed = self.seeds.base
        self.all_points = all_points
        self.memo: dict[Key, list[np.ndarray]] = {}
        self.static: dict[Sym, int] = {s: int(v) for s, v in pdg.static_bounds.items()}
        self.found: dict[Sym, dict[Point, int]] = {b: {} for b in pdg.dynamic_bounds}
        self._probe: dict[tuple[Sym, Point], int] = {}
        self._setter: dict[Sym, Node] = {}
        for n in pdg:
            if n.op.kind is OpKind.SET_SYMBOL:
                b, d = n.op.attr("bound"), n.op.attr("dim")
                if d not in n.domain or n.domain[-1] is not d:
                    raise BoundError(f"SET_SYMBOL {n.label}: dim {d} must be the last dim of its domain")
                self._setter[b] = n
        for b in pdg.dynamic_bounds:
            if b not in self._setter:
                raise BoundError(f"dynamic bound {b} has no SET_SYMBOL node")
        self._bound_of = {d: b for d, b in pdg.dims}
        self._edges = {n.id: [e for e in pdg.edges if e.sink == n.id] for n in pdg}
        self._data = {
            nid: sorted((e for e in es if not e.order_only), key=lambda e: e.iid)
            for nid, es in self._edges.items()
        }
        self._needs = {n.id: self._needed_bounds(n) for n in pdg}

    # -- public -------------------------------------------------------------------------------
    def run(self) -> dict[int, dict[tuple[int, Point], np.ndarray]]:
        """Walk the program; return ``{node id: {(oid, point): value}}``."""
        used = {d for n in self.pdg for d in n.domain}
        dims = [d for d, _ in self.pdg.dims if d in used]
        levels: list[list[Node]] = [[] for _ in range(len(dims) + 1)]
        pos = {d: k for k, d in enumerate(dims)}
        for n in self.pdg:
            if not self.all_points and n.op.kind not in EFFECTFUL_OPS:
                continue
            k = max((pos[d] + 1 for d in n.domain), default=0)
            levels[k].append(n)
        for lv in levels:
            lv.sort(key=lambda n: (n.op.kind not in EFFECTFUL_OPS, n.id))
        self._walk(dims, levels, 0, {})
        out: dict[int, dict[tuple[int, Point], np.ndarray]] = {n.id: {} for n in self.pdg}
        for (nid, p), vals in self.memo.items():
            for oid, x in enumerate(vals):
                out[nid][(oid, p)] = x
        return out

    def bound(self, sym: Sym, key: Point) -> int:
        """The dynamic bound ``sym`` for enclosing point ``key``, probing until found."""
        while key not in self.found[sym]:
            self.demand(self._probe_key(sym, key))
        return self.found[sym][key]

    def demand(self, key: Key) -> None:
        """Evaluate ``(node id, point)`` and, first, everything it needs (explicit stack)."""
        if key in self.memo:
            return
        stack = [key]
        on_path = {key}
        while stack:
            top = stack[-1]
            dep = self._first_missing(*top)
            if dep is None:
                self._compute(*top, reader=stack[-2] if len(stack) > 1 else None)
                stack.pop()
                on_path.discard(top)
                continue
            if dep in on_path:
                n = self.pdg.nodes[dep[0]]
                if n.op.kind is OpKind.SET_SYMBOL:
                    raise BoundError(
                        f"{self.pdg.nodes[top[0]].label} at {top[1]} needs the bound {n.op.attr('bound')}, "
                        f"which depends on it (the done-signal {n.label} at {dep[1]} needs it)"
                    )
                raise RuntimeExecutionError(f"cyclic dependence: {n.label} at {dep[1]} depends on itself")
            stack.append(dep)
            on_path.add(dep)

    # -- walking --------------------------------------------------------------------------------
    def _walk(self, dims: list[Sym], levels: list[list[Node]], k: int, assign: dict[Sym, int]) -> None:
        for n in levels[k]:
            p = tuple(assign[d] for d in n.domain)
            if (n.id, p) not in self.memo and self._in_domain(n, p):
                self.demand((n.id, p))
        if k == len(dims):
            return
        d = dims[k]
        b = self._bound_of[d]
        if b in self.static:
            for x in range(self.static[b]):
                assign[d] = x
                self._walk(dims, levels, k + 1, assign)
        else:
            setter = self._setter[b]
            enc = setter.domain[:-1]
            missing = [e for e in enc if e not in assign]
            if missing:
                raise BoundError(f"dim {d}'s bound {b} depends on {missing}, which come after it")
            key = tuple(assign[e] for e in enc)
            t = 0
            while True:
                n_t = self.found[b].get(key)
                if n_t is not None and t >= n_t:
                    break
                if t >= MAX_PROBES:
                    raise BoundError(f"{b} not found after {MAX_PROBES} points of {d} at {key}")
                assign[d] = t
                self._walk(dims, levels, k + 1, assign)
                if key not in self.found[b]:
                    self.demand((setter.id, key + (t,)))
                t += 1
        del assign[d]

    # -- per-point evaluation -------------------------------------------------------------------
    def _expr_syms(self, n: Node) -> frozenset[Sym]:
        """Symbols used by the node's expressions: its cond, op attributes, in-edges."""
        syms = free_symbols(n.cond)
        if n.op.kind is not OpKind.SET_SYMBOL:  # its attributes name the bound it sets
            syms |= n.op.symbols()
        for e in self._edges[n.id]:
            if e.order_only:  # bounds in its phi are the source's (see _order_points)
                syms |= free_symbols(e.cond)
                continue
            syms |= free_symbols(e.cond).union(*(free_symbols(c) for c in e.phi))
            if e.select is not None:
                syms |= free_symbols(e.select)
        return syms

    def _needed_bounds(self, n: Node) -> list[tuple[Sym, tuple[int, ...], bool]]:
        """``(bound, positions of its enclosing dims in n's domain, required)`` per dynamic bound.

        ``required``: the node's expressions use it, so it must be known before the node
        runs; otherwise it is only passed on (when known) in the op's env.
        """
        used = self._expr_syms(n)
        out = []
        for b in sorted(self.pdg.dynamic_bounds, key=lambda s: s.name):
            enc = self._setter[b].domain[:-1]
            if not set(enc) <= set(n.domain):
                if b in used:
                    raise BoundError(
                        f"{n.label} (domain {[s.name for s in n.domain]}) uses {b}, which varies with "
                        f"{[s.name for s in enc]}"
                    )
                continue
            out.append((b, tuple(n.domain.index(e) for e in enc), b in used))
        return out

    def _env(self, nid: int, p: Point) -> tuple[dict[Sym, int], tuple[Sym, Point] | None]:
        n = self.pdg.nodes[nid]
        env = dict(self.static)
        env.update(zip(n.domain, p, strict=True))
        unknown: list[tuple[Sym, Point]] = []
        for b, idx, required in self._needs[nid]:
            key = tuple(p[j] for j in idx)
            val = self.found[b].get(key)
            if val is not None:
                env[b] = val
            elif required:
                unknown.append((b, key))
        if unknown:
            if not self._bound_free(n, env, unknown):
                return env, unknown[0]
            # the expressions do not depend on the bound here: evaluate them at its lower bound
            env.update({b: self._probe.get((b, key), 0) + 1 for b, key in unknown})
        return env, None

    def _bound_free(self, n: Node, env: dict[Sym, int], unknown: list[tuple[Sym, Point]]) -> bool:
        """Whether ``n``'s edge expressions at this point are the same for every value of the
        unknown bounds consistent with what was probed (``T = lb`` and ``T`` unbounded agree).

        Then the point runs before its episode's end is known (acting at ``t`` reads
        ``x[t - 1]`` under a condition ``t - 1 < T``). Op attributes must not use the bound.
        """
        if n.op.symbols() & {b for b, _ in unknown}:
            return False
        lo, hi = dict(env), dict(env)
        for b, key in unknown:
            lo[b] = self._probe.get((b, key), 0) + 1
            hi[b] = 1 << 40

        def same(x: Any) -> bool:
            return _same_value(evaluate(x, lo), evaluate(x, hi))

        try:
            if not same(n.cond):
                return False
            for e in self._edges[n.id]:
                if e.order_only:
                    continue
                if not same(e.cond):
                    return False
                if not evaluate(e.cond, lo):
                    continue  # an edge not read here
                if not all(same(c) for c in e.phi) or (e.select is not None and not same(e.select)):
                    return False
        except (KeyError, TypeError):
            return False
        return True

    def _probe_key(self, b: Sym, key: Point) -> Key:
        t = self._probe.get((b, key), 0)
        return (self._setter[b].id, key + (t,))

    def _in_domain(self, n: Node, p: Point) -> bool:
        env = dict(self.static)
        env.update(zip(n.domain, p, strict=True))
        for d, x in zip(n.domain, p, strict=True):
            b = self._bound_of[d]
            if x < 0 or (b in self.static and x >= self.static[b]):
                return False
        unknown: list[tuple[Sym, Point]] = []
        for b, idx, required in self._needs[n.id]:
            key = tuple(p[j] for j in idx)
            if key in self.found[b]:
                env[b] = self.found[b][key]
            elif required:
                unknown.append((b, key))
        if unknown:
            # below the probed lower bound, and with expressions that do not depend on the
            # bound's value, the point is decided without knowing the episode's end
            lbs = {b: self._probe.get((b, key), 0) + 1 for b, key in unknown}
            below = all(
                x < lbs[self._bound_of[d]]
                for d, x in zip(n.domain, p, strict=True)
                if self._bound_of[d] in lbs
            )
            if below and self._bound_free(n, env, unknown):
                env.update(lbs)
            else:
                for b, key in unknown:
                    env[b] = self.bound(b, key)
        for d, x in zip(n.domain, p, strict=True):
            b = self._bound_of[d]
            if b in env and x >= env[b]:
                return False
        return bool(evaluate(n.cond, env))

    def _branch(self, nid: int, env: dict[Sym, int], p: Point) -> list[Edge]:
        """The data edges read at this point (a MERGE reads its first true branch)."""
        n = self.pdg.nodes[nid]
        if n.op.kind is not OpKind.MERGE:
            return self._data[nid]
        for e in self._data[nid]:
            if evaluate(e.cond, env):
                return [e]
        raise RuntimeExecutionError(
            f"{n.label} at {point_dict(n.domain, p)}: no branch of this branching definition covers the point"
        )

    @staticmethod
    def _src_points(e: Edge, env: dict[Sym, int]) -> Iterable[Point]:
        comps = [evaluate(c, env) for c in e.phi]
        return itertools.product(*(c if isinstance(c, range) else (c,) for c in comps))

    def _first_missing(self, nid: int, p: Point) -> Key | None:
        if (nid, p) in self.memo:
            return None
        env, unknown = self._env(nid, p)
        if unknown is not None:
            return self._probe_key(*unknown)
        for e in self._branch(nid, env, p):
            for q in self._src_points(e, env):
                if (e.src, q) not in self.memo:
                    return (e.src, q)
        for e in self._edges[nid]:
            if e.order_only and evaluate(e.cond, env):
                for q in self._order_points(e, env):
                    if (e.src, q) not in self.memo:
                        return (e.src, q)
        return None

    def _order_points(self, e: Edge, env: dict[Sym, int]) -> Iterable[Point]:
        """Source points of an order edge; a dynamic bound in its phi is the *source's*
        (``reset[i]`` after ``step[i - 1, 0:T]``: the ``T`` of episode ``i - 1``)."""
        src = self.pdg.nodes[e.src]
        dyn = [b for b in self.pdg.dynamic_bounds if any(b in free_symbols(c) for c in e.phi)]
        if not dyn:
            return list(self._src_points(e, env))
        senv = dict(env)
        for b in dyn:
            enc = self._setter[b].domain[:-1]
            key = tuple(
                evaluate(e.phi[src.domain.index(d)], env) for d in enc
            )  # the source's enclosing coordinates (points, not slices)
            senv[b] = self.bound(b, key)
        return list(self._src_points(e, senv))

    def _gather(self, e: Edge, env: dict[Sym, int]) -> np.ndarray:
        src = self.pdg.nodes[e.src]
        nb = len(src.batch)
        comps = [evaluate(c, env) for c in e.phi]
        sizes = [len(c) for c in comps if isinstance(c, range)]
        if not sizes and e.select is None:
            return self.memo[(e.src, tuple(comps))][e.oid]
        k = next((j for j, c in enumerate(comps) if isinstance(c, range)), None)
        vals = []
        for q in self._src_points(e, env):
            x = self.memo[(e.src, q)][e.oid]
            if e.select is not None:
                senv = dict(env)
                if k is not None:
                    senv[SLICE_VAR] = q[k]
                x = np.take(x, int(evaluate(e.select, senv)), axis=nb)
            vals.append(x)
        if not sizes:
            return vals[0]
        batch = resolve_batch(tuple(src.batch), env)
        if not vals:
            spec = src.outputs[e.oid]
            shape = eval_shape(spec.shape, env, src)
            if e.select is not None:
                shape = shape[1:]
            return np.zeros(batch + tuple(sizes) + shape, dtype=spec.dtype.numpy)
        flat = np.stack(vals, axis=nb)  # batch + (prod(sizes),) + per-point
        flat = flat.reshape(batch + tuple(sizes) + flat.shape[nb + 1 :])
        if pads_to_bucket(self.pdg.nodes[e.sink], e):  # rows 0:T of an axis padded to bucket(T)
            widths = [(0, 0)] * flat.ndim
            widths[nb] = (0, bucket(sizes[0]) - sizes[0])
            flat = np.pad(flat, widths)
        return flat

    def _compute(self, nid: int, p: Point, reader: Key | None) -> None:
        n = self.pdg.nodes[nid]
        env, unknown = self._env(nid, p)
        assert unknown is None
        pd = point_dict(n.domain, p)
        if not self._in_domain(n, p):
            who = f" (read by {self.pdg.nodes[reader[0]].label} at {reader[1]})" if reader else ""
            raise RuntimeExecutionError(f"{n.label} is evaluated at {pd}, outside its domain{who}")
        edges = self._branch(nid, env, p)
        layouts = [input_layout(self.pdg.nodes[e.src], n, e) for e in edges]
        ins = [lay.apply(self._gather(e, env), env, NumpyOps) for e, lay in zip(edges, layouts, strict=True)]
        be, kind = self.backend, n.op.kind
        batch = resolve_batch(tuple(n.batch), env)
        outs: list[np.ndarray]
        if kind is OpKind.MERGE:
            x = ins[0]
            if n.batch and not layouts[0].batched:  # unbatched branch: broadcast
                x = np.broadcast_to(x, batch + tuple(np.shape(x))).copy()
            outs = [x]
        elif kind is OpKind.EVAL_SYMBOL:
            v = np.asarray(evaluate(n.op.attr("expr"), env), dtype=n.op.attr("dtype").numpy)
            outs = [np.broadcast_to(v, batch).copy()]
        elif kind is OpKind.SET_SYMBOL:
            b = n.op.attr("bound")
            key, t = p[:-1], p[-1]
            if bool(np.all(ins[0])):
                self.found[b].setdefault(key, t + 1)
                log.debug("reference: %s = %d at %s", b, t + 1, key)
            self._probe[(b, key)] = max(self._probe.get((b, key), 0), t + 1)
            outs = [ins[0]] if n.outputs else []
        elif kind is OpKind.UDF:
            fn = n.op.attr("fn")
            dlpack = getattr(fn, "array_io", "numpy") == "dlpack"  # backend tensors in and out
            try:
                if dlpack:
                    res = fn([be.to_dlpack(be.from_numpy(np.array(x))) for x in ins], pd)
                else:
                    res = fn([np.array(x) for x in ins], pd)
            except Exception as exc:
                raise user_code_error("UDF", n, exc, pd) from exc
            if dlpack:
                from timerl.runtime.common import udf_dlpack_outputs

                res = [np.array(be.to_numpy(x)) for x in udf_dlpack_outputs(n, res, pd, be)]
            outs = udf_outputs(n, res, pd)
        elif kind is OpKind.SINK:
            try:
                n.op.attr("fn")(np.array(ins[0]), pd)
            except Exception as exc:
                raise user_code_error("sink", n, exc, pd) from exc
            outs = []
        elif kind in (OpKind.RAND_UNIFORM, OpKind.RAND_NORMAL) and n.op.attr("point_dims", ()):
            y = draw_points(be, n, self.seeds, p, [s for s, _ in self.pdg.dims], env)
            outs = [np.array(be.to_numpy(y))]
        else:
            if kind in (OpKind.RAND_UNIFORM, OpKind.RAND_NORMAL):
                be.seed(self.seeds.point_seed(n, p))
            flags = [lay.batched for lay in layouts]
            y = be.run(n.op, [be.from_numpy(np.array(x)) for x in ins], batch, flags, env)
            outs = [np.array(be.to_numpy(y))]
        self.memo[(nid, p)] = outs


def reference_evaluate(
    pdg: PDG, backend: AbstractBackend, seed: int = 0, all_points: bool = True
) -> dict[int, dict[tuple[int, Point], np.ndarray]]:
    """Evaluate ``pdg`` without a schedule; ``{node id: {(oid, point): NumPy value}}``.

    With ``all_points=False`` only what effectful nodes need is computed. UDFs are bound
    to the static bounds first, as ``ctx.compile`` does.
    """
    for n in pdg:
        if n.op.kind is OpKind.UDF and hasattr(n.op.attr("fn"), "bind"):
            n.op.attr("fn").bind(pdg.static_bounds)
    return ReferenceEvaluator(pdg, backend, seed, all_points).run()


def _same_value(a: Any, b: Any) -> bool:
    return bool(a == b)  # ranges (slices) compare by their points without building them
