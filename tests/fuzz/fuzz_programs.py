"""Random well-defined RT programs, their timerl rendering, and an independent interpreter.

A program is a small description (:class:`Program`): tensors defined by expressions or by
forward/backward recurrences over ``t``, reading earlier tensors through a menu of
affine indices (shifts clamped at the edges, reversals, ``t // 2``, constants) and
windows with reductions, ``where`` on symbolic and on boolean-tensor conditions (and on
``&``, ``|``, ``!=``, ``~`` of comparisons), int64 tensors (symbolic arithmetic, counters
as int recurrences), boolean recurrences (flags), stacks, host functions applied
pointwise (``trl.udf``), vector @ matrix and matrix @ matrix products of outer products
built with ``reshape`` and ``permute``, optionally a parameter ``w`` over ``()``, ``(i,)``
or ``(i, k)`` trained by SGD (along ``i``, or along ``k`` carried into ``i + 1``).

Each seed has a *focus* among :data:`FEATURES` (``seed % len(FEATURES)``) that the
generator makes sure appears, so that a few consecutive seeds cover every feature.

Seeds from :data:`EXTRAS_FROM` on (the fresh profile's) draw three more constructs from a
second random stream, so that every smaller seed still gives the program it gave before
(regression seeds stay valid): tables longer than ``T`` read at ``t`` (``const(tab)[t]``)
in place of some constants, definitions over a shifted ``i`` (``x[0] = c``,
``x[i + 1] = e``; recurrences ``x[i + 1, t + 1] = f(x[i + 1, t])`` and backward ones),
and sums and means of vectors in place of some unary ops: the constructs of issue 38's
repros.

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
BOOL_OPS = ("and", "or", "xor", "not")
# Comparison thresholds: off round numbers, so that values built from small integers and
# round constants rarely sit on them (a value on a threshold flips with the last bit, which
# differs with the order of float operations in a fused region). The interpreter also
# reports each comparison's margin (see ``reference``).
GT, LT = 0.0137, 0.2531
# Host functions applied pointwise through trl.udf: name -> (numpy fn, jax.numpy fn); both
# take (value, point) where point holds the udf's dims.
UDFS: dict[str, tuple[Any, Any]] = {
    "cos": (lambda x, pt: np.cos(x), lambda x, pt: _jnp().cos(x)),
    "sq": (lambda x, pt: x * x - 0.3, lambda x, pt: x * x - 0.3),
    "pt": (lambda x, pt: x + 0.1 * sum(pt.values()), lambda x, pt: x + 0.1 * sum(pt.values())),
}
# The features each seed may be focused on (made sure to appear), beyond the basic ones.
# "tgrad": a node over t alone that uses a parameter without dims, read at every (i, t)
# (its gradient sums over i; with a per-i T that sum must follow each episode's T).
FEATURES = ("udf", "vm", "mm", "bwhere", "iarith", "count", "flag", "param2", "tgrad")
EXTRAS_FROM = 1_000_000
"""Seeds from here on may draw tables and shifted definitions (module doc)."""
DISCOUNTS_FROM = 520_000_000
"""Seeds from here on may turn a window's sum into a discounted sum (``x[t:T].discounted_sum``,
Monte-Carlo returns: ``pdg/passes/suffix_scan.py``), from a stream of their own (the programs
of earlier seeds are unchanged)."""
GAMMA = 0.9
SHIFT_INIT = 0.25  # x[0] of a definition over a shifted i


def _jnp() -> Any:
    import jax.numpy as jnp

    return jnp


@dataclass
class Tensor:
    name: str
    kind: str  # "expr" | "fwd" | "bwd" | "count" (int64 counter) | "flag" (bool recurrence)
    domain: tuple[str, ...]
    expr: Any = None  # kind "expr"
    init: Any = None  # recurrences: value at the first point (t = 0 forward, T - 1 backward)
    step: Any = None  # recurrences: value from the neighbour ("self"); count/flag: the float test
    op: str = ""  # flag: "or" | "xor" (how the test joins the previous flag)
    shift: bool = False  # defined over a shifted i: x[0] = SHIFT_INIT, x[i + 1] = (expr | init, step at i)


@dataclass
class Program:
    dims: tuple[str, ...]
    bounds: dict[str, int]
    tensors: list[Tensor] = field(default_factory=list)
    param: tuple[str, ...] | None = None  # the parameter's domain: (), ("i",), ("i", "k"); None: none
    loss: str | None = None  # name of the tensor whose squared sum is the loss
    lr: float = 0.0937  # not a round number: w - lr * grad cancels exactly less often
    dynamic_t: bool = False  # T found at run time, per i: T_i = bounds["t"] + i % 2
    focus: str = ""
    extras: random.Random | None = field(default=None, repr=False, compare=False)  # EXTRAS_FROM
    discounts: random.Random | None = field(default=None, repr=False, compare=False)  # DISCOUNTS_FROM

    def t_bound(self, p: dict[str, int]) -> int:
        """The bound of t at point ``p`` (per i when dynamic)."""
        return self.bounds["t"] + (p["i"] % 2 if self.dynamic_t else 0)

    def per_point_dims(self) -> set[str]:
        """Dims along which a point may read only its own coordinate: the parameter's dims
        (the interpreter unrolls one SGD step at a time with that step's parameter) and
        ``i`` under a per-``i`` T."""
        return set(self.param or ()) | ({"i"} if self.dynamic_t else set())

    def describe(self) -> str:
        lines = [
            f"dims={self.dims} bounds={self.bounds} dynamic_t={self.dynamic_t} param={self.param} "
            f"loss={self.loss} focus={self.focus}"
        ]
        for x in self.tensors:
            body = x.expr if x.kind == "expr" else f"init={x.init} step={x.step} {x.op}".rstrip()
            shift = f" (over i + 1; x[0] = {SHIFT_INIT})" if x.shift else ""
            lines.append(f"  {x.name}[{','.join(x.domain)}] {x.kind}{shift}: {body}")
        return "\n".join(lines)


def features(prog: Program) -> set[str]:
    """The features a program uses (expression and tensor kinds, parameter and T forms)."""
    out: set[str] = set()

    def walk(e: Any) -> None:
        if not isinstance(e, tuple) or not e or not isinstance(e[0], str):
            return
        out.add(e[0])
        for x in e[1:]:
            walk(x)

    for x in prog.tensors:
        out.add(x.kind)
        for e in (x.expr, x.init, x.step):
            walk(e)
    if prog.param is not None:
        out.add({0: "param0", 1: "param1", 2: "param2"}[len(prog.param)])
    if prog.dynamic_t:
        out.add("dynamic_t")
    return out


# -- generation --------------------------------------------------------------------------


def _dom(e: Any, prog: Program, by_name: dict[str, Tensor]) -> set[str]:
    k = e[0]
    if k == "const":
        return set()
    if k == "tab":
        return {"t"}
    if k in ("sym", "isym", "iarith"):
        return {e[1]}
    if k == "tgrad":
        return _dom(e[1], prog, by_name)
    if k == "param":
        return set(prog.param or ())
    if k == "udf":
        return set(e[2])
    if k in ("stack", "rwhere", "vm", "mm"):
        return set().union(*(_dom(x, prog, by_name) for x in e[1:] if isinstance(x, tuple)))
    if k == "bwhere":  # "not" ignores its second operand (rendered, but read by nothing)
        return set().union(*(_dom(x, prog, by_name) for x in _bwhere_used(e)))
    if k == "self":
        return set()
    if k == "read":
        src = by_name[e[1]]
        return {d for d, f in zip(src.domain, e[2], strict=True) if FORMS[f][0]}
    if k == "win":
        src = by_name[e[1]]
        return {d for d in src.domain if d != "t"} | {"t"}
    if k in ("un", "red"):
        return _dom(e[2], prog, by_name)
    if k == "bin":
        return _dom(e[2], prog, by_name) | _dom(e[3], prog, by_name)
    if k == "where":
        return {e[1][0]} | _dom(e[2], prog, by_name) | _dom(e[3], prog, by_name)
    raise AssertionError(k)


def _leaf(rng: random.Random, prog: Program, avail: list[Tensor], target: tuple[str, ...], allow_self: bool | str,
          kind: str | None = None) -> Any:  # fmt: skip
    leaves = ["const", "sym"]
    if avail:
        leaves += ["read", "read", "win"]
    if prog.param is not None and set(prog.param) <= set(target):
        leaves.append("param")
    if allow_self:
        leaves += ["self", "self"]
    k = kind or rng.choice(leaves)
    if k == "const":
        c = ("const", round(rng.uniform(-1, 1), 2) if rng.random() < 0.7 else (0.5, -0.25))
        x = prog.extras
        if x is not None and "t" in target and x.random() < 0.25:  # rows past T are never read
            rows = prog.bounds["t"] + (1 if prog.dynamic_t else 0) + x.randint(0, 3)
            return ("tab", tuple(round(x.uniform(-1, 1), 2) for _ in range(rows)))
        return c
    if k in ("sym", "iarith"):
        if not target:
            return ("const", 0.3)
        d = rng.choice(target)
        if k == "iarith" or rng.random() < 0.15:
            return ("iarith", d, rng.choice([2, 3, 4]))
        return ("isym" if rng.random() < 0.3 else "sym", d)
    if k == "param":
        return ("param",)
    if k == "self":
        return ("self",)
    if k == "read":
        per = prog.per_point_dims()
        cands = [x for x in avail if not any(d in x.domain and d not in target for d in per)]
        if not cands:
            return ("const", 0.2)
        src = rng.choice(cands)
        forms = [
            "d" if d in per else rng.choice(list(FORMS)) if d in target else rng.choice(["0", "D-1"])
            for d in src.domain
        ]
        return ("read", src.name, tuple(forms))
    with_t = [x for x in avail if "t" in x.domain and set(x.domain) <= set(target)]
    if not with_t or "t" not in target:
        return ("const", 0.1)
    src, window, red = rng.choice(with_t).name, rng.choice(list(WINDOWS)), rng.choice(REDUCE)
    if red == "sum" and prog.discounts is not None and prog.discounts.random() < 0.5:
        red = "discounted_sum"
    return ("win", src, window, red)


def _node(kind: str, rng: random.Random, prog: Program, avail: list[Tensor], target: tuple[str, ...], depth: int,
          allow_self: bool | str) -> Any:  # fmt: skip
    """An inner expression node of ``kind`` with random operands."""

    def sub() -> Any:
        return _gen_expr(rng, prog, avail, target, depth - 1, allow_self)

    if kind == "udf" and prog.dynamic_t and "t" in target and "i" not in target:
        kind = "un"  # a host call over t alone has no single T when T ends per i
    if kind == "stack":
        return ("stack", sub(), sub())
    if kind == "rwhere":
        return ("rwhere", sub(), sub(), sub())
    if kind == "un":
        e = ("un", rng.choice(UNARY), sub())
        x = prog.extras
        if x is not None and x.random() < 0.4:  # a vector's sum or mean (as a 2-vector)
            if x.random() < 0.5:  # both of one value: two broadcasts in its gradient
                return ("bin", "add", ("red", "sum", e[2]), ("red", "mean", e[2]))
            return ("red", x.choice(("sum", "mean")), e[2])
        return e
    if kind == "udf":
        # A host call runs at every point of its domain, also where the branch holding it
        # is not taken: under a backward recurrence's step it must not read "self" (x[t + 1]
        # at t = T - 1 is undefined; trl.udf's documented semantics make that ill-formed).
        inner = _gen_expr(rng, prog, avail, target, depth - 1, allow_self if allow_self != "bwd" else False)
        return ("udf", rng.choice(list(UDFS)), target, inner)
    if kind == "vm":  # vec(a) @ outer(b, c) (permuted or not); tanh keeps the degree in check
        return ("un", "tanh", ("vm", sub(), sub(), sub(), rng.random() < 0.5))
    if kind == "mm":
        return ("un", "tanh", ("mm", sub(), sub(), sub()))
    if kind == "bwhere":
        return ("bwhere", rng.choice(BOOL_OPS), sub(), sub(), sub(), sub())
    if kind == "bin":
        return ("bin", rng.choice(BINARY), sub(), sub())
    if kind == "where":
        cands = [c for c in CONDS if c[0] in target]
        if not cands:
            return sub()
        return ("where", rng.choice(cands), sub(), sub())
    raise AssertionError(kind)


def _gen_expr(rng: random.Random, prog: Program, avail: list[Tensor], target: tuple[str, ...], depth: int,
              allow_self: bool | str) -> Any:  # fmt: skip
    """A random expression over (at most) ``target``; ``allow_self``: False, or the kind of
    recurrence ("fwd" or "bwd") whose step may read its own neighbour."""
    if depth <= 0 or rng.random() < 0.35:
        return _leaf(rng, prog, avail, target, allow_self)
    r = rng.random()
    kind = (
        "un" if r < 0.2 else "stack" if r < 0.25 else "rwhere" if r < 0.3 else "udf" if r < 0.34
        else "vm" if r < 0.37 else "mm" if r < 0.39 else "bwhere" if r < 0.44 else "bin" if r < 0.85
        else "where"
    )  # fmt: skip
    return _node(kind, rng, prog, avail, target, depth, allow_self)


def _has(e: Any, kind: str) -> bool:
    if not isinstance(e, tuple) or not e:
        return False
    return e[0] == kind or any(
        _has(x, kind) for x in e[1:] if isinstance(x, tuple) and x and isinstance(x[0], str)
    )


def _udf_reads_self(e: Any) -> bool:
    """Whether a host call in ``e`` reads the recurrence's own value ("self")."""
    if not isinstance(e, tuple) or not e:
        return False
    if e[0] == "udf" and _has(e[3], "self"):
        return True
    return any(_udf_reads_self(x) for x in e[1:] if isinstance(x, tuple) and x and isinstance(x[0], str))


def _expr_tensor(name: str, e: Any, prog: Program, by_name: dict[str, Tensor]) -> Tensor:
    dom = _dom(e, prog, by_name)
    if prog.dynamic_t and "t" in dom and "i" not in dom:  # one T per i: t needs i
        e = ("bin", "add", e, ("bin", "mul", ("sym", "i"), ("const", 0.0)))
        dom.add("i")
    return Tensor(name, "expr", tuple(d for d in prog.dims if d in dom), expr=e)


def _recurrence(name: str, kind: str, rng: random.Random, prog: Program) -> Tensor:
    dims = prog.dims
    target = tuple(d for d in dims if d == "t" or rng.random() < 0.6 or prog.dynamic_t)
    lead = tuple(d for d in target if d != "t")
    if kind in ("count", "flag"):
        init = _gen_expr(rng, prog, [], lead, 1, False) if kind == "flag" else None
        step = _gen_expr(rng, prog, prog.tensors, target, rng.randint(1, 2), False)
        return Tensor(
            name, kind, target, init=init, step=step, op=rng.choice(["or", "xor"]) if kind == "flag" else ""
        )
    init = _gen_expr(rng, prog, [], lead, 1, False)
    step = _gen_expr(rng, prog, prog.tensors, target, rng.randint(1, 3), kind)
    if not _has(step, "self"):
        step = ("bin", "add", ("bin", "mul", ("const", 0.5), ("self",)), step)
    return Tensor(name, kind, target, init=init, step=step)


def generate(seed: int) -> Program:
    """A random well-defined program (deterministic in ``seed``)."""
    rng = random.Random(seed)
    extras = random.Random(seed * 7919 + 17) if seed >= EXTRAS_FROM else None
    discounts = random.Random(seed * 104729 + 29) if seed >= DISCOUNTS_FROM else None
    focus = FEATURES[seed % len(FEATURES)]
    if focus == "param2" or rng.random() < 0.05:
        dims: tuple[str, ...] = ("i", "k", "t")
        bounds = {"i": 2, "k": 2, "t": rng.randint(2, 3)}
        prog = Program(dims, bounds, param=("i", "k"), focus=focus, extras=extras, discounts=discounts)
    elif focus == "tgrad":
        dims = ("i", "t")
        bounds = {"t": rng.randint(2, 4), "i": rng.randint(2, 3)}
        prog = Program(
            dims,
            bounds,
            param=(),
            dynamic_t=rng.random() < 0.7,
            focus=focus,
            extras=extras,
            discounts=discounts,
        )
    else:
        dims = ("t",) if rng.random() < 0.45 else ("i", "t")
        bounds = {"t": rng.randint(2, 5)}
        if "i" in dims:
            bounds["i"] = rng.randint(2, 3)
        prog = Program(
            dims,
            bounds,
            dynamic_t="i" in dims and rng.random() < 0.3,
            focus=focus,
            extras=extras,
            discounts=discounts,
        )
        if rng.random() < 0.6:
            prog.param = ("i",) if "i" in dims and rng.random() < 0.7 else ()
    by_name: dict[str, Tensor] = {}

    def add(x: Tensor) -> None:
        prog.tensors.append(x)
        by_name[x.name] = x
        # over a shifted i: not under a per-i T, not with i a parameter's dim (one SGD step a point)
        if (
            extras is not None
            and x.kind in ("expr", "fwd", "bwd")
            and x.domain[:1] == ("i",)
            and (x.kind == "expr" or x.domain == ("i", "t"))
            and "i" not in prog.per_point_dims()
            and extras.random() < 0.3
            # a host call runs at every point of its own (unshifted) domain: reading "self"
            # (x[i + 1, t]) at i = I - 1 it would read x[I, t], undefined (seed 517400018)
            and not _udf_reads_self(x.step)
        ):
            x.shift = True

    for k in range(rng.randint(2, 5 if len(dims) == 3 else 6)):
        name = f"x{k}"
        kinds = ["expr", "expr", "fwd", "bwd", "expr", "fwd", "bwd"]
        if k % 2:  # int64 counters and bool flags at odd positions
            kinds += ["count", "flag"]
        kind = rng.choice(kinds)
        if kind == "expr":
            target = tuple(d for d in dims if rng.random() < 0.8) or ("t",)
            if prog.dynamic_t and "t" in target:
                target = ("i", "t")
            add(_expr_tensor(name, _gen_expr(rng, prog, prog.tensors, target, rng.randint(1, 3), False), prog,
                             by_name))  # fmt: skip
        else:
            add(_recurrence(name, kind, rng, prog))
    if focus not in features(prog) and focus != "param2":
        name = f"x{len(prog.tensors)}"
        if focus in ("count", "flag"):
            add(_recurrence(name, focus, rng, prog))
        else:
            target = ("i", "t") if prog.dynamic_t else tuple(d for d in dims if rng.random() < 0.8) or ("t",)
            if focus == "tgrad":  # a product with w over t alone, joined with a value over (i, t)
                e_t = _gen_expr(rng, prog, prog.tensors, ("t",), 2, False)
                e_t = ("bin", "mul", ("bin", "add", e_t, ("sym", "t")), ("param",))
                other = _gen_expr(rng, prog, prog.tensors, ("i", "t"), 1, False)
                e = ("bin", rng.choice(BINARY), ("tgrad", e_t), other)
            elif focus == "iarith":
                e = ("bin", "add", _gen_expr(rng, prog, prog.tensors, target, 1, False),
                     _leaf(rng, prog, prog.tensors, target, False, "iarith"))  # fmt: skip
            else:
                e = _node(focus, rng, prog, prog.tensors, target, 2, False)
            add(_expr_tensor(name, e, prog, by_name))
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


def _outer(jnp: Any, a: Any, b: Any) -> Any:
    a, b = jnp.broadcast_to(a, (2,)), jnp.broadcast_to(b, (2,))
    return a[:, None] * b[None, :]


def _bwhere_used(e: Any) -> tuple[Any, ...]:
    """The operands of a ``bwhere`` its value depends on."""
    return (e[2], e[4], e[5]) if e[1] == "not" else e[2:]


def _bool_cond(op: str, a: Any, b: Any) -> Any:
    """The condition of a ``bwhere``: ``a > GT`` joined with ``b < LT`` (works on RTs and arrays)."""
    x, y = a > GT, b < LT
    return {"and": lambda: x & y, "or": lambda: x | y, "xor": lambda: x != y, "not": lambda: ~x}[op]()


def reference(
    prog: Program, w0: np.ndarray, margins: list[float] | None = None
) -> dict[str, dict[tuple[int, ...], np.ndarray]]:
    """Every tensor's value at every point of its domain (and ``"w"``, ``"w.grad"``).

    ``margins``, if given, receives each comparison's distance to its threshold (relative
    to the value's size): a value within float rounding of a threshold may compare either
    way in a correct compiled program.

    With a parameter over ``P`` dims, the SGD steps are unrolled one point of ``P`` at a
    time (in row-major order); each step's loss is the squared sum of the loss tensor at
    the points of that step."""
    import itertools

    import jax
    import jax.numpy as jnp

    by_name = {x.name: x for x in prog.tensors}
    B = prog.bounds
    P = prog.param or ()

    def margin(v: Any, thr: float) -> None:
        if margins is not None and not isinstance(v, jax.core.Tracer):
            a = np.asarray(v, np.float64)
            margins.append(float(np.min(np.abs(a - thr) / np.maximum(1.0, np.abs(a)))))

    def gt(v: Any) -> Any:
        margin(v, GT)
        return v > GT

    def run(wv: Any, fixed: dict[str, int]) -> tuple[Any, Any]:
        memo: dict[tuple[str, tuple[int, ...]], Any] = {}

        def val(name: str, pt: dict[str, int]) -> Any:
            x = by_name[name]
            key = (name, tuple(pt[d] for d in x.domain))
            if key in memo:
                return memo[key]
            p = {d: pt[d] for d in x.domain}
            shape = _shape(x, prog)
            if x.shift and p["i"] == 0:
                v = jnp.full(shape, SHIFT_INIT, jnp.float32)
            elif x.shift:  # the definition's symbols at the point before along i
                s = dict(p, i=p["i"] - 1)
                if x.kind == "expr":
                    v = ev(x.expr, s, None)
                elif x.kind == "fwd":
                    v = (
                        ev(x.init, s, None)
                        if p["t"] == 0
                        else ev(x.step, dict(s, t=p["t"] - 1), (name, dict(p, t=p["t"] - 1)))
                    )
                elif p["t"] == prog.t_bound(p) - 1:
                    v = ev(x.init, s, None)
                else:
                    v = ev(x.step, s, (name, dict(p, t=p["t"] + 1)))
            elif x.kind == "expr":
                v = ev(x.expr, p, None)
            elif x.kind in ("fwd", "count", "flag"):
                if p["t"] == 0:
                    v = (
                        ev(x.init, p, None) if x.kind == "fwd"
                        else jnp.zeros(shape) if x.kind == "count"
                        else gt(ev(x.init, p, None)).astype(jnp.float32)
                    )  # fmt: skip
                else:
                    q = dict(p, t=p["t"] - 1)
                    if x.kind == "fwd":
                        v = ev(x.step, q, (name, q))
                    else:
                        prev, test = val(name, q), gt(ev(x.step, q, None)).astype(jnp.float32)
                        v = (
                            prev + test if x.kind == "count"
                            else jnp.maximum(prev, test) if x.op == "or"
                            else jnp.abs(prev - test)
                        )  # fmt: skip
            else:
                if p["t"] == prog.t_bound(p) - 1:
                    v = ev(x.init, p, None)
                else:
                    q = dict(p, t=p["t"] + 1)
                    v = ev(x.step, p, (name, q))
            v = jnp.asarray(v, jnp.float32)
            if x.kind != "expr" or x.shift:  # one declared shape; a branch value is broadcast to it
                v = jnp.broadcast_to(v, shape)
            memo[key] = v
            return v

        def ev(e: Any, p: dict[str, int], self_at: Any) -> Any:
            k = e[0]
            if k == "const":
                return jnp.asarray(e[1], jnp.float32)
            if k == "tab":
                return jnp.asarray(e[1][p["t"]], jnp.float32)
            if k == "sym":
                return jnp.asarray(float(p[e[1]]), jnp.float32)
            if k == "isym":  # an int64 tensor 2 d + 1
                return jnp.asarray(float(2 * p[e[1]] + 1), jnp.float32)
            if k == "iarith":  # an int64 tensor 2 ((3 d + 1) % m) - 1
                return jnp.asarray(float(2 * ((3 * p[e[1]] + 1) % e[2]) - 1), jnp.float32)
            if k == "stack":  # stack of two values (broadcast), summed over the new axis
                a, b = ev(e[1], p, self_at), ev(e[2], p, self_at)
                return jnp.sum(jnp.stack(jnp.broadcast_arrays(a, b)), axis=0)
            if k == "rwhere":  # a boolean tensor as the condition
                c, a, b = (ev(x, p, self_at) for x in e[1:])
                return jnp.where(gt(c), a, b)
            if k == "bwhere":
                a, c, d = (ev(x, p, self_at) for x in (e[2], e[4], e[5]))
                margin(a, GT)
                if e[1] == "not":  # b is not part of the value (its dims may not be in p)
                    return jnp.where(_bool_cond(e[1], a, a), c, d)
                b = ev(e[3], p, self_at)
                margin(b, LT)
                return jnp.where(_bool_cond(e[1], a, b), c, d)
            if k == "udf":  # a host function: no gradient flows through it
                a = jax.lax.stop_gradient(ev(e[3], p, self_at))
                return UDFS[e[1]][1](a, {d: p[d] for d in e[2]})
            if k == "vm":
                a, b, c = (ev(x, p, self_at) for x in e[1:4])
                m = _outer(jnp, b, c)
                return jnp.broadcast_to(a, (2,)) @ (m.T if e[4] else m)
            if k == "mm":
                a, b, c = (ev(x, p, self_at) for x in e[1:4])
                return (_outer(jnp, a, b) @ _outer(jnp, b, c).T).T.reshape(4).reshape(2, 2).sum(0)
            if k == "tgrad":
                return ev(e[1], p, self_at)
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
                if e[3] == "discounted_sum":
                    w = GAMMA ** np.arange(len(rows), dtype=np.float64)
                    return jnp.sum(
                        rows * w.astype(np.float32).reshape((-1,) + (1,) * (rows.ndim - 1)), axis=0
                    )
                return {"sum": jnp.sum, "mean": jnp.mean, "max": jnp.max}[e[3]](rows, axis=0)
            if k == "red":
                a = jnp.broadcast_to(ev(e[2], p, self_at), (2,))
                return jnp.sum(a) if e[1] == "sum" else jnp.mean(a)
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
                if any(p[d] != fixed[d] for d in P if d in p):
                    continue
                v = val(lx.name, p)
                loss = loss + jnp.sum(v * v)
        return val, loss

    out: dict[str, dict[tuple[int, ...], np.ndarray]] = {x.name: {} for x in prog.tensors}
    w = jnp.asarray(w0, jnp.float32)
    ws, grads = {}, {}
    for it in itertools.product(*(range(B[d]) for d in P)):
        fixed = dict(zip(P, it, strict=True))
        if prog.param is not None:
            g = jax.grad(lambda wv, fixed=fixed: run(wv, fixed)[1])(w)
            ws[it], grads[it] = np.asarray(w), np.asarray(g)
        val, _ = run(w, fixed)
        for x in prog.tensors:
            if any(fixed[d] != 0 for d in P if d not in x.domain):
                continue  # a tensor without that dim does not depend on the step: seen at step 0
            for pt in _points(x.domain, prog):
                p = dict(zip(x.domain, pt, strict=True))
                if any(p[d] != fixed[d] for d in P if d in p):
                    continue
                out[x.name][pt] = np.asarray(val(x.name, p))
        if prog.param is not None:
            w = w - prog.lr * grads[it]
    if prog.param is not None:
        out["w"] = ws
        out["w.grad"] = grads
    return out


# -- rendering into timerl ---------------------------------------------------------------


def render(prog: Program, w0: np.ndarray, store: dict[str, dict]) -> tuple[Any, dict[Any, int]]:
    """Build ``prog`` with the timerl API; sinks fill ``store[name][point]``."""
    import timerl as trl

    ctx = trl.Context(dims=prog.dims)
    dtypes = {"count": trl.int64, "flag": trl.bool_}
    with ctx as syms:
        S = {name: pair for name, pair in zip(prog.dims, syms, strict=True)}
        rts: dict[str, Any] = {}
        w = None
        if prog.param is not None:
            dom = tuple(S[d][0] for d in prog.param)
            w = trl.param(w0, domain=dom, name="w")

        def sink_for(name: str, domain: tuple[str, ...], kind: str = "") -> Any:
            def fn(v: Any, pt: dict[str, int]) -> None:
                key = tuple(pt[d] for d in domain)
                assert key not in store[name], f"{name} sunk twice at {key}"
                v = np.array(v)
                want = {"count": "i", "flag": "b"}.get(kind)
                assert want is None or v.dtype.kind == want, f"{name} at {key}: dtype {v.dtype}, not {kind}"
                store[name][key] = v

            return fn

        def vec(x: Any) -> Any:
            return x if tuple(x.shape) == (2,) else x.expand((2,))

        def outer(a: Any, b: Any) -> Any:
            return vec(a).reshape(2, 1) * vec(b).reshape(1, 2)

        def host(fname: str, shape: tuple[int, ...], dims: tuple[str, ...]) -> Any:
            def fn(inputs: list[np.ndarray], pt: dict[str, int]) -> list[np.ndarray]:
                x = np.asarray(inputs[0], np.float32)
                assert x.shape == shape, (x.shape, shape)
                return [np.asarray(UDFS[fname][0](x, {d: pt[d] for d in dims}), np.float32)]

            return fn

        def read(name: str, idx: tuple[Any, ...]) -> Any:
            r = rts[name][idx]
            return r.cast(trl.float32) if r.dtype is not trl.float32 and name in casts else r

        casts = {x.name for x in prog.tensors if x.kind in dtypes}

        def ev(e: Any, self_rt: Any) -> Any:
            k = e[0]
            if k == "const":
                return trl.const(np.asarray(e[1], np.float32))
            if k == "tab":
                return trl.const(np.asarray(e[1], np.float32))[S["t"][0]]
            if k == "sym":
                return trl.as_tensor(S[e[1]][0])
            if k == "isym":
                return trl.as_tensor(S[e[1]][0], trl.int64) * 2 + 1
            if k == "iarith":
                return trl.as_tensor((S[e[1]][0] * 3 + 1) % e[2], trl.int64) * 2 - 1
            if k == "stack":
                return trl.stack([ev(e[1], self_rt), ev(e[2], self_rt)]).sum(0)
            if k == "rwhere":
                return trl.where(ev(e[1], self_rt) > GT, ev(e[2], self_rt), ev(e[3], self_rt))
            if k == "bwhere":
                a, b, c, d = (ev(x, self_rt) for x in e[2:])
                return trl.where(_bool_cond(e[1], a, b), c, d)
            if k == "udf":
                a = ev(e[3], self_rt).cast(trl.float32)
                shape = tuple(int(n) for n in a.shape)
                (out,) = trl.udf(
                    host(e[1], shape, e[2]), [(shape, trl.float32)], domain=tuple(S[d][0] for d in e[2]),
                    inputs=[a], name=f"udf_{e[1]}",
                )  # fmt: skip
                return out
            if k == "vm":
                a, b, c = (ev(x, self_rt) for x in e[1:4])
                m = outer(b, c)
                return vec(a) @ (m.permute(1, 0) if e[4] else m)
            if k == "mm":
                a, b, c = (ev(x, self_rt) for x in e[1:4])
                prod = outer(a, b) @ outer(b, c).permute(1, 0)
                return prod.permute(1, 0).reshape(4).reshape(2, 2).sum(0)
            if k == "tgrad":
                return ev(e[1], self_rt)
            if k == "param":
                return w
            if k == "self":
                return self_rt
            if k == "read":
                src = next(x for x in prog.tensors if x.name == e[1])
                idx = tuple(FORMS[f][1](S[d][0], S[d][1], trl) for d, f in zip(src.domain, e[2], strict=True))
                return read(e[1], idx)
            if k == "win":
                src = next(x for x in prog.tensors if x.name == e[1])
                t, T = S["t"]
                idx = tuple(WINDOWS[e[2]][0](t, T, trl) if d == "t" else S[d][0] for d in src.domain)
                rows = read(e[1], idx)
                return rows.discounted_sum(GAMMA) if e[3] == "discounted_sum" else getattr(rows, e[3])(0)
            if k == "red":
                a = vec(ev(e[2], self_rt).cast(trl.float32))
                return a.sum() if e[1] == "sum" else a.mean()
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
            if x.shift:
                rt = _render_shifted(trl, x, prog, S, ev)
            elif x.kind == "expr":
                rt = ev(x.expr, None)
            else:
                shape = _shape(x, prog)
                dt = dtypes.get(x.kind, trl.float32)
                rt = trl.empty(shape, dt, domain=tuple(S[d][0] for d in x.domain), name=x.name)
                t, T = S["t"]
                lead = tuple(S[d][0] for d in x.domain if d != "t")
                first = 0 if x.kind != "bwd" else T - 1
                if x.kind == "count":
                    rt[lead + (first,)] = trl.zeros(shape, trl.int64)
                    rt[lead + (t + 1,)] = rt + (ev(x.step, None) > GT).cast(trl.int64)
                elif x.kind == "flag":
                    rt[lead + (first,)] = ev(x.init, None) > GT
                    test = ev(x.step, None) > GT
                    rt[lead + (t + 1,)] = (rt | test) if x.op == "or" else (rt != test)
                else:
                    rt[lead + (first,)] = ev(x.init, None)
                    if x.kind == "fwd":
                        rt[lead + (t + 1,)] = ev(x.step, rt)
                    else:
                        rt[lead + (t,)] = ev(x.step, rt[lead + (t + 1,)])
            rts[x.name] = rt
            rt.sink(sink_for(x.name, x.domain, x.kind))
        if prog.param is not None:
            loss = rts[prog.loss]
            (loss * loss).sum().backward()
            w.grad.sink(sink_for("w.grad", prog.param))
            w.sink(sink_for("w", prog.param))
            if prog.param == ("i",):
                i = S["i"][0]
                w[i + 1] = w - prog.lr * w.grad
            elif prog.param:  # along the inner dim, carried into the next outer point
                trl.optim.SGD([w], lr=prog.lr).step()
    bounds: dict[Any, Any] = {S[d][1]: v for d, v in prog.bounds.items()}
    if prog.dynamic_t:
        with ctx:
            (i, _), (t, T) = S["i"], S["t"]
            bounds[T] = trl.as_tensor(t) >= trl.as_tensor(i % 2) + (prog.bounds["t"] - 1)
    return ctx, bounds


def _render_shifted(trl: Any, x: Tensor, prog: Program, S: dict[str, Any], ev: Any) -> Any:
    """``x`` defined over a shifted ``i``: ``x[0] = SHIFT_INIT``, then ``x[i + 1] = expr`` or the
    recurrence over ``t`` at ``i + 1`` (its neighbour read as ``x[i + 1, t -/+ 1]``)."""
    shape = _shape(x, prog)
    i = S["i"][0]
    rt = trl.empty(shape, domain=tuple(S[d][0] for d in x.domain), name=x.name)
    rt[(0,)] = trl.const(np.full(shape, SHIFT_INIT, np.float32))

    def f32(v: Any) -> Any:
        return v if v.dtype is trl.float32 else v.cast(trl.float32)

    if x.kind == "expr":
        rt[(i + 1,)] = f32(ev(x.expr, None))
        return rt
    t, T = S["t"]
    if x.kind == "fwd":
        rt[(i + 1, 0)] = f32(ev(x.init, None))
        rt[(i + 1, t + 1)] = f32(ev(x.step, rt[(i + 1, t)]))
    else:
        rt[(i + 1, T - 1)] = f32(ev(x.init, None))
        rt[(i + 1, t)] = f32(ev(x.step, rt[(i + 1, t + 1)]))
    return rt


def _shape(x: Tensor, prog: Program) -> tuple[int, ...]:
    """Per-point shape of a recurrence (or of a definition over a shifted ``i``): (2,) when
    some part of it is a vector, else ()."""
    if x.kind == "expr":
        return (2,) if _vector(x.expr, prog) else ()
    parts = [e for e in (x.init, x.step) if e is not None]
    return (2,) if any(_vector(e, prog, x.name) for e in parts) else ()


def _vector(e: Any, prog: Program, self_name: str | None = None) -> bool:
    k = e[0]
    if k == "const":
        return isinstance(e[1], tuple)
    if k in ("param", "vm", "mm"):
        return True
    if k in ("read", "win"):
        src = next(x for x in prog.tensors if x.name == e[1])
        return _tensor_vector(src, prog)
    if k == "tgrad":
        return _vector(e[1], prog, self_name)
    if k == "red":
        return False
    if k == "un":
        return _vector(e[2], prog, self_name)
    if k == "udf":
        return _vector(e[3], prog, self_name)
    if k in ("bin", "where"):
        return _vector(e[2], prog, self_name) or _vector(e[3], prog, self_name)
    if k in ("stack", "rwhere"):
        return any(_vector(x, prog, self_name) for x in e[1:])
    if k == "bwhere":
        return any(_vector(x, prog, self_name) for x in _bwhere_used(e))
    return False


def _tensor_vector(x: Tensor, prog: Program) -> bool:
    if x.kind == "expr":
        return _vector(x.expr, prog)
    return _shape(x, prog) == (2,)
