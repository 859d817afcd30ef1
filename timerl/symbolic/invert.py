"""Inversion of dependence expressions.

A dependence component says which source points a sink point ``q`` reads along one
dim: a point ``q + k`` or a slice ``lo(q):hi(q)``. Its inverse says which sink points
read a given source point ``p``: "what reads me?". Examples (sink dim bound ``T``)::

    t + 3              ->  t - 3            (valid when 0 <= t - 3 < T)
    t:T                ->  0:t + 1
    t:min(t + n, T)    ->  max(t - n + 1, 0):t + 1
    max(t - n + 1, 0):t + 1  ->  t:min(t + n, T)
    T - 1 - t          ->  T - 1 - t        (a reversal is its own inverse)
    0:T                ->  0:T

Components that are no bijection of ``q`` (``max(t - 1, 0)``, ``t // 2``, ``t % 3``)
have no inverse of this form; :class:`NonAffineIndexError` tells the caller to fall
back to reading every sink point (autodiff masks them, see ``rt/autodiff.py``).

The inverse is expressed with the *same* symbol as the input (the source dim's
symbol), as in the TimeRL paper. Used by symbolic autodiff and memory management.
"""

from __future__ import annotations

from dataclasses import dataclass

from timerl.errors import NonAffineIndexError
from timerl.symbolic.expr import (
    TRUE,
    Expr,
    Max,
    Min,
    Slice,
    Sym,
    free_symbols,
    lift,
    logical_and,
    smax,
    smin,
    substitute,
)
from timerl.symbolic.simplify import affine_in


@dataclass(frozen=True, slots=True)
class Inverse:
    """The sink points that read source point ``sym``: ``index`` when ``cond`` holds."""

    index: Expr | Slice
    cond: Expr


def _solve_unit(e: Expr, q: Sym, what: str) -> Expr | None:
    """For ``e = q + rest`` return ``rest``; None when ``q`` is absent; error otherwise."""
    if q not in free_symbols(e):
        return None
    aff = affine_in(e, q)
    if aff is None or aff[0] != 1:
        raise NonAffineIndexError(
            f"cannot invert {what} `{e}`: `{q}` must appear as `{q} + c` "
            "(coefficient 1, affine); rewrite the index or move the computation into a concrete dim"
        )
    return aff[1]


def invert(index: Expr | Slice, q: Sym, bound: Expr) -> Inverse:
    """Invert one dependence component that reads along sink dim ``q`` (``0 <= q < bound``).

    ``index`` is written in sink symbols; the result uses ``q`` to stand for the source
    coordinate ``p``. Raises :class:`NonAffineIndexError` for shapes it cannot invert.
    """
    p = q
    bound = lift(bound)
    if not isinstance(index, Slice):
        if q not in free_symbols(index):
            raise NonAffineIndexError(f"index `{index}` does not use `{q}`; nothing to invert")
        aff = affine_in(index, q)
        if aff is not None and aff[0] == -1:  # q = rest - p: a reversal such as T - 1 - t
            sink = aff[1] - p
        else:
            sink = p - _solve_unit(index, q, "index")
        cond = logical_and(sink >= 0, sink < bound)
        return Inverse(sink, cond)

    cond: Expr = TRUE
    # lo(q) <= p; lo may be a max of parts (max(q - n + 1, 0)): each part <= p
    stop: Expr = bound
    for part in _extremum_parts(index.start, Max, Min, "slice start", "max"):
        lo_rest = _solve_unit(part, q, "slice start")
        if lo_rest is None:
            cond = logical_and(cond, part <= p)
        else:
            stop = smin(stop, p - lo_rest + 1)
    # p < hi(q)
    start: Expr = lift(0)
    for part in _extremum_parts(index.stop, Min, Max, "slice stop", "min"):
        hi_rest = _solve_unit(part, q, "slice stop")
        if hi_rest is None:
            cond = logical_and(cond, p < part)
        else:
            start = smax(start, p - hi_rest + 1)
    return Inverse(Slice(start, stop), cond)


def _extremum_parts(e: Expr, keep: type[Expr], other: type[Expr], what: str, name: str) -> list[Expr]:
    """The parts of ``e`` as a nest of ``keep`` (``min`` in a slice stop, ``max`` in a start)."""
    if isinstance(e, keep):
        return [p for a in e.args for p in _extremum_parts(a, keep, other, what, name)]
    if isinstance(e, other):
        raise NonAffineIndexError(
            f"cannot invert {what} `{e}`: only `{name}` is supported there (a window clipped at the "
            "edges of its dim)"
        )
    return [e]


def shift(index: Expr | Slice, mapping: dict[Sym, Expr]) -> Expr | Slice:
    """Substitute symbols in an index component (alias kept for readability)."""
    return substitute(index, mapping)
