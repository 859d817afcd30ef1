"""Suffix sums (``x[t:T].discounted_sum(g)``, ``x[t:T].sum(0)``: Monte-Carlo returns) become
rows of one ``SUFFIX_SUM`` (``pdg/passes/suffix_scan.py``): the same values as without the
pass, on both backends and on the reference evaluator, for a static ``T`` and for a ``T``
found per episode (rows padded to ``bucket(T)``), with the gradient through the returns."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import timerl as trl
from timerl.backends import get_backend
from timerl.compile import CompileOptions, build_pdg
from timerl.pdg.ops import OpKind
from timerl.runtime.reference import reference_evaluate
from timerl.symbolic import Slice

W = np.array([[0.5, -0.3], [0.2, 0.8]], np.float32)
ENDS = (5, 1, 40, 17)  # episode i ends after ENDS[i] steps (dynamic T): 1 row, odd lengths, > 32


def _program(seen: dict[tuple[str, int], Any], dynamic: bool) -> tuple[trl.Context, dict]:
    """Rewards r[i, t] from a recurrence with noise; per t the discounted return and the plain
    suffix sum of r[t:T]; w learns from a loss weighted by the returns (REINFORCE's form)."""
    ctx = trl.Context(dims=("i", "t"))
    with ctx as ((i, I), (t, T)):
        w = trl.param(np.array([0.3, -0.2], np.float32), domain=(i,), name="w")
        x = trl.empty((2,), domain=(i, t), name="x")
        x[i, 0] = w * 1.0
        x[i, t + 1] = (x @ trl.const(W)).tanh() + trl.rand((2,), domain=(i, t)) * 0.1
        r = (x * x).sum() + 0.25
        g = r[i, t:T].discounted_sum(0.9)
        rest = x[i, t:T].sum(0)  # a vector per t
        loss = (-(x * w).sum() * g + rest.sum() * 0.01)[i, 0:T].sum()
        g[i, 0:T].sink(lambda v, p: seen.__setitem__(("g", p["i"]), np.asarray(v).copy()))
        rest[i, 0:T].sink(lambda v, p: seen.__setitem__(("rest", p["i"]), np.asarray(v).copy()))
        loss.backward()
        w.grad.sink(lambda v, p: seen.__setitem__(("grad", p["i"]), np.asarray(v).copy()))
        w[i + 1] = w - 0.01 * w.grad
        if dynamic:
            steps = trl.empty((), domain=(i, t), name="steps")  # steps[i, t] = t + 1
            steps[i, 0] = trl.const(np.float32(1.0))
            steps[i, t + 1] = steps + 1.0
            return ctx, {I: len(ENDS), T: steps >= trl.const(np.asarray(ENDS, np.float32))[i]}
    return ctx, {I: 3, T: 6}


def _close(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=2e-5, atol=1e-6, err_msg=str(k))


@pytest.mark.parametrize("dynamic", [False, True], ids=["static_T", "dynamic_T"])
@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_suffix_sums_are_rows_of_one_scan_with_the_same_values(backend: str, dynamic: bool) -> None:
    runs = {}
    for on in (False, True):
        seen: dict = {}
        ctx, bounds = _program(seen, dynamic)
        ex = ctx.compile(bounds, backend=backend, suffix_scan=on)
        kinds = [n.op.kind for n in ex.pdg]
        t_sym = next(s for s, _ in ex.pdg.dims if s.name == "t")
        windows = [  # sums of x[t:T] per t (the gradient's DISCOUNT_WEIGHTS reads it too)
            e
            for e in ex.pdg.edges
            if any(isinstance(c, Slice) and c.start is t_sym for c in (*e.phi, *(c for _, c in e.batch_read)))
            and ex.pdg.nodes[e.sink].op.kind in (OpKind.DISCOUNTED_SUM, OpKind.SUM)
        ]
        if on:  # no sum over a window per t is left; both suffix sums are one scan each
            assert kinds.count(OpKind.SUFFIX_SUM) == 2 and not windows
            pads = {n.op.attr("padded") for n in ex.pdg if n.op.kind is OpKind.SUFFIX_SUM}
            assert pads == {dynamic}
        else:
            assert OpKind.SUFFIX_SUM not in kinds and windows
        ex.execute()
        runs[on] = seen
    assert len(runs[True]) == 3 * (len(ENDS) if dynamic else 3)
    _close(runs[True], runs[False])
    ref: dict = {}
    ctx, bounds = _program(ref, dynamic)
    reference_evaluate(build_pdg(ctx, bounds, CompileOptions()), get_backend(backend))
    _close(ref, runs[True])


def test_dynamic_returns_are_vectorized_over_t() -> None:
    """Under a dynamic T the rows of the scan are a view with t as a padded batch axis: the
    returns' readers run once per episode, not once per step."""
    ctx, bounds = _program({}, True)
    pdg = build_pdg(ctx, bounds, CompileOptions())
    t_sym = next(s for s, _ in pdg.dims if s.name == "t")
    scans = {n.id for n in pdg if n.op.kind is OpKind.SUFFIX_SUM}
    views = [pdg.nodes[e.sink] for e in pdg.edges if e.src in scans]
    assert len(scans) == 2 and len(views) == 2
    assert all(t_sym not in v.domain and t_sym in v.batch_dims for v in views)


def test_windows_that_are_not_suffixes_are_left_alone() -> None:
    """``x[t:min(t + 2, T)]`` (an n-step window) and ``x[0:t + 1]`` (a prefix) stay sums per t;
    a mean over ``t:T`` is a suffix sum divided by its length."""
    ctx = trl.Context(dims=("i", "t"))
    with ctx as ((i, I), (t, T)):
        x = trl.rand((), domain=(i, t))
        a = x[i, t : trl.min(t + 2, T)].discounted_sum(0.9)
        b = x[i, 0 : t + 1].sum(0)
        c = x[i, t:T].mean(0)
        (a + b + c)[i, 0:T].sum().sink(lambda v, p: None)
    pdg = build_pdg(ctx, {I: 2, T: 4}, CompileOptions())
    kinds = [n.op.kind for n in pdg]
    assert kinds.count(OpKind.SUFFIX_SUM) == 1
    assert OpKind.DISCOUNTED_SUM in kinds


@pytest.mark.parametrize("suffix", [False, True])
def test_discounted_sums_of_integers_are_float(suffix: bool) -> None:
    """An int64 window's discounted sum weighs its rows by ``gamma**k`` (the weights were cast
    to int64: 1, 0, 0, ...; fuzz seed 520000026)."""
    got: dict[int, float] = {}
    vals = np.array([1, 3, 5, 7], np.int64)  # x[t] = 2 t + 1
    ctx = trl.Context(dims=("i", "t"))
    with ctx as ((i, I), (t, T)):
        x = trl.empty((), trl.int64, domain=(i, t), name="x")
        x[i, t] = trl.as_tensor(t, trl.int64) * 2 + 1
        g = x[i, t:T].discounted_sum(0.5)
        g.sink(lambda v, p: got.__setitem__(p["t"], float(v)))
    ctx.compile({I: 1, T: 4}, backend="jax", suffix_scan=suffix).execute()
    want = {k: sum(0.5**j * float(v) for j, v in enumerate(vals[k:])) for k in range(4)}
    assert got == pytest.approx(want)
