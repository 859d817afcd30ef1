"""Random well-defined RT programs, their timerl rendering, and an independent interpreter.

A program is a small description (:class:`Program`): tensors defined by expressions or by
forward/backward recurrences over ``t``, reading earlier tensors through a menu of
affine indices (shifts clamped at the edges, reversals, ``t // 2``, constants) and
windows with reductions, ``where`` on symbolic and on boolean-tensor conditions, int64
tensors, stacks, optionally a parameter ``w`` trained by SGD over ``i``.

:func:`reference` evaluates a description by unrolling it point by point with
``jax.numpy`` (``jax.grad`` of the unrolled iteration for the parameter's gradient); it
shares nothing with timerl's lowering, autodiff, scheduler or runtime. :func:`render`
builds the same program with the timerl API.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# Index forms on a dim ``d`` with bound ``D`` (reader and source share the dim's symbol).
# name -> (uses d, timerl builder, python evaluator)
FORMS: dict[str, tuple[bool, Any, Any]] = {
    "d": (True, lambda d, D, trl: d, lambda d, D: d),
    "max(d-1,0)": (True, lambda d, D, trl: trl.max(d - 1, 0), lambda d, D: max(d - 1, 0)),
    "min(d+1,D-1)": (True, lambda d, D, trl: trl.min(d + 1, D - 1), lambda d, D: min(d + 1, D - 1)),
    "D-1-d": (True, lambda d, D, trl: D - 1 - d, lambda d, D: D - 1 - d),
    "d//2": (True, lambda d, D, trl: d // 2, lambda d, D: d // 2),
    "0": (False, lambda d, D, trl: 0, lambda d, D: 0),
    "D-1": (False, lambda d, D, trl: D - 1, lambda d, D: D - 1),
}
# Windows over t: name -> (timerl slice builder, python (lo, hi))
WINDOWS: dict[str, tuple[Any, Any]] = {
    "max(t-1,0):t+1": (
        lambda t, T, trl: slice(trl.max(t - 1, 0), t + 1),
        lambda t, T: (max(t - 1, 0), t + 1),
    ),
    "t:T": (lambda t, T, trl: slice(t, T), lambda t, T: (t, T)),
    "0:t+1": (lambda t, T, trl: slice(0, t + 1), lambda t, T: (0, t + 1)),
    "t:min(t+2,T)": (lambda t, T, trl: slice(t, trl.min(t + 2, T)), lambda t, T: (t, min(t + 2, T))),
}
UNARY = ("tanh", "sigmoid", "abs", "relu", "neg")
BINARY = ("add", "sub", "mul")
REDUCE = ("sum", "mean", "max")
CONDS = ("t%2==0", "t<T-1", "i%2==0")


@dataclass
class Tensor:
    name: str
    kind: str  # "expr" | "fwd" | "bwd"
    domain: tuple[str, ...]
    expr: Any = None  # kind "expr"
    init: Any = None  # recurrences: value at the first point (t = 0 forward, T - 1 backward)
    step: Any = None  # recurrences: value from the neighbour ("self")


@dataclass
class Program:
    dims: tuple[str, ...]
    bounds: dict[str, int]
    tensors: list[Tensor] = field(default_factory=list)
    param: tuple[str, ...] | None = None  # the parameter's domain: () or ("i",); None: no parameter
    loss: str | None = None  # name of the tensor whose squared sum is the loss
    lr: float = 0.1
    dynamic_t: bool = False  # T found at run time, per i: T_i = bounds["t"] + i % 2

    def t_bound(self, p: dict[str, int]) -> int:
        """The bound of t at point ``p`` (per i when dynamic)."""
        return self.bounds["t"] + (p["i"] % 2 if self.dynamic_t else 0)

    def describe(self) -> str:
        lines = [
            f"dims={self.dims} bounds={self.bounds} dynamic_t={self.dynamic_t} param={self.param} loss={self.loss}"
        ]
        for x in self.tensors:
            body = x.expr if x.kind == "expr" else f"init={x.init} step={x.step}"
            lines.append(f"  {x.name}[{','.join(x.domain)}] {x.kind}: {body}")
        return "\n".join(lines)


# -- generation --------------------------------------------------------------------------


def _dom(e: Any, prog: Program, by_name: dict[str, Tensor]) -> set[str]:
    k = e[0]
    if k == "const":
        return set()
    if k in ("sym", "isym"):
        return {e[1]}
    if k == "param":
        return set(prog.param or ())
    if k in ("stack", "rwhere"):
        return set().union(*(_dom(x, prog, by_name) for x in e[1:]))
    if k == "self":
        return set()
    if k == "read":
        src = by_name[e[1]]
        return {d for d, f in zip(src.domain, e[2], strict=True) if FORMS[f][0]}
    if k == "win":
        src = by_name[e[1]]
        return {d for d in src.domain if d != "t"} | {"t"}
    if k == "un":
        return _dom(e[2], prog, by_name)
    if k == "bin":
        return _dom(e[2], prog, by_name) | _dom(e[3], prog, by_name)
    if k == "where":
        return {e[1][0]} | _dom(e[2], prog, by_name) | _dom(e[3], prog, by_name)
    raise AssertionError(k)


def _gen_expr(rng: random.Random, prog: Program, avail: list[Tensor], target: tuple[str, ...], depth: int,
              allow_self: bool) -> Any:  # fmt: skip
    leaves = ["const", "sym"]
    if avail:
        leaves += ["read", "read", "win"]
    if prog.param is not None and set(prog.param) <= set(target):
        leaves.append("param")
    if allow_self:
        leaves += ["self", "self"]
    if depth <= 0 or rng.random() < 0.35:
        k = rng.choice(leaves)
        if k == "const":
            return ("const", round(rng.uniform(-1, 1), 2) if rng.random() < 0.7 else (0.5, -0.25))
        if k == "sym":
            if not target:
                return ("const", 0.3)
            return ("isym" if rng.random() < 0.3 else "sym", rng.choice(target))
        if k == "param":
            return ("param",)
        if k == "self":
            return ("self",)
        if k == "read":
            # With SGD over i, iteration i reads only its own i (the interpreter unrolls one
            # iteration at a time with that iteration's parameter).
            per_i = prog.param == ("i",) or prog.dynamic_t
            cands = [x for x in avail if not (per_i and "i" in x.domain and "i" not in target)]
            if not cands:
                return ("const", 0.2)
            src = rng.choice(cands)
            forms = [
                "d"
                if per_i and d == "i"
                else rng.choice(list(FORMS))
                if d in target
                else rng.choice(["0", "D-1"])
                for d in src.domain
            ]
            return ("read", src.name, tuple(forms))
        with_t = [x for x in avail if "t" in x.domain and set(x.domain) <= set(target)]
        if not with_t or "t" not in target:
            return ("const", 0.1)
        return ("win", rng.choice(with_t).name, rng.choice(list(WINDOWS)), rng.choice(REDUCE))
    r = rng.random()
    if r < 0.25:
        return ("un", rng.choice(UNARY), _gen_expr(rng, prog, avail, target, depth - 1, allow_self))
    if r < 0.35:
        kind = rng.choice(["stack", "rwhere"])
        parts = [
            _gen_expr(rng, prog, avail, target, depth - 1, allow_self)
            for _ in range(2 if kind == "stack" else 3)
        ]
        return (kind, *parts)
    if r < 0.85:
        a = _gen_expr(rng, prog, avail, target, depth - 1, allow_self)
        b = _gen_expr(rng, prog, avail, target, depth - 1, allow_self)
        return ("bin", rng.choice(BINARY), a, b)
    cands = [c for c in CONDS if c[0] in target]
    if not cands:
        return _gen_expr(rng, prog, avail, target, depth - 1, allow_self)
    a = _gen_expr(rng, prog, avail, target, depth - 1, allow_self)
    b = _gen_expr(rng, prog, avail, target, depth - 1, allow_self)
    return ("where", rng.choice(cands), a, b)


def _has(e: Any, kind: str) -> bool:
    if not isinstance(e, tuple) or not e:
        return False
    return e[0] == kind or any(
        _has(x, kind) for x in e[1:] if isinstance(x, tuple) and x and isinstance(x[0], str)
    )


def generate(seed: int) -> Program:
    """A random well-defined program (deterministic in ``seed``)."""
    rng = random.Random(seed)
    dims = ("t",) if rng.random() < 0.45 else ("i", "t")
    bounds = {"t": rng.randint(2, 5)}
    if "i" in dims:
        bounds["i"] = rng.randint(2, 3)
    prog = Program(dims, bounds, dynamic_t="i" in dims and rng.random() < 0.3)
    if rng.random() < 0.6:
        prog.param = ("i",) if "i" in dims and rng.random() < 0.7 else ()
    by_name: dict[str, Tensor] = {}
    for k in range(rng.randint(2, 6)):
        name = f"x{k}"
        kind = rng.choice(["expr", "expr", "fwd", "bwd"])
        if kind == "expr":
            target = tuple(d for d in dims if rng.random() < 0.8) or ("t",)
            if prog.dynamic_t and "t" in target:
                target = ("i", "t")
            e = _gen_expr(rng, prog, prog.tensors, target, rng.randint(1, 3), False)
            dom = _dom(e, prog, by_name)
            if prog.dynamic_t and "t" in dom and "i" not in dom:  # one T per i: t needs i
                e = ("bin", "add", e, ("bin", "mul", ("sym", "i"), ("const", 0.0)))
                dom.add("i")
            x = Tensor(name, "expr", tuple(d for d in dims if d in dom), expr=e)
        else:
            target = tuple(d for d in dims if d == "t" or rng.random() < 0.6 or prog.dynamic_t)
            init = _gen_expr(rng, prog, [], tuple(d for d in target if d != "t"), 1, False)
            step = _gen_expr(rng, prog, prog.tensors, target, rng.randint(1, 3), True)
            if not _has(step, "self"):
                step = ("bin", "add", ("bin", "mul", ("const", 0.5), ("self",)), step)
            x = Tensor(name, kind, target, init=init, step=step)
        prog.tensors.append(x)
        by_name[name] = x
    if prog.param is not None:
        # the loss reads w, so it always has a gradient
        last = prog.tensors[-1]
        e = ("bin", "mul", ("read", last.name, tuple("d" for _ in last.domain)), ("param",))
        dom = _dom(e, prog, by_name)
        loss = Tensor(f"x{len(prog.tensors)}", "expr", tuple(d for d in dims if d in dom), expr=e)
        prog.tensors.append(loss)
        prog.loss = loss.name
    return prog


# -- the independent interpreter ---------------------------------------------------------


def _points(domain: tuple[str, ...], prog: Program) -> list[tuple[int, ...]]:
    """Every point of ``domain`` (t up to each i's own bound when T is dynamic)."""
    import itertools

    out = []
    for pt in itertools.product(
        *(range(prog.bounds[d] + (1 if d == "t" and prog.dynamic_t else 0)) for d in domain)
    ):
        p = dict(zip(domain, pt, strict=True))
        if "t" in p and ("i" in p or not prog.dynamic_t) and p["t"] >= prog.t_bound(p):
            continue
        out.append(pt)
    return out


def reference(prog: Program, w0: np.ndarray) -> dict[str, dict[tuple[int, ...], np.ndarray]]:
    """Every tensor's value at every point of its domain (and ``"w"``, ``"w.grad"``)."""
    import jax
    import jax.numpy as jnp

    by_name = {x.name: x for x in prog.tensors}
    B = prog.bounds
    iters = B.get("i", 1) if prog.param == ("i",) else 1

    def run(wv: Any, i_fixed: int | None) -> tuple[dict, Any]:
        memo: dict[tuple[str, tuple[int, ...]], Any] = {}

        def val(name: str, pt: dict[str, int]) -> Any:
            x = by_name[name]
            key = (name, tuple(pt[d] for d in x.domain))
            if key in memo:
                return memo[key]
            p = {d: pt[d] for d in x.domain}
            if x.kind == "expr":
                v = ev(x.expr, p, None)
            elif x.kind == "fwd":
                if p["t"] == 0:
                    v = ev(x.init, p, None)
                else:
                    q = dict(p, t=p["t"] - 1)
                    v = ev(x.step, q, (name, q))
            else:
                if p["t"] == prog.t_bound(p) - 1:
                    v = ev(x.init, p, None)
                else:
                    q = dict(p, t=p["t"] + 1)
                    v = ev(x.step, p, (name, q))
            v = jnp.asarray(v, jnp.float32)
            if x.kind != "expr":  # a recurrence has one declared shape; a branch value is broadcast to it
                v = jnp.broadcast_to(v, _shape(x, prog))
            memo[key] = v
            return v

        def ev(e: Any, p: dict[str, int], self_at: Any) -> Any:
            k = e[0]
            if k == "const":
                return jnp.asarray(e[1], jnp.float32)
            if k == "sym":
                return jnp.asarray(float(p[e[1]]), jnp.float32)
            if k == "isym":  # an int64 tensor 2 d + 1
                return jnp.asarray(float(2 * p[e[1]] + 1), jnp.float32)
            if k == "stack":  # stack of two values (broadcast), summed over the new axis
                a, b = ev(e[1], p, self_at), ev(e[2], p, self_at)
                return jnp.sum(jnp.stack(jnp.broadcast_arrays(a, b)), axis=0)
            if k == "rwhere":  # a boolean tensor as the condition
                c, a, b = (ev(x, p, self_at) for x in e[1:])
                return jnp.where(c > 0.0, a, b)
            if k == "param":
                return wv
            if k == "self":
                return val(self_at[0], self_at[1])
            if k == "read":
                src = by_name[e[1]]
                q = {
                    d: FORMS[f][2](p[d] if d in p else 0, prog.t_bound(p) if d == "t" else B[d])
                    for d, f in zip(src.domain, e[2], strict=True)
                }
                return val(src.name, q)
            if k == "win":
                src = by_name[e[1]]
                lo, hi = WINDOWS[e[2]][1](p["t"], prog.t_bound(p))
                rows = jnp.stack([val(src.name, {**{d: p[d] for d in src.domain if d != "t"}, "t": s})
                                  for s in range(lo, hi)])  # fmt: skip
                return {"sum": jnp.sum, "mean": jnp.mean, "max": jnp.max}[e[3]](rows, axis=0)
            if k == "un":
                a = ev(e[2], p, self_at)
                return {"tanh": jnp.tanh, "sigmoid": jax.nn.sigmoid, "abs": jnp.abs, "relu": jax.nn.relu,
                        "neg": jnp.negative}[e[1]](a)  # fmt: skip
            if k == "bin":
                a, b = ev(e[2], p, self_at), ev(e[3], p, self_at)
                return {"add": jnp.add, "sub": jnp.subtract, "mul": jnp.multiply}[e[1]](a, b)
            if k == "where":
                c = e[1]
                cond = {"t%2==0": lambda: p["t"] % 2 == 0, "t<T-1": lambda: p["t"] < prog.t_bound(p) - 1,
                        "i%2==0": lambda: p["i"] % 2 == 0}[c]()  # fmt: skip
                a, b = ev(e[2], p, self_at), ev(e[3], p, self_at)
                return jnp.where(cond, a, b)
            raise AssertionError(k)

        loss = jnp.asarray(0.0, jnp.float32)
        if prog.loss is not None:
            lx = by_name[prog.loss]
            for pt in _points(lx.domain, prog):
                p = dict(zip(lx.domain, pt, strict=True))
                if i_fixed is not None and p.get("i", i_fixed) != i_fixed:
                    continue
                v = val(lx.name, p)
                loss = loss + jnp.sum(v * v)
        return val, loss

    out: dict[str, dict[tuple[int, ...], np.ndarray]] = {x.name: {} for x in prog.tensors}
    w = jnp.asarray(w0, jnp.float32)
    ws, grads = [], []
    for it in range(iters):
        i_fixed = it if prog.param == ("i",) else None
        if prog.param is not None:
            g = jax.grad(lambda wv, i_fixed=i_fixed: run(wv, i_fixed)[1])(w)
            ws.append(np.asarray(w))
            grads.append(np.asarray(g))
        val, _ = run(w, i_fixed)
        for x in prog.tensors:
            for pt in _points(x.domain, prog):
                p = dict(zip(x.domain, pt, strict=True))
                if i_fixed is not None and "i" in x.domain and p["i"] != i_fixed:
                    continue
                if i_fixed is not None and "i" not in x.domain and it > 0:
                    continue
                out[x.name][pt] = np.asarray(val(x.name, p))
        if prog.param is not None:
            w = w - prog.lr * grads[-1]
    if prog.param is not None:
        if prog.param == ("i",):
            out["w"] = {(k,): ws[k] for k in range(iters)}
            out["w.grad"] = {(k,): grads[k] for k in range(iters)}
        else:
            out["w"] = {(): ws[0]}
            out["w.grad"] = {(): grads[0]}
    return out


# -- rendering into timerl ---------------------------------------------------------------


def render(prog: Program, w0: np.ndarray, store: dict[str, dict]) -> tuple[Any, dict[Any, int]]:
    """Build ``prog`` with the timerl API; sinks fill ``store[name][point]``."""
    import timerl as trl

    ctx = trl.Context(dims=prog.dims)
    with ctx as syms:
        S = {name: pair for name, pair in zip(prog.dims, syms, strict=True)}
        rts: dict[str, Any] = {}
        w = None
        if prog.param is not None:
            dom = tuple(S[d][0] for d in prog.param)
            w = trl.param(w0, domain=dom, name="w")

        def sink_for(name: str, domain: tuple[str, ...]):
            def fn(v: Any, pt: dict[str, int]) -> None:
                key = tuple(pt[d] for d in domain)
                assert key not in store[name], f"{name} sunk twice at {key}"
                store[name][key] = np.array(v)

            return fn

        def ev(e: Any, self_rt: Any) -> Any:
            k = e[0]
            if k == "const":
                return trl.const(np.asarray(e[1], np.float32))
            if k == "sym":
                return trl.as_tensor(S[e[1]][0])
            if k == "isym":
                return trl.as_tensor(S[e[1]][0], trl.int64) * 2 + 1
            if k == "stack":
                return trl.stack([ev(e[1], self_rt), ev(e[2], self_rt)]).sum(0)
            if k == "rwhere":
                return trl.where(ev(e[1], self_rt) > 0.0, ev(e[2], self_rt), ev(e[3], self_rt))
            if k == "param":
                return w
            if k == "self":
                return self_rt
            if k == "read":
                src = next(x for x in prog.tensors if x.name == e[1])
                idx = tuple(FORMS[f][1](S[d][0], S[d][1], trl) for d, f in zip(src.domain, e[2], strict=True))
                return rts[e[1]][idx]
            if k == "win":
                src = next(x for x in prog.tensors if x.name == e[1])
                t, T = S["t"]
                idx = tuple(WINDOWS[e[2]][0](t, T, trl) if d == "t" else S[d][0] for d in src.domain)
                r = rts[e[1]][idx]
                return getattr(r, e[3])(0)
            if k == "un":
                a = ev(e[2], self_rt)
                return -a if e[1] == "neg" else getattr(a, e[1])()
            if k == "bin":
                a, b = ev(e[2], self_rt), ev(e[3], self_rt)
                return a + b if e[1] == "add" else a - b if e[1] == "sub" else a * b
            if k == "where":
                c = e[1]
                t, T = S["t"]
                cond = {"t%2==0": lambda: t % 2 == 0, "t<T-1": lambda: t < T - 1,
                        "i%2==0": lambda: S["i"][0] % 2 == 0}[c]()  # fmt: skip
                return trl.where(cond, ev(e[2], self_rt), ev(e[3], self_rt))
            raise AssertionError(k)

        for x in prog.tensors:
            if x.kind == "expr":
                rt = ev(x.expr, None)
            else:
                shape = _shape(x, prog)
                rt = trl.empty(shape, domain=tuple(S[d][0] for d in x.domain), name=x.name)
                t, T = S["t"]
                lead = tuple(S[d][0] for d in x.domain if d != "t")
                first = 0 if x.kind == "fwd" else T - 1
                rt[lead + (first,)] = ev(x.init, None)
                if x.kind == "fwd":
                    rt[lead + (t + 1,)] = ev(x.step, rt)
                else:
                    rt[lead + (t,)] = ev(x.step, rt[lead + (t + 1,)])
            rts[x.name] = rt
            rt.sink(sink_for(x.name, x.domain))
        if prog.param is not None:
            loss = rts[prog.loss]
            (loss * loss).sum().backward()
            w.grad.sink(sink_for("w.grad", prog.param))
            w.sink(sink_for("w", prog.param))
            if prog.param == ("i",):
                i = S["i"][0]
                w[i + 1] = w - prog.lr * w.grad
    bounds: dict[Any, Any] = {S[d][1]: v for d, v in prog.bounds.items()}
    if prog.dynamic_t:
        with ctx:
            (i, _), (t, T) = S["i"], S["t"]
            bounds[T] = trl.as_tensor(t) >= trl.as_tensor(i % 2) + (prog.bounds["t"] - 1)
    return ctx, bounds


def _shape(x: Tensor, prog: Program) -> tuple[int, ...]:
    """Per-point shape of a recurrence: (2,) when some part of it is a vector, else ()."""
    return (2,) if _vector(x.init, prog) or _vector(x.step, prog, x.name) else ()


def _vector(e: Any, prog: Program, self_name: str | None = None) -> bool:
    k = e[0]
    if k == "const":
        return isinstance(e[1], tuple)
    if k == "param":
        return True
    if k in ("read", "win"):
        src = next(x for x in prog.tensors if x.name == e[1])
        return _tensor_vector(src, prog)
    if k == "un":
        return _vector(e[2], prog, self_name)
    if k in ("bin", "where"):
        return _vector(e[2], prog, self_name) or _vector(e[3], prog, self_name)
    if k in ("stack", "rwhere"):
        return any(_vector(x, prog, self_name) for x in e[1:])
    return False


def _tensor_vector(x: Tensor, prog: Program) -> bool:
    if x.kind == "expr":
        return _vector(x.expr, prog)
    return _shape(x, prog) == (2,)
