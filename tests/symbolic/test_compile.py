"""Compiled expressions (``timerl/symbolic/compile.py``): the elementwise form (NumPy arrays of
a loop variable, used by scanned loops) equals the scalar form at every element, on random
expressions over the grammar's operators."""

from __future__ import annotations

import random

import numpy as np

from timerl.symbolic import Sym, smax, smin
from timerl.symbolic.compile import compile_exprs, compile_exprs_elementwise
from timerl.symbolic.expr import And, Expr, Not, Or

t, i, T = Sym("t"), Sym("i"), Sym("T")


def _random_expr(rng: random.Random, depth: int) -> Expr:
    if depth == 0 or rng.random() < 0.25:
        return rng.choice([t, i, T, t + rng.randint(-3, 3), i * rng.randint(1, 3)])
    a, b = _random_expr(rng, depth - 1), _random_expr(rng, depth - 1)
    k = rng.randrange(12)
    if k == 0:
        return a + b
    if k == 1:
        return a * rng.randint(-2, 3)
    if k == 2:
        return a // rng.randint(1, 4)
    if k == 3:
        return a % rng.randint(1, 5)
    if k == 4:
        return smin(a, b)
    if k == 5:
        return smax(a, b)
    if k == 6:
        return a < b
    if k == 7:
        return a <= b
    if k == 8:
        return a == b
    if k == 9:
        return Not(a < b)
    if k == 10:
        return And(a < b, b <= i + 2)
    return Or(a == b, (i + 1) % 3 == 0)


def test_elementwise_equals_scalar_on_random_expressions() -> None:
    rng = random.Random(0)
    es = [_random_expr(rng, 3) for _ in range(300)]
    scalar, vec = compile_exprs(es), compile_exprs_elementwise(es)
    ts = np.arange(-6, 14, dtype=np.int64)
    for iv in range(-2, 5):
        got = vec({t: ts, i: iv, T: 9})
        for k, tv in enumerate(ts):
            want = scalar({t: int(tv), i: iv, T: 9})
            for e, w, x in zip(es, want, got, strict=True):
                xv = x[k] if np.ndim(x) else x
                assert int(w) == int(xv), (e, int(tv), iv, w, xv)
