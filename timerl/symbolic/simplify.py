"""Canonical forms and simplification of symbolic expressions.

Sums and products are kept in a canonical *linear form*: ``c0 + c1*a1 + ... + cn*an``
where each atom ``ak`` is a symbol or a non-linear sub-expression (``t // 2``,
``min(t + 5, T)``), atoms ordered by their printed form. Two expressions whose
difference is a constant are therefore recognised (``affine_difference``), which is
what comparisons, ``min``/``max`` and dependence inversion need.
"""

from __future__ import annotations

from timerl.symbolic.expr import Add, Const, Expr, Mul, Sym, to_str

LinearForm = tuple[dict[Expr, int], int]


def linear_form(e: Expr) -> LinearForm:
    """Decompose ``e`` into ``({atom: coeff}, const)``; non-linear parts become atoms."""
    coeffs: dict[Expr, int] = {}
    const = 0

    def go(x: Expr, k: int) -> None:
        nonlocal const
        if isinstance(x, Const):
            const += k * int(x.value)
        elif isinstance(x, Add):
            go(x.args[0], k)
            go(x.args[1], k)
        elif isinstance(x, Mul) and isinstance(x.args[0], Const):
            go(x.args[1], k * int(x.args[0].value))
        elif isinstance(x, Mul) and isinstance(x.args[1], Const):
            go(x.args[0], k * int(x.args[1].value))
        else:
            coeffs[x] = coeffs.get(x, 0) + k

    go(e, 1)
    return {a: c for a, c in coeffs.items() if c != 0}, const


def from_linear_form(coeffs: dict[Expr, int], const: int) -> Expr:
    """Build the canonical expression of a linear form."""
    out: Expr | None = None
    for atom in sorted(coeffs, key=to_str):
        c = coeffs[atom]
        if c == 0:
            continue
        term = atom if c == 1 else Mul(Const(c), atom)
        out = term if out is None else Add(out, term)
    if out is None:
        return Const(const)
    if const != 0:
        out = Add(out, Const(const))
    return out


def simplify(e: Expr) -> Expr:
    """Canonicalise sums/products; other nodes are returned as they are."""
    if isinstance(e, (Add, Mul)):
        if isinstance(e, Mul) and not isinstance(e.args[0], Const) and not isinstance(e.args[1], Const):
            return e  # a product of two symbolic factors is an atom
        coeffs, const = linear_form(e)
        return from_linear_form(coeffs, const)
    return e


def affine_difference(a: Expr, b: Expr) -> int | None:
    """``a - b`` when it is a constant, else ``None``."""
    ca, ka = linear_form(a)
    cb, kb = linear_form(b)
    if ca.keys() != cb.keys() or any(ca[x] != cb[x] for x in ca):
        return None
    return ka - kb


def affine_in(e: Expr, sym: Sym) -> tuple[int, Expr] | None:
    """Write ``e`` as ``coeff * sym + rest`` with ``rest`` free of ``sym``.

    Returns ``(coeff, rest)``; ``None`` when ``sym`` occurs non-linearly.
    """
    from timerl.symbolic.expr import free_symbols

    coeffs, const = linear_form(e)
    coeff = coeffs.pop(sym, 0)
    if any(sym in free_symbols(a) for a in coeffs):
        return None
    return coeff, from_linear_form(coeffs, const)
