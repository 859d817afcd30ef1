"""Dependence distances of PDG edges as per-dim intervals (for clustering and storage).

For an edge ``sink <- src`` and a dim ``d`` in both domains, the *offset* is the range
of ``src_d - sink_d`` over the points the sink reads: ``x[t - 1]`` gives ``[-1, -1]``,
``x[t:T]`` gives ``[0, inf]``, ``x[0:t + 1]`` gives ``[-inf, 0]``, a constant index
``x[0]`` gives ``[-inf, 0]`` (because ``t >= 0``), ``x[t - t % 4]`` gives ``[-3, 0]``
(``c * (x % m)`` for a constant ``m > 0`` lies in ``c * [0, m - 1]``). Offsets
over-approximate: a bound that cannot be derived is infinite. Dims in only one of the two domains have no offset
(the source coordinate is not tied to a sink coordinate).
"""

from __future__ import annotations

import math

from timerl.pdg.ir import PDG, Edge
from timerl.symbolic import Const, Expr, Max, Min, Mod, Slice, Sym, free_symbols, linear_form

INF = math.inf
Interval = tuple[float, float]
FULL: Interval = (-INF, INF)
ZERO: Interval = (0, 0)


def expr_offset(e: Expr, d: Sym, bound: Sym) -> Interval:
    """Range of ``e - d`` for ``0 <= d < bound`` (``bound`` itself unbounded above)."""
    if isinstance(e, Min):
        a, b = (expr_offset(x, d, bound) for x in e.args)
        return (min(a[0], b[0]), min(a[1], b[1]))
    if isinstance(e, Max):
        a, b = (expr_offset(x, d, bound) for x in e.args)
        return (max(a[0], b[0]), max(a[1], b[1]))
    coeffs, const = linear_form(e)
    # c * (x % m) with a constant m > 0 lies in c * [0, m - 1] (``w[i - i % K]``: [-(K-1), 0])
    lo, hi = 0, 0
    for atom in [a for a in coeffs if _mod_by_positive_const(a)]:
        span = coeffs.pop(atom) * (int(atom.args[1].value) - 1)
        lo, hi = lo + min(0, span), hi + max(0, span)
    return add(_linear_offset(coeffs, const, d, bound), (lo, hi))


def _mod_by_positive_const(a: Expr) -> bool:
    return isinstance(a, Mod) and isinstance(a.args[1], Const) and int(a.args[1].value) > 0


def _linear_offset(coeffs: dict[Expr, int], const: int, d: Sym, bound: Sym) -> Interval:
    """Range of ``sum coeffs * atoms + const - d`` (see :func:`expr_offset`)."""
    cd = coeffs.pop(d, 0)
    if any(d in free_symbols(a) for a in coeffs):
        return FULL
    if not coeffs:
        if cd == 1:
            return (const, const)
        if cd == 0:
            return (-INF, const)
        return FULL
    if cd == 0 and coeffs == {bound: 1}:
        return (const + 1, INF)  # bound + const - d with d <= bound - 1
    return FULL


def component_offset(comp: Expr | Slice, d: Sym, bound: Sym) -> Interval:
    """Offset range of one index component (a point or a half-open slice) along ``d``."""
    if isinstance(comp, Slice):
        lo = expr_offset(comp.start, d, bound)[0]
        hi = expr_offset(comp.stop, d, bound)[1] - 1
        return (lo, hi)
    return expr_offset(comp, d, bound)


def edge_offsets(e: Edge, pdg: PDG) -> dict[Sym, Interval]:
    """Offsets of ``e`` along every dim shared by its source and sink."""
    src, sink = pdg.nodes[e.src], pdg.nodes[e.sink]
    out: dict[Sym, Interval] = {}
    for d, comp in zip(src.domain, e.phi, strict=True):
        if d in sink.domain:
            out[d] = component_offset(comp, d, pdg.bound_of(d))
    return out


def add(a: Interval, b: Interval) -> Interval:
    return (a[0] + b[0], a[1] + b[1])


def hull(a: Interval, b: Interval) -> Interval:
    return (min(a[0], b[0]), max(a[1], b[1]))


def contains(a: Interval, b: Interval) -> bool:
    """Whether ``a`` contains ``b``."""
    return a[0] <= b[0] and b[1] <= a[1]


def lex_nonpositive(vec: tuple[Interval, ...], signs: tuple[int, ...], strict: bool) -> bool:
    """Whether every distance in the box ``vec`` is lexicographically ``<= 0`` (``< 0``).

    ``signs[k] = -1`` reverses dim ``k`` (a loop running downwards).
    """
    for (lo, hi), s in zip(vec, signs, strict=True):
        top = hi if s > 0 else -lo
        if top < 0:
            return True
        if top > 0:
            return False
    return not strict
