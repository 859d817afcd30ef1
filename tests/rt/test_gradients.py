"""Symbolic autodiff against ``jax.grad`` of the same program unrolled in plain JAX.

One test per feature the gradient has to flow through: a clipped window slice, a
full-range slice read at every point, reads of earlier and later points (forward and
backward recurrences), branching definitions and conditional values, and a parameter
cycle over iterations (SGD written as an RT). Each runs on both backends. Besides ``dloss/dw`` for the parameter, most tests also compare
the gradient of every point of an intermediate RT ``x`` (``x.grad``) with the gradient
of the unrolled program with respect to an additive perturbation ``d[k]`` of ``x[k]``,
which is what the accumulated adjoint of ``x[k]`` means.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import timerl as trl

BACKENDS = ["jax", "torch"]
TOL = {"rtol": 1e-5, "atol": 1e-5}
W0 = np.array([0.3, -0.2], np.float32)


def _by_point(store: dict[Any, np.ndarray], *dims: str) -> Callable[[Any, dict[str, int]], None]:
    """A sink that stores each value under its point (``dims`` in order; () for scalars)."""

    def fn(v: Any, p: dict[str, int]) -> None:
        key = tuple(p[d] for d in dims)
        assert key not in store, f"sink called twice at {key}"
        store[key] = np.array(v)

    return fn


def _stacked(store: dict[Any, np.ndarray], n: int) -> np.ndarray:
    assert sorted(store) == [(k,) for k in range(n)]
    return np.stack([store[(k,)] for k in range(n)])


@pytest.mark.parametrize("backend", BACKENDS)
def test_gradient_through_clipped_window_slice(backend: str) -> None:
    """loss = sum_t |sum_{k=t}^{min(t+2,T)-1} 0.9^(k-t) x[k]|^2, x[t+1] = tanh(x[t] w) + 0.1."""
    Tn, n = 5, 2
    gw: dict[Any, np.ndarray] = {}
    gx: dict[Any, np.ndarray] = {}
    ctx = trl.Context(dims=("t",))
    with ctx as ((t, T),):
        w = trl.param(W0, name="w")
        x = trl.empty((2,), domain=(t,), name="x")
        x[0] = w * 2.0
        x[t + 1] = (x * w).tanh() + 0.1
        g = x[t : trl.min(t + n, T)].discounted_sum(0.9)
        loss = (g * g).sum()
        loss.backward()
        w.grad.sink(_by_point(gw))
        x.grad.sink(_by_point(gx, "t"))
    ctx.compile({T: Tn}, backend=backend).execute()

    def unrolled(wv, d):
        xs = [wv * 2.0 + d[0]]
        for k in range(1, Tn):
            xs.append(jnp.tanh(xs[-1] * wv) + 0.1 + d[k])
        total = 0.0
        for s in range(Tn):
            gs = sum(0.9 ** (k - s) * xs[k] for k in range(s, min(s + n, Tn)))
            total = total + jnp.sum(gs * gs)
        return total

    want_w, want_d = jax.grad(unrolled, argnums=(0, 1))(jnp.asarray(W0), jnp.zeros((Tn, 2)))
    np.testing.assert_allclose(gw[()], np.asarray(want_w), **TOL)
    np.testing.assert_allclose(_stacked(gx, Tn), np.asarray(want_d), **TOL)


@pytest.mark.parametrize("backend", BACKENDS)
def test_gradient_through_lookback_read(backend: str) -> None:
    """x[t] = tanh(x[t - 1] w) + 0.1 t (defined through a read of t - 1, not by x[t + 1] = ...);
    the loss reads x[t - 1] under the condition t > 0, so it exists only for t >= 1."""
    Tn = 5
    gw: dict[Any, np.ndarray] = {}
    gx: dict[Any, np.ndarray] = {}
    losses: dict[Any, np.ndarray] = {}
    ctx = trl.Context(dims=("t",))
    with ctx as ((t, T),):
        w = trl.param(W0, name="w")
        x = trl.empty((2,), domain=(t,), name="x")
        x[0] = w
        x[t] = (x[t - 1] * w).tanh() + trl.as_tensor(t) * 0.1
        loss = ((x - x[t - 1, t > 0]) ** 2.0).sum()
        loss.sink(_by_point(losses, "t"))
        loss.backward()
        w.grad.sink(_by_point(gw))
        x.grad.sink(_by_point(gx, "t"))
    ctx.compile({T: Tn}, backend=backend).execute()

    def xs_of(wv, d):
        xs = [wv + d[0]]
        for k in range(1, Tn):
            xs.append(jnp.tanh(xs[-1] * wv) + k * 0.1 + d[k])
        return xs

    def unrolled(wv, d):
        xs = xs_of(wv, d)
        return sum(jnp.sum((xs[k] - xs[k - 1]) ** 2) for k in range(1, Tn))

    xs = xs_of(jnp.asarray(W0), jnp.zeros((Tn, 2)))
    assert sorted(losses) == [(k,) for k in range(1, Tn)]  # no loss at t = 0
    for k in range(1, Tn):
        np.testing.assert_allclose(losses[(k,)], float(jnp.sum((xs[k] - xs[k - 1]) ** 2)), **TOL)
    want_w, want_d = jax.grad(unrolled, argnums=(0, 1))(jnp.asarray(W0), jnp.zeros((Tn, 2)))
    np.testing.assert_allclose(gw[()], np.asarray(want_w), **TOL)
    np.testing.assert_allclose(_stacked(gx, Tn), np.asarray(want_d), **TOL)


@pytest.mark.parametrize("backend", BACKENDS)
def test_gradient_through_lookahead_and_backward_recurrence(backend: str) -> None:
    """A TD-style lookahead x[t + 1] and a GAE-style backward recurrence over t.

    nxt[T-1] = 0, nxt[t] = x[t + 1]; delta = |x|^2 + 0.9 nxt - x;
    adv[T-1] = delta[T-1], adv[t] = delta + 0.8 adv[t + 1]; loss = sum_t |adv[t]|^2.
    """
    Tn = 5
    gw: dict[Any, np.ndarray] = {}
    gx: dict[Any, np.ndarray] = {}
    ctx = trl.Context(dims=("t",))
    with ctx as ((t, T),):
        w = trl.param(W0, name="w")
        x = trl.empty((2,), domain=(t,), name="x")
        x[0] = w
        x[t + 1] = (x * w).tanh() + 0.2
        nxt = trl.empty((2,), domain=(t,), name="nxt")
        nxt[T - 1] = trl.zeros((2,))
        nxt[t] = x[t + 1]
        delta = (x * x).sum() + nxt * 0.9 - x
        adv = trl.empty((2,), domain=(t,), name="adv")
        adv[T - 1] = delta[T - 1]
        adv[t] = delta + adv[t + 1] * 0.8
        loss = (adv * adv).sum()
        loss.backward()
        w.grad.sink(_by_point(gw))
        x.grad.sink(_by_point(gx, "t"))
    ctx.compile({T: Tn}, backend=backend).execute()

    def unrolled(wv, d):
        xs = [wv + d[0]]
        for k in range(1, Tn):
            xs.append(jnp.tanh(xs[-1] * wv) + 0.2 + d[k])
        deltas = [jnp.sum(xs[k] ** 2) + (0.9 * xs[k + 1] if k + 1 < Tn else 0.0) - xs[k] for k in range(Tn)]
        adv = deltas[Tn - 1]
        total = jnp.sum(adv * adv)
        for k in range(Tn - 2, -1, -1):
            adv = deltas[k] + 0.8 * adv
            total = total + jnp.sum(adv * adv)
        return total

    want_w, want_d = jax.grad(unrolled, argnums=(0, 1))(jnp.asarray(W0), jnp.zeros((Tn, 2)))
    np.testing.assert_allclose(gw[()], np.asarray(want_w), **TOL)
    np.testing.assert_allclose(_stacked(gx, Tn), np.asarray(want_d), **TOL)


@pytest.mark.parametrize("backend", BACKENDS)
def test_gradient_flows_only_to_the_branch_taken(backend: str) -> None:
    """y[0] = 2 w, y[3] = w * v, y[t + 1] = y w + 1, and y[1] = 5 u written last (never taken:
    y[t + 1] already covers t = 1), then z = where(t even, y * v, exp(y)) in the loss."""
    Tn = 5
    v0 = np.array([0.7, 1.1], np.float32)
    grads: dict[str, dict[Any, np.ndarray]] = {"w": {}, "v": {}, "u": {}}
    gy: dict[Any, np.ndarray] = {}
    ctx = trl.Context(dims=("t",))
    with ctx as ((t, T),):
        w = trl.param(W0, name="w")
        v = trl.param(v0, name="v")
        u = trl.param(np.array([0.5, 0.5], np.float32), name="u")
        y = trl.empty((2,), domain=(t,), name="y")
        y[0] = w * 2.0
        y[3] = w * v
        y[t + 1] = y * w + 1.0
        y[1] = u * 5.0
        z = trl.where(t % 2 == 0, y * v, (y * 0.5).exp())
        loss = (z * z).sum()
        loss.backward()
        for name, p in (("w", w), ("v", v), ("u", u)):
            p.grad.sink(_by_point(grads[name]))
        y.grad.sink(_by_point(gy, "t"))
    ctx.compile({T: Tn}, backend=backend).execute()

    def unrolled(wv, vv, uv, d):
        del uv  # the y[1] = 5 u branch is never taken
        ys = [wv * 2.0 + d[0]]
        for k in range(1, Tn):
            ys.append((wv * vv if k == 3 else ys[-1] * wv + 1.0) + d[k])
        zs = [ys[k] * vv if k % 2 == 0 else jnp.exp(ys[k] * 0.5) for k in range(Tn)]
        return sum(jnp.sum(zk * zk) for zk in zs)

    args = (jnp.asarray(W0), jnp.asarray(v0), jnp.full(2, 0.5), jnp.zeros((Tn, 2)))
    want = jax.grad(unrolled, argnums=(0, 1, 2, 3))(*args)
    np.testing.assert_allclose(grads["w"][()], np.asarray(want[0]), **TOL)
    np.testing.assert_allclose(grads["v"][()], np.asarray(want[1]), **TOL)
    np.testing.assert_allclose(grads["u"][()], np.zeros(2), **TOL)
    np.testing.assert_allclose(_stacked(gy, Tn), np.asarray(want[3]), **TOL)


@pytest.mark.parametrize("update", ["optim.SGD", "by_hand"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_sgd_parameter_cycle_matches_unrolled_training(backend: str, update: str) -> None:
    """w[i + 1] = w[i] - lr dL_i/dw[i] over I = 3 iterations, with an inner recurrence over t
    and a loss that depends on i; w, w.grad and the loss at every (i, t) match plain JAX."""
    In, Tn, lr = 3, 3, 0.1
    ws: dict[Any, np.ndarray] = {}
    gws: dict[Any, np.ndarray] = {}
    losses: dict[Any, np.ndarray] = {}
    ctx = trl.Context(dims=("i", "t"))
    with ctx as ((i, I), (t, T)):
        w = trl.param(W0, domain=(i,), name="w")
        x = trl.empty((2,), domain=(i, t), name="x")
        x[i, 0] = w
        x[i, t + 1] = (x * w).tanh() + trl.as_tensor(i) * 0.1
        loss = ((x - 0.5) ** 2.0).sum()
        loss.backward()
        if update == "optim.SGD":
            trl.optim.SGD([w], lr=lr).step()
        else:
            w[i + 1] = w - lr * w.grad
        w.sink(_by_point(ws, "i"))
        w.grad.sink(_by_point(gws, "i"))
        loss.sink(_by_point(losses, "i", "t"))
    ctx.compile({I: In, T: Tn}, backend=backend).execute()

    def xs_of(wv, it):
        xs = [wv]
        for _ in range(Tn - 1):
            xs.append(jnp.tanh(xs[-1] * wv) + it * 0.1)
        return xs

    def loss_i(wv, it):
        return sum(jnp.sum((xk - 0.5) ** 2) for xk in xs_of(wv, it))

    wv = jnp.asarray(W0)
    for it in range(In):
        g = jax.grad(loss_i)(wv, it)
        np.testing.assert_allclose(ws[(it,)], np.asarray(wv), **TOL)
        np.testing.assert_allclose(gws[(it,)], np.asarray(g), **TOL)
        for k, xk in enumerate(xs_of(wv, it)):
            np.testing.assert_allclose(losses[(it, k)], float(jnp.sum((xk - 0.5) ** 2)), **TOL)
        wv = wv - lr * g
    assert sorted(ws) == [(it,) for it in range(In)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_gradient_through_full_range_read_at_every_point(backend: str) -> None:
    """y[t] = (t + 1) sum_k x[k]: every t reads all of x[0:T] (a sink dim that the source also has)."""
    Tn = 4
    gw: dict[Any, np.ndarray] = {}
    gx: dict[Any, np.ndarray] = {}
    ctx = trl.Context(dims=("t",))
    with ctx as ((t, T),):
        w = trl.param(W0, name="w")
        x = trl.empty((2,), domain=(t,), name="x")
        x[0] = w
        x[t + 1] = (x * w).tanh() + 0.1
        y = (x[0:T] * (trl.as_tensor(t) + 1.0)).sum(0)
        loss = ((y - x) ** 2.0).sum()
        loss.backward()
        w.grad.sink(_by_point(gw))
        x.grad.sink(_by_point(gx, "t"))
    ctx.compile({T: Tn}, backend=backend).execute()

    def unrolled(wv, d):
        xs = [wv + d[0]]
        for k in range(1, Tn):
            xs.append(jnp.tanh(xs[-1] * wv) + 0.1 + d[k])
        total = sum(xs)
        return sum(jnp.sum((total * (s + 1.0) - xs[s]) ** 2) for s in range(Tn))

    want_w, want_d = jax.grad(unrolled, argnums=(0, 1))(jnp.asarray(W0), jnp.zeros((Tn, 2)))
    np.testing.assert_allclose(gw[()], np.asarray(want_w), **TOL)
    np.testing.assert_allclose(_stacked(gx, Tn), np.asarray(want_d), **TOL)


@pytest.mark.parametrize("backend", BACKENDS)
def test_gradient_through_take_of_rows(backend: str) -> None:
    """Rows of a table taken by a per-t index with repeats (``x.take(idx[t])``) and by an
    ``argsort`` permutation: the gradient adds every taken row back at its index."""
    Tn = 3
    w0 = np.arange(10, dtype=np.float32).reshape(5, 2) / 10.0 - 0.2
    idx_tab = np.array([[0, 4, 4], [2, 2, 2], [1, 3, 0]], np.int64)
    keys = np.array([0.5, 0.1, 0.9, 0.3, 0.7], np.float32)
    gw: dict[Any, np.ndarray] = {}
    perm_seen: dict[Any, np.ndarray] = {}
    ctx = trl.Context(dims=("t",))
    with ctx as ((t, T),):
        w = trl.param(w0, name="w")
        rows = (w * 1.5).take(trl.const(idx_tab)[t])
        perm = trl.const(keys).argsort()
        perm.sink(_by_point(perm_seen))
        y = (rows.tanh() * rows).sum() + ((w.take(perm) * 0.5).exp()[0:2]).sum() * trl.as_tensor(t)
        y.backward()
        w.grad.sink(_by_point(gw))
    ctx.compile({T: Tn}, backend=backend).execute()
    order = np.argsort(keys, kind="stable")
    np.testing.assert_array_equal(perm_seen[()], order)

    def unrolled(wv):
        total = 0.0
        for s in range(Tn):
            r = (wv * 1.5)[idx_tab[s]]
            total = total + jnp.sum(jnp.tanh(r) * r) + jnp.sum(jnp.exp(wv[order] * 0.5)[0:2]) * s
        return total

    np.testing.assert_allclose(gw[()], np.asarray(jax.grad(unrolled)(jnp.asarray(w0))), **TOL)


def test_take_rejects_a_float_index() -> None:
    ctx = trl.Context(dims=("t",))
    with ctx as ((t, T),), pytest.raises(trl.TimeRLError, match="1-D int RT"):
        trl.const(np.zeros((4, 2), np.float32)).take(trl.const(np.zeros(3, np.float32)))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("join", ["stack", "cat"])
def test_gradient_through_stack_and_cat_of_an_int_and_a_float(backend: str, join: str) -> None:
    """``stack``/``cat`` of an int64 and a float32 promote to float32 (as a binary op does), so
    the gradient flows through the float operand. Fuzz seed 941930050: the join took its first
    operand's dtype (int64), autodiff saw an int op and dropped the parameter's gradient."""
    gw: dict[Any, np.ndarray] = {}
    ys: dict[Any, np.ndarray] = {}
    ctx = trl.Context(dims=("t",))
    with ctx as ((t, T),):
        w = trl.param(W0, name="w")
        n = trl.as_tensor(t, trl.int64) * 2 + 1  # an int64 value per t
        nv = n.expand((2,))
        y = trl.stack([nv, w * 1.0]) if join == "stack" else trl.cat([nv, w * 1.0])
        assert y.dtype is trl.float32
        (y * y).sum().backward()
        y.sink(_by_point(ys, "t"))
        w.grad.sink(_by_point(gw))
    ctx.compile({T: 3}, backend=backend).execute()
    for k in range(3):
        want = np.concatenate([np.full(2, 2 * k + 1, np.float32), W0])
        np.testing.assert_allclose(np.ravel(ys[(k,)]), want, **TOL)
    np.testing.assert_allclose(gw[()], 3 * 2 * W0, **TOL)  # sum over 3 points of d(w*w)/dw
