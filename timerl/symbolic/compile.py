"""Symbolic expressions compiled into Python functions ``f(env)`` (``env``: symbol values).

Every layer that evaluates index expressions many times (the runtime at every point, the
plan's peak estimate at every statement instance) compiles them once here."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from timerl.symbolic.expr import (
    Add,
    And,
    Const,
    Eq,
    Expr,
    FloorDiv,
    Le,
    Lt,
    Max,
    Min,
    Mod,
    Mul,
    Not,
    Or,
    Slice,
    Sym,
    free_symbols,
)

_BINOPS: dict[type, str] = {Add: "+", Mul: "*", FloorDiv: "//", Mod: "%", Lt: "<", Le: "<=", Eq: "=="}


# how ``Not``, ``And``, ``Or``, ``Min``, ``Max`` are written: on Python ints, or elementwise on arrays
_SCALAR = {
    Not: "(not {0})",
    And: "(bool({0}) and bool({1}))",
    Or: "(bool({0}) or bool({1}))",
    Min: "min({0}, {1})",
    Max: "max({0}, {1})",
}
# elementwise, truth values are int64 arrays (0/1): NumPy's bool arrays add as "or" where
# Python's bools add as ints ((a == b) + (c == d) is 2 when both hold)
_ELEMENTWISE = {
    Not: "_i(_not({0}))",
    And: "_i(_and({0}, {1}))",
    Or: "_i(_or({0}, {1}))",
    Min: "_min({0}, {1})",
    Max: "_max({0}, {1})",
    Lt: "_i({0} < {1})",
    Le: "_i({0} <= {1})",
    Eq: "_i({0} == {1})",
}


def _expr_src(e: Expr | Slice, names: dict[Sym, str], calls: Mapping[type, str] = _SCALAR) -> str:
    if isinstance(e, Slice):
        if calls is not _SCALAR:
            raise TypeError("slices are not evaluated elementwise")
        return f"range({_expr_src(e.start, names)}, {_expr_src(e.stop, names)})"
    if isinstance(e, Const):
        return repr(e.value)
    if isinstance(e, Sym):
        if e not in names:
            names[e] = f"_s{len(names)}"
        return f"v[{names[e]}]"
    k = type(e)
    a = [_expr_src(x, names, calls) for x in e.args]
    if k in calls:
        return calls[k].format(*a)
    return f"({a[0]} {_BINOPS[k]} {a[1]})"


def compile_exprs(es: Sequence[Expr | Slice], as_tuple: bool = True) -> Callable[[Mapping[Sym, int]], Any]:
    """Compile expressions into ``f(env)``: a tuple of values (slices give ``range`` objects).

    With ``as_tuple=False`` (one expression) ``f`` returns the bare value.
    """
    names: dict[Sym, str] = {}
    parts = [_expr_src(e, names) for e in es]
    body = f"({', '.join(parts)},)" if as_tuple else parts[0]
    if as_tuple and not parts:
        body = "()"
    scope: dict[str, Any] = {"__builtins__": {}, "min": min, "max": max, "range": range, "bool": bool}
    scope.update({n: s for s, n in names.items()})
    return eval(f"lambda v: {body}", scope)  # noqa: S307 - generated from our own Expr trees


def compile_expr(e: Expr | Slice) -> Callable[[Mapping[Sym, int]], Any]:
    """Compile one expression into ``f(env) -> value``."""
    return compile_exprs((e,), as_tuple=False)


def symbols_of(es: Sequence[Expr | Slice]) -> frozenset[Sym]:
    out: frozenset[Sym] = frozenset()
    for e in es:
        out |= free_symbols(e)
    return out


def compile_exprs_elementwise(es: Sequence[Expr]) -> Callable[[Mapping[Sym, Any]], tuple[Any, ...]]:
    """Compile expressions into ``f(env) -> tuple``, evaluated elementwise when ``env`` maps
    some symbols to NumPy integer arrays (one evaluation for every iteration of a loop):
    ``+ * // % < <= ==`` act elementwise with Python's integer semantics (truth values as
    0/1 integers, so they add as Python's bools do), ``min``/``max`` and the logical
    connectives through NumPy. Values equal those of :func:`compile_exprs`
    at each element; a result that does not depend on the arrays stays a scalar."""
    import numpy as np

    names: dict[Sym, str] = {}
    parts = [_expr_src(e, names, _ELEMENTWISE) for e in es]
    scope: dict[str, Any] = {
        "__builtins__": {},
        "_not": np.logical_not,
        "_and": np.logical_and,
        "_or": np.logical_or,
        "_min": np.minimum,
        "_max": np.maximum,
        "_i": lambda x: np.asarray(x, dtype=np.int64),
    }
    scope.update({n: s for s, n in names.items()})
    body = f"({', '.join(parts)},)" if parts else "()"
    return eval(f"lambda v: {body}", scope)  # noqa: S307 - generated from our own Expr trees
