"""RT programs compiled through PDG, isl schedule and AST, run on both backends.

Each program's sink values are checked against hand-computed values and against the
reference evaluator (``timerl.runtime.reference``), which uses no schedule.
"""

from __future__ import annotations

import numpy as np
import pytest

import timerl as trl
from timerl.compile import CompileOptions, build_pdg
from timerl.runtime.reference import reference_evaluate

BACKENDS = ["jax", "torch"]


def _recurrence_program():
    out: list[tuple[int, int, float]] = []
    ctx = trl.Context(dims=("i", "t"))
    with ctx as ((i, I), (t, T)):
        x = trl.empty((), domain=(i, t), name="x")
        x[i, 0] = trl.as_tensor(i)
        x[i, t + 1] = x + 1.0
        g = x[i, t:T].sum(0)
        g.sink(lambda v, p: out.append((p["i"], p["t"], float(v))))
    return ctx, (I, T), out


@pytest.mark.parametrize("backend", BACKENDS)
def test_recurrence_and_slice_values(backend: str) -> None:
    ctx, (I, T), out = _recurrence_program()
    ctx.compile({I: 2, T: 3}, backend=backend).execute()
    # x[i, t] = i + t ; g[i, t] = sum_{k=t}^{2} x[i, k]
    want = [(i, t, float(sum(i + k for k in range(t, 3)))) for i in range(2) for t in range(3)]
    assert sorted(out) == want


@pytest.mark.parametrize("backend", BACKENDS)
def test_compiled_matches_reference_evaluator(backend: str) -> None:
    ctx, (I, T), out = _recurrence_program()
    ctx.compile({I: 2, T: 4}, backend=backend).execute()
    compiled = sorted(out)
    out.clear()
    from timerl.backends import get_backend

    pdg = build_pdg(ctx, {I: 2, T: 4}, CompileOptions())
    reference_evaluate(pdg, get_backend(backend))
    assert sorted(out) == compiled


def test_undefined_point_is_a_compile_error_naming_the_tensor() -> None:
    ctx = trl.Context(dims=("t",))
    with ctx as ((t, T),):
        x = trl.empty((), domain=(t,), name="acc")
        x[t + 1] = x + 1.0  # no x[0] definition
        x.sink(lambda v, p: None)
    with pytest.raises(trl.UndefinedPointError, match="'acc'"):
        ctx.compile({T: 3}, backend="jax")


def test_unknown_bound_is_a_compile_error() -> None:
    ctx = trl.Context(dims=("i", "t"))
    with ctx as ((i, I), (t, T)):
        trl.as_tensor(t).sink(lambda v, p: None)
    with pytest.raises(trl.BoundError, match="T"):
        ctx.compile({I: 2}, backend="jax")


def test_unknown_compile_option_is_rejected() -> None:
    ctx = trl.Context(dims=("t",))
    with ctx as ((t, T),):
        trl.as_tensor(t).sink(lambda v, p: None)
    with pytest.raises(trl.TimeRLError, match="unknown compile option"):
        ctx.compile({T: 2}, backend="jax", not_a_pass=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_gradient_through_time_matches_unrolled_jax(backend: str) -> None:
    """loss = sum_t (sum_{k>=t} x[k])^2 with x[t+1] = 0.5 x[t] + w; compare dloss/dw with jax.grad."""
    import jax
    import jax.numpy as jnp

    Tn = 4
    w0 = np.array([0.3, -0.2], np.float32)
    got: list[np.ndarray] = []
    ctx = trl.Context(dims=("t",))
    with ctx as ((t, T),):
        w = trl.param(w0, name="w")
        x = trl.empty((2,), domain=(t,), name="x")
        x[0] = trl.zeros((2,))
        x[t + 1] = x * 0.5 + w
        g = x[t:T].sum(0)
        loss = (g * g).sum()
        loss.backward()
        w.grad.sink(lambda v, p: got.append(np.array(v)))
    ctx.compile({T: Tn}, backend=backend).execute()

    def unrolled(wv):
        xs = [jnp.zeros(2)]
        for _ in range(Tn - 1):
            xs.append(xs[-1] * 0.5 + wv)
        return sum(jnp.sum(sum(xs[k] for k in range(s, Tn)) ** 2) for s in range(Tn))

    want = np.asarray(jax.grad(unrolled)(jnp.asarray(w0)))
    assert len(got) == 1
    np.testing.assert_allclose(got[0], want, rtol=1e-5, atol=1e-5)
