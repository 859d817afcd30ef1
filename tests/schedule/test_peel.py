"""Partial unrolling (``timerl/schedule/peel.py``): loops split into first / middle / last
iterations run the same statements at the same points in the same order, without the ``If``s
the split decides; loops of zero, one and two iterations included, with symbolic bounds."""

from __future__ import annotations

import itertools

import pytest

from timerl.schedule.ast import Exec, If, Loop, Seq, walk
from timerl.schedule.check import run_ast
from timerl.schedule.peel import peel_ifs
from timerl.symbolic import Sym, lift
from timerl.symbolic.expr import Eq, Le, Lt

C0, C1, T, S = Sym("_c0"), Sym("_c1"), Sym("T", is_bound=True), Sym("S", is_bound=True)


def _loop(var: Sym, init, cond, *body) -> Loop:
    return Loop(var, lift(init), cond, 1, Seq(tuple(body)))


def _x(k: int, *pt) -> Exec:
    return Exec(k, tuple(lift(p) for p in pt))


def _cases():
    last = T - 1
    # every decided form, with a then and an else, over 0 <= c1 <= T - 1, inside an outer loop
    inner = _loop(
        C1, 0, Le(C1, last),
        _x(1, C0, C1),
        If(Eq(C1, lift(0)), _x(2, C0, C1)),
        If(Le(lift(1), C1), _x(3, C0, C1), _x(4, C0, C1)),
        If(Eq(C1, last), _x(5, C0, C1), _x(6, C0, C1)),
        If(Lt(C1, last), _x(7, C0, C1)),
        If(Le(lift(2), C0 + C1), _x(8, C0, C1)),  # not decided by first / last: stays
    )  # fmt: skip
    yield "both ends", _loop(C0, 0, Lt(C0, S), inner)
    # a start that is not 0, an exclusive bound, the last iteration only
    yield "last only", _loop(C1, 3, Lt(C1, T + 3), _x(1, C1), If(Eq(C1, T + 2), _x(2, C1)))
    # the first iteration only, a static bound
    yield "first only", _loop(C1, 1, Le(C1, lift(4)), If(Lt(lift(1), C1), _x(1, C1), _x(2, C1)), _x(3, C1))


@pytest.mark.parametrize("name,ast", list(_cases()), ids=[c[0] for c in _cases()])
def test_same_trace_and_no_decided_ifs(name: str, ast) -> None:
    peeled = peel_ifs(ast)
    for t, s in itertools.product(range(0, 5), range(0, 3)):  # T = 0, 1, 2: no, one, two iterations
        env = {T: t, S: s}
        assert run_ast(peeled, env) == run_ast(ast, env), (name, env)
    # innermost pieces: the first keeps the Ifs about the last iteration (a loop of one
    # iteration), the middle and the last piece hold only the undecided If (or none)
    pieces = [
        x for x in walk(peeled) if isinstance(x, Loop) and not any(isinstance(y, Loop) for y in walk(x.body))
    ]
    assert len(pieces) >= 2
    for k, x in enumerate(pieces):
        kids = x.body.children if isinstance(x.body, Seq) else (x.body,)
        left = [str(c.cond) for c in kids if isinstance(c, If)]
        if k > 0 or name == "last only":
            assert all("2 <=" in c for c in left), (name, k, left)


def test_outer_and_dynamic_loops_are_left() -> None:
    """A loop holding a loop is not split (it would copy the inner loop); nor is a loop over a
    dynamic bound (its last iteration is known only at its end)."""
    ast = _loop(
        C0, 0, Le(C0, T - 1), If(Eq(C0, lift(0)), _x(1, C0)), _loop(C1, 0, Le(C1, lift(2)), _x(2, C0, C1))
    )
    assert peel_ifs(ast) == ast
    inner = _loop(C1, 0, Le(C1, T - 1), If(Eq(C1, T - 1), _x(1, C1)))
    assert peel_ifs(inner, frozenset({T})) == inner
    assert peel_ifs(inner) != inner


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_compiled_with_and_without_peel(backend: str) -> None:
    """``peel=True`` (off by default) on a compiled program with first / last-iteration
    statements (a rollout of fixed length with a bootstrap read at ``T - 1``): the same values,
    and the innermost loops lose their decided ``If``s."""
    import numpy as np

    import timerl as trl

    def run(peel: bool) -> tuple[list, object]:
        out: list = []
        ctx = trl.Context(dims=("i", "t"))
        with ctx as ((i, I), (t, T)):
            o = trl.empty((4,), domain=(i, t), name="o")
            o[i, 0] = trl.const(np.linspace(-1, 1, 4).astype(np.float32)) + trl.as_tensor(i)
            o[i, t + 1] = (o * 0.9).tanh()
            r = o.sum()
            (r[i, 0:T].sum(0) + o[i, T - 1].sum()).sink(lambda v, p: out.append((p["i"], float(v))))
        ex = ctx.compile({I: 3, T: 6}, backend=backend, peel=peel, vectorize_time=False)
        ex.execute()
        return out, ex

    (a, off), (b, on) = run(False), run(True)
    assert a == b and len(a) == 3

    def count(ex: object, kind: type) -> int:
        return sum(isinstance(x, kind) for x in walk(ex.schedule.ast))  # type: ignore[attr-defined]

    assert count(on, If) < count(off, If) and count(on, Loop) > count(off, Loop)
