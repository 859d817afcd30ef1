"""Symbolic expressions: interning, folding, evaluation, inversion (brute-force oracle)."""

from __future__ import annotations

import pytest

from timerl.errors import NonAffineIndexError, SymbolicError
from timerl.symbolic import Slice, Sym, evaluate, invert, lift, same, smin, substitute

t, i = Sym("t"), Sym("i")
T = Sym("T", True)


def test_interning_and_canonical_sums() -> None:
    assert (t + 1) is (1 + t)
    assert (t + 1 - 1) is t
    assert same(2 * t + T - t, t + T)
    assert smin(t + 5, t + 3) is (t + 3)


def test_comparisons_build_expressions_and_fold() -> None:
    e = (i + 1) % 10 == 0
    assert evaluate(e, {i: 9}) is True and evaluate(e, {i: 8}) is False
    assert bool(t + 1 < t + 2)
    with pytest.raises(SymbolicError, match="truth value"):
        bool(t < T)


def test_evaluate_slice_and_substitute() -> None:
    s = Slice(t, smin(t + 5, T))
    assert evaluate(s, {t: 3, T: 6}) == range(3, 6)
    assert same(substitute(t + 2, {t: i - 1}), i + 1)
    with pytest.raises(SymbolicError, match="`T`"):
        evaluate(t + T, {t: 1})


@pytest.mark.parametrize(
    "index",
    [t + 3, t - 2, Slice(t, T), Slice(t, smin(t + 3, T)), Slice(lift(0), T), Slice(t - 1, t + 2)],
    ids=str,
)
def test_inversion_matches_brute_force(index) -> None:
    """p is read by q  <=>  q is in the inverse at p (checked for T = 1..6)."""
    for Tv in range(1, 7):
        inv = invert(index, t, T)
        for p in range(-3, Tv + 3):
            want = set()
            for q in range(Tv):
                r = evaluate(index, {t: q, T: Tv})
                hit = p in r if isinstance(r, range) else p == r
                if hit:
                    want.add(q)
            env = {t: p, T: Tv}
            if not evaluate(inv.cond, env):
                got = set()
            else:
                r = evaluate(inv.index, env)
                got = set(r) if isinstance(r, range) else {r}
                got = {q for q in got if 0 <= q < Tv}
            assert got == want, (index, Tv, p)


def test_non_affine_inversion_raises() -> None:
    with pytest.raises(NonAffineIndexError):
        invert(2 * t, t, T)
