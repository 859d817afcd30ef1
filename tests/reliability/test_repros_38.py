"""Regression tests for the reduced repros of issue 38 (random programs), each on both
backends against ``jax.grad`` of the same program unrolled in plain JAX, with the default
options and with the pass the fix is in switched off.

* a gradient of per-point shape (1,) instead of (3,): ``remove_broadcasts`` re-pointed both
  inputs of one ``ADD`` at the operands of their ``EXPAND``s;
* ``ScheduleError: cannot schedule 'x3'``: ``vectorize_partial`` took the cycle of a
  recurrence whose body lives over a shifted domain (``x[i + 1, t + 1] = f(x[i + 1, t])``:
  reads at ``i + 1`` and ``i - 1``) for one carried along ``i`` and vectorized its body;
* ``TANH_GRAD`` on a batch of 5 rows against 3: ``vectorize_partial`` made a table of 5 rows
  read at ``t < T = 3`` the batch axis of ``t`` whole.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import timerl as trl
from timerl.compile import CompileOptions, build_pdg
from timerl.errors import PDGError
from timerl.pdg.ops import OpKind
from timerl.pdg.passes.broadcast import remove_broadcasts
from timerl.pdg.verify import verify_pdg

BACKENDS = ["torch", "jax"]


def _collect(store: dict[tuple[int, ...], np.ndarray], *dims: str) -> Callable[[Any, dict[str, int]], None]:
    def fn(v: Any, p: dict[str, int]) -> None:
        key = tuple(p[d] for d in dims)
        assert key not in store, f"sink called twice at {key}"
        store[key] = np.array(v)

    return fn


# -- 1. a gradient of the wrong shape ---------------------------------------------------

P1 = np.array([0.03, 0.62, 0.35], np.float32)


def _program_1(got: dict) -> tuple[trl.Context, dict]:
    ctx = trl.Context(dims=("b", "i", "t"))
    with ctx as ((b, B), (i, I), (t, T)):
        p0 = trl.param(P1, name="p0")
        x0 = p0 / 0.5
        x1 = trl.empty((), domain=(b, i, t), name="x1")
        x1[b, 0] = x0.mean()
        x1[b] = (0.5 + x0.sum()).tanh()
        loss = 0.5 * x1
        loss.backward()
        p0.grad.sink(_collect(got))
    return ctx, {B: 3, I: 3, T: 3}


def _want_1() -> np.ndarray:
    """loss = sum over the 27 points of 0.5 x1: 9 points (i = 0) of mean(p / 0.5), 18 of
    tanh(0.5 + sum(p / 0.5))."""

    def loss(p: jax.Array) -> jax.Array:
        x0 = p / 0.5
        return 0.5 * (9 * x0.mean() + 18 * jnp.tanh(0.5 + x0.sum()))

    return np.asarray(jax.grad(loss)(jnp.asarray(P1)))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("options", [{}, {"broadcast": False}, {"cse": False, "simplify": False}])
def test_gradient_of_a_mean_and_a_sum_keeps_its_shape(backend: str, options: dict) -> None:
    got: dict = {}
    ctx, bounds = _program_1(got)
    ctx.compile(bounds, backend=backend, **options).execute()
    assert got[()].shape == (3,)
    np.testing.assert_allclose(got[()], _want_1(), rtol=1e-5)


def test_remove_broadcasts_keeps_one_expand_of_an_add_of_two() -> None:
    """Both inputs of the gradient's ``ADD`` are ``EXPAND``s of (1,) to (3,): at most one
    may be re-pointed at its operand, and ``verify_pdg`` rejects the PDG where both are."""
    ctx, bounds = _program_1({})
    pdg = build_pdg(ctx, bounds, CompileOptions(broadcast=False, cse=False, contract=False, scan_lift=False))
    expands = {n.id for n in pdg if n.op.kind is OpKind.EXPAND}
    adds = [
        n for n in pdg if n.op.kind is OpKind.ADD and all(e.src in expands for e in pdg.data_in_edges(n.id))
    ]
    assert adds, "the program no longer has an ADD of two broadcasts"
    out = remove_broadcasts(pdg)
    verify_pdg(out)
    for n in adds:
        assert any(e.src in expands for e in out.data_in_edges(n.id))
    # the wrong rewrite (both edges re-pointed) is what verify_pdg now catches
    operand = {e.sink: e for e in pdg.edges if e.sink in expands}
    bad = tuple(
        e.__class__(**{**{f: getattr(e, f) for f in e.__dataclass_fields__}, "src": operand[e.src].src})
        if e.sink == adds[0].id
        else e
        for e in pdg.edges
    )
    with pytest.raises(PDGError, match="per-point shape"):
        verify_pdg(pdg.with_(edges=bad))


# -- 2. a recurrence over a shifted domain refused --------------------------------------

P2 = np.array([0.68, 0.61], np.float32)


def _program_2(got: dict, two_losses: bool = True) -> tuple[trl.Context, dict]:
    ctx = trl.Context(dims=("i", "t"))
    with ctx as ((i, I), (t, T)):
        p0 = trl.param(P2, name="p0")
        x3 = trl.empty((), domain=(i, t), name="x3")
        x3[0] = trl.const(np.float32(0.5))
        x3[i + 1, 0] = (0.5 / ((trl.const(np.array([0.5, 0.5], np.float32)) * p0) + 1.0)).sum()
        x3[i + 1, t + 1] = (((0.5 + (x3[i + 1] * 0.1)) + 0.5) + 0.5).tanh()
        (0.5 * x3).backward()
        if two_losses:
            x3.tanh().backward()
        x3.grad.sink(_collect(got, "i", "t"))
    return ctx, {I: 3, T: 3}


def _want_2(two_losses: bool, In: int = 3, Tn: int = 3) -> np.ndarray:
    """dloss/dx3[i, t], as the gradient of the unrolled loss with respect to an offset
    added to each x3[i, t]."""

    def loss(eps: jax.Array) -> jax.Array:
        p = jnp.asarray(P2)
        x = [[None] * Tn for _ in range(In)]
        for i in range(In):
            for t in range(Tn):
                if i == 0:
                    v = jnp.float32(0.5)
                elif t == 0:
                    v = (0.5 / (0.5 * p + 1.0)).sum()
                else:
                    v = jnp.tanh(1.5 + 0.1 * x[i][t - 1])
                x[i][t] = v + eps[i, t]
        xs = jnp.stack([jnp.stack(r) for r in x])
        return (0.5 * xs).sum() + (jnp.tanh(xs).sum() if two_losses else 0.0)

    return np.asarray(jax.grad(loss)(jnp.zeros((In, Tn), jnp.float32)))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("two_losses", [True, False])
@pytest.mark.parametrize("options", [{}, {"vectorize_time": False}])
def test_recurrence_over_a_shifted_domain_with_its_gradient(
    backend: str, two_losses: bool, options: dict
) -> None:
    got: dict = {}
    ctx, bounds = _program_2(got, two_losses)
    ctx.compile(bounds, backend=backend, **options).execute()
    assert sorted(got) == [(i, t) for i in range(3) for t in range(3)]
    have = np.array([[got[(i, t)] for t in range(3)] for i in range(3)])
    np.testing.assert_allclose(have, _want_2(two_losses), rtol=1e-5)


def test_shifted_body_cycle_is_not_carried() -> None:
    """The edges of the recurrence read ``i - 1`` and ``i + 1``: their cycle has distance 0
    along ``i``, so none of its edges is carried (the body stays per point over ``t``)."""
    from timerl.pdg.passes.vectorize_partial import _carried_edges

    ctx, bounds = _program_2({})
    pdg = build_pdg(ctx, bounds, CompileOptions(vectorize_time=False))
    (i, _), _ = pdg.dims
    carried = _carried_edges(pdg, [i])
    x3 = next(n.id for n in pdg if n.name == "x3")
    body = [
        k for k, e in enumerate(pdg.edges) if e.sink == x3 and pdg.nodes[e.src].domain == pdg.nodes[x3].domain
    ]
    assert body and not set(body) & carried


# -- 3. a table read at t vectorized with the wrong number of rows ----------------------

P3 = np.array([-0.2, 0.56], np.float32)
TAB = np.array([-0.38, 0.35, 0.35, -0.06, 0.21], np.float32)  # the repro: p0 never picked
TAB_PICK = np.array([0.7, 0.35, 0.6, -0.06, 0.21], np.float32)  # p0 picked at t = 0 and 2


def _program_3(got: dict, tab: np.ndarray) -> tuple[trl.Context, dict]:
    ctx = trl.Context(dims=("i", "t"))
    with ctx as ((i, I), (t, T)):
        p0 = trl.param(P3, name="p0")
        half = trl.const(np.array([0.5, 0.5], np.float32))
        x2 = trl.empty((2,), domain=(i, t), name="x2")
        x2[i] = (half + (trl.where(half > trl.const(tab)[t], 0.05, p0) * half)).tanh()
        x4 = trl.empty((), domain=(i, t), name="x4")
        x4[0, 0] = trl.const(np.float32(0.5))
        x4[i + 1, 0] = 0.5 + x2[i, t].sum()
        x4[i, t + 1] = trl.const(np.float32(0.5))
        (x4**2.0).backward()
        p0.grad.sink(_collect(got))
    return ctx, {I: 3, T: 3}


def _want_3(tab: np.ndarray, In: int = 3) -> np.ndarray:
    """x4[i, 0] = 0.5 + sum(x2[i - 1, 0]) for i >= 1; every other point is a constant."""

    def loss(p: jax.Array) -> jax.Array:
        sel = jnp.where(0.5 > tab[0], 0.05, p)
        x2 = jnp.tanh(0.5 + sel * 0.5)
        return (In - 1) * (0.5 + x2.sum()) ** 2

    return np.asarray(jax.grad(loss)(jnp.asarray(P3)))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("tab", ["repro", "picked"])
@pytest.mark.parametrize("options", [{}, {"vectorize_time": False}])
def test_table_longer_than_T_read_at_t(backend: str, tab: str, options: dict) -> None:
    table = TAB if tab == "repro" else TAB_PICK
    got: dict = {}
    ctx, bounds = _program_3(got, table)
    ctx.compile(bounds, backend=backend, **options).execute()
    want = _want_3(table)
    assert tab == "repro" or np.abs(want).min() > 0.01  # the variant's gradient is not zero
    np.testing.assert_allclose(got[()], want, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("rows", [2, 3, 5])
def test_table_read_at_t_forward(backend: str, rows: int) -> None:
    """A table of ``rows`` rows read at ``t < T = min(rows, 3)``, vectorized: the rows at
    ``t`` whatever the table's length."""
    tab = np.arange(rows, dtype=np.float32) * 2.0 + 1.0
    Tn = min(rows, 3)
    got: dict = {}
    ctx = trl.Context(dims=("t",))
    with ctx as ((t, T),):
        y = trl.const(tab)[t] * 3.0
        y.sink(_collect(got, "t"))
    ctx.compile({T: Tn}, backend=backend).execute()
    assert sorted(got) == [(k,) for k in range(Tn)]
    np.testing.assert_allclose([got[(k,)] for k in range(Tn)], tab[:Tn] * 3.0)


# -- 4. reverse recurrences whose gradients reach a parameter ---------------------------

P4 = np.array([0.3, -0.2], np.float32)
I4, T4 = 3, 4


def _program_4(got: dict, variant: str) -> tuple[trl.Context, dict]:
    """``y[i, t] = f(y[i, t + 1], y[i, t + 1 : T].discounted_sum(0.9))`` with ``y[i, T - 1]``
    from the parameter: ``direct`` (the body reads ``p`` too), ``forward`` (beside a forward
    recurrence from ``p``), ``shifted`` (the body over ``i + 1``, ``y[0]`` a constant: it was
    refused, then zeros expanded to the window's ``T - t - 1`` rows had no ``t``)."""
    ctx = trl.Context(dims=("i", "t"))
    with ctx as ((i, I), (t, T)):
        p0 = trl.param(P4, name="p0")
        y = trl.empty((), domain=(i, t), name="y")
        y[i, T - 1] = (p0 * 0.5).sum()
        if variant == "direct":
            y[i, t] = (y[i, t + 1] * 0.5 + y[i, t + 1 : T].discounted_sum(0.9) * 0.1 + p0.sum()).tanh()
        elif variant == "forward":
            f = trl.empty((), domain=(i, t), name="f")
            f[i, 0] = p0.mean()
            f[i, t + 1] = (f[i, t] * 0.7 + 0.1).tanh()
            y[i, t] = (y[i, t + 1] * 0.5 + y[i, t + 1 : T].discounted_sum(0.9) * 0.1 + f).tanh()
        else:
            y[i + 1, t] = (y[i + 1, t + 1] * 0.5 + y[i + 1, t + 1 : T].discounted_sum(0.9) * 0.1).tanh()
            y[0, t] = p0.sum() * 0.0 + 0.5
        (y * y).backward()
        if variant != "direct":
            y.tanh().backward()
        p0.grad.sink(_collect(got))
    return ctx, {I: I4, T: T4}


def _want_4(variant: str) -> np.ndarray:
    def loss(p: jax.Array) -> jax.Array:
        total = jnp.float32(0.0)
        for i in range(I4):
            f = [p.mean()]
            for _ in range(T4 - 1):
                f.append(jnp.tanh(f[-1] * 0.7 + 0.1))
            y: list[Any] = [None] * T4
            y[T4 - 1] = (p * 0.5).sum()  # the first branch: every i at t = T - 1
            for t in reversed(range(T4 - 1)):
                disc = sum(0.9**k * y[t + 1 + k] for k in range(T4 - 1 - t))
                if variant == "shifted" and i == 0:
                    y[t] = p.sum() * 0.0 + 0.5
                    continue
                extra = p.sum() if variant == "direct" else f[t] if variant == "forward" else 0.0
                y[t] = jnp.tanh(0.5 * y[t + 1] + 0.1 * disc + extra)
            ys = jnp.stack(y)
            total = total + (ys * ys).sum() + (0.0 if variant == "direct" else jnp.tanh(ys).sum())
        return total

    return np.asarray(jax.grad(loss)(jnp.asarray(P4)))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("variant", ["direct", "forward", "shifted"])
@pytest.mark.parametrize("options", [{}, {"vectorize_time": False}, {"scan_lift": False}])
def test_reverse_recurrence_gradient_reaches_the_parameter(backend: str, variant: str, options: dict) -> None:
    got: dict = {}
    ctx, bounds = _program_4(got, variant)
    ctx.compile(bounds, backend=backend, **options).execute()
    np.testing.assert_allclose(got[()], _want_4(variant), rtol=2e-5, atol=1e-6)


# -- 5. statements placed by a dynamic T before T is known (campaign seeds 517600034/223) --
#
# Both with ``incrementalize=8``: a matmul split into blocks over a new dim ``di``.
# 517600034: the blocks of a per-``i`` matmul that only a backward recurrence reads (at
# ``t = T - 1``, after the episode) came out of isl at ``T + di``: inside the acting loop's
# last iterations and, for ``T == 1``, before it (``if (T == 1)``; the scheduler now solves
# again with them after the episode, ``schedule/bound_known.py``).
# 517600223: the free of a block over ``(di,)`` alone, read at every ``(i, t, di)``, was
# placed after its last reader ``(I - 1, T - 1)`` before that step's bound setter ran
# (``if (_c0 == 1 & _c1 == T)``; a free of a value lacking the episode's dims now waits for
# every episode's setter, ``schedule/dealloc.py``).

P5 = np.array([0.3, -0.2], np.float32)
C5 = np.array([0.5, -0.25], np.float32)
INCREMENTAL = [{}, {"incrementalize": 8}, {"incrementalize": 8, "swap": True, "swap_threshold": 1}]


def _sink(got: dict, name: str, *dims: str) -> Callable[[Any, dict[str, int]], None]:
    def fn(v: Any, p: dict[str, int]) -> None:
        key = (name, *(p[d] for d in dims))
        assert key not in got, f"sink called twice at {key}"
        got[key] = np.array(v)

    return fn


def _episode_end(t: Any, i: Any, first: int) -> Any:
    """Episode ``i`` ends at ``t = first + i % 2``: ``T_i = first + 1 + i % 2``."""
    return trl.as_tensor(t) >= trl.as_tensor(i % 2) + first


def _program_5(got: dict, sink_x4: bool) -> tuple[trl.Context, dict]:
    """``y[i, T - 1] = tanh(sum_0(a @ a^T))``, ``a = w (x) i``, carried back to ``t = 0``,
    beside a loss over ``(i, t)``; ``T_i = 4 + i % 2``."""
    ctx = trl.Context(dims=("i", "t"))
    with ctx as ((i, I), (t, T)):
        w = trl.param(P5, name="w")
        a = w.reshape(2, 1) * trl.as_tensor(i).expand((2,)).reshape(1, 2)
        y = trl.empty((2,), domain=(i, t), name="y")
        y[i, T - 1] = (a @ a.permute(1, 0)).sum(0).tanh()
        y[i, t] = y[i, t + 1]
        y.sink(_sink(got, "y", "i", "t"))
        x3 = (trl.as_tensor(t) + 0.1) * w + trl.as_tensor(i) * 0.0
        x3.sink(_sink(got, "x3", "i", "t"))
        x4 = x3[i, t] * w
        if sink_x4:
            x4.sink(_sink(got, "x4", "i", "t"))
        (x4 * x4).sum().backward()
        w.grad.sink(_sink(got, "g"))
        d = _episode_end(t, i, 3)
    return ctx, {I: 2, T: d}


def _want_5() -> dict:
    w = P5.astype(np.float64)
    want: dict = {}
    for i in range(2):
        for t in range(4 + i % 2):
            want[("y", i, t)] = np.tanh(2 * i * i * w.sum() * w)
            want[("x3", i, t)] = (t + 0.1) * w
            want[("x4", i, t)] = (t + 0.1) * w * w
    n2 = sum((t + 0.1) ** 2 for i in range(2) for t in range(4 + i % 2))
    want[("g",)] = 4 * w**3 * n2  # d/dw of sum (t + 0.1)^2 w^4
    return want


def _program_6(got: dict, sink_x4: bool) -> tuple[trl.Context, dict]:
    """``m[t] = sum_0(((w - c) (x) 0.2) @ ((2t + 1) (x) 0.2))``: the left factor holds no
    dim (its blocks are over ``di`` alone), the right one ``t``; ``T_i = 3 + i % 2``."""
    ctx = trl.Context(dims=("i", "t"))
    with ctx as ((i, I), (t, T)):
        w = trl.param(P5, name="w")
        fifth = trl.const(np.float32(0.2)).expand((2,)).reshape(1, 2)
        a = (w - trl.const(C5)).reshape(2, 1) * fifth
        st = (trl.as_tensor(t, trl.int64) * 2 + 1).cast(trl.float32)
        b = st.expand((2,)).reshape(2, 1) * fifth
        x3 = ((a @ b).sum(0).tanh() + trl.as_tensor(t)) * w + trl.as_tensor(i) * 0.0
        x3.sink(_sink(got, "x3", "i", "t"))
        x4 = x3[i, t] * w
        if sink_x4:
            x4.sink(_sink(got, "x4", "i", "t"))
        (x4 * x4).sum().backward()
        w.grad.sink(_sink(got, "g"))
        d = _episode_end(t, i, 2)
    return ctx, {I: 2, T: d}


def _want_6() -> dict:
    steps = [(i, t) for i in range(2) for t in range(3 + i % 2)]

    def x3(p: jax.Array, t: int) -> jax.Array:
        m = 0.08 * (2 * t + 1) * (p - jnp.asarray(C5)).sum()  # every column of (a @ b).sum(0)
        return (jnp.tanh(m) + t) * p

    def loss(p: jax.Array) -> jax.Array:
        return sum(((x3(p, t) * p) ** 2).sum() for _, t in steps)

    p = jnp.asarray(P5)
    want: dict = {("g",): np.asarray(jax.grad(loss)(p))}
    for i, t in steps:
        want[("x3", i, t)] = np.asarray(x3(p, t))
        want[("x4", i, t)] = np.asarray(x3(p, t) * p)
    return want


def _reference(
    program: Callable[[dict, bool], tuple[trl.Context, dict]], backend: str, sink_x4: bool
) -> dict:
    """The sinks of ``program`` as the schedule-free reference evaluator computes them."""
    got: dict = {}
    ctx, bounds = program(got, sink_x4)
    _reference_of(ctx, bounds, backend)
    return got


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("sink_x4", [True, False])
@pytest.mark.parametrize("options", INCREMENTAL, ids=str)
@pytest.mark.parametrize("case", ["placed", "freed"])
def test_no_statement_needs_T_before_it_is_known(
    backend: str, sink_x4: bool, options: dict, case: str
) -> None:
    program, want_fn = (_program_5, _want_5) if case == "placed" else (_program_6, _want_6)
    got: dict = {}
    ctx, bounds = program(got, sink_x4)
    ctx.compile(bounds, backend=backend, **options).execute()
    ref = _reference(program, backend, sink_x4)
    want = {k: v for k, v in want_fn().items() if sink_x4 or k[0] != "x4"}
    assert sorted(got) == sorted(ref) == sorted(want)
    for k in sorted(got):
        np.testing.assert_allclose(got[k], ref[k], rtol=1e-5, atol=1e-6, err_msg=str(k))
        np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-6, err_msg=str(k))


def test_blocks_placed_by_T_are_found_and_moved(monkeypatch: pytest.MonkeyPatch) -> None:
    """isl's first schedule of 517600034's reduction places the incrementalized blocks by
    ``T``; ``early_bound_statements`` names them, and the schedule solved again has none."""
    from timerl.schedule import scheduler
    from timerl.schedule.bound_known import early_bound_statements

    found: list[list[int]] = []

    def spy(prog: Any, sched: Any, setters: Any) -> dict:
        out = early_bound_statements(prog, sched, setters)
        found.append([n for ns in out.values() for n in ns])
        if out:
            di = {d for d, _ in prog.pdg.dims if d.name.startswith("di")}
            assert all(di & set(prog.pdg.nodes[n].domain) for ns in out.values() for n in ns)
        return out

    monkeypatch.setattr(scheduler, "early_bound_statements", spy)
    ctx, bounds = _program_5({}, True)
    ctx.compile(bounds, backend="torch", incrementalize=8)
    assert found[0] and found[-1] == []


# -- 6. every free given up for an AST that ran a `set` node's children in another order --


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("options", INCREMENTAL, ids=str)
def test_frees_follow_the_order_the_ast_runs(
    backend: str, options: dict, caplog: pytest.LogCaptureFixture
) -> None:
    """Campaign seed 518000192: isl's tree put a statement over no dim (the read of
    ``x1[0, T - 1]``) and the loop reading ``x1[i, t]`` under a ``set`` node; the schedule's
    map ran the statement last, so ``x1[0, T - 1]`` was freed after it, but the AST ran it
    first: the check refused the AST and the program ran with no free at all (a warning
    only). Last uses are now taken from the compute AST's own order when the map's fail."""
    import logging
    import sys
    from pathlib import Path

    from timerl.schedule.ast import Dealloc, walk

    sys.path.insert(0, str(Path(__file__).parents[1] / "fuzz"))
    from fuzz_programs import generate, render
    from test_fuzz import W0, expected

    prog = generate(518000192)
    want = expected(prog)
    got: dict = {n: {} for n in want}
    ctx, bounds = render(prog, W0, got)
    with caplog.at_level(logging.WARNING, logger="timerl"):
        ex = ctx.compile(bounds, backend=backend, **options)
    assert not [r for r in caplog.records if "misorders" in r.getMessage()]
    assert sum(isinstance(x, Dealloc) for x in walk(ex.schedule.ast)) > 20
    ex.execute()
    ref: dict = {n: {} for n in want}
    ctx, bounds = render(prog, W0, ref)
    _reference_of(ctx, bounds, backend)
    for name, points in want.items():
        assert sorted(got[name]) == sorted(ref[name]) == sorted(points)
        for pt, v in points.items():
            np.testing.assert_allclose(
                got[name][pt], ref[name][pt], rtol=1e-5, atol=1e-6, err_msg=f"{name} {pt}"
            )
            np.testing.assert_allclose(np.asarray(got[name][pt], np.float64), v, rtol=2e-4, atol=2e-5)


def _reference_of(ctx: trl.Context, bounds: dict, backend: str) -> None:
    from timerl.backends import get_backend
    from timerl.runtime.reference import reference_evaluate

    reference_evaluate(build_pdg(ctx, bounds, CompileOptions()), get_backend(backend))


# -- 7. a cluster merged across a read of a whole episode (campaign seed 518000283) ------


def _never_forward_of(reads_whole: bool) -> bool:
    """``_Clusterer._never_forward(t)`` for ``y = x + x[0:T].sum(0)`` (or ``+ x[0]``)."""
    from timerl.schedule.cluster import _Clusterer, split_prologue

    ctx = trl.Context(dims=("t",))
    with ctx as ((t, T),):
        x = trl.empty((), domain=(t,), name="x")
        x[0] = trl.const(np.float32(0.5))
        x[t + 1] = (x * 0.5).tanh()
        (x + (x[0:T].sum(0) if reads_whole else x[0])).sink(lambda v, p: None)
    pdg = build_pdg(ctx, {T: 4}, CompileOptions(vectorize_time=False))
    rest, _ = split_prologue(pdg)
    return _Clusterer(rest)._never_forward(t)


def test_a_read_of_a_whole_episode_can_return_later() -> None:
    """The clusterer stops following a path that went back along ``t`` when no edge reads a
    later ``t``; a node over no ``t`` that reads ``x[0:T]``, read back at every ``t``, does
    return to later points (it counted as never forward; reading ``x[0]`` does not)."""
    assert _never_forward_of(reads_whole=False)
    assert not _never_forward_of(reads_whole=True)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("options", INCREMENTAL[1:], ids=str)
def test_recurrence_body_and_a_reader_of_its_episode_stay_apart(backend: str, options: dict) -> None:
    """Seed 518000283 with ``incrementalize=8``: ``x2[t + 1] = relu(tanh(mm(x2, x2, x2)) -
    x0[t])`` (its matmul in blocks over ``(t, di)``) and a flag recurrence reading
    ``x2[t] - t > 0``, vectorized into one node over no ``t`` reading ``x2[0:T]``. The
    clusterer merged x2's body with the flag's step (the path body -> ``x2[t + 1]`` ->
    the vectorized read -> step went back one ``t`` first and was not followed): a cycle,
    ``ScheduleError: cannot schedule 'x0', 'x2', ...``. Compared with the generator's
    interpreter and with the reference evaluator. (Any simpler program clusters otherwise.)"""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parents[1] / "fuzz"))
    from fuzz_programs import generate, render
    from test_fuzz import W0, expected

    prog = generate(518000283)
    want = expected(prog)
    got: dict = {n: {} for n in want}
    ctx, bounds = render(prog, W0, got)
    ctx.compile(bounds, backend=backend, **options).execute()
    ref: dict = {n: {} for n in want}
    ctx, bounds = render(prog, W0, ref)
    _reference_of(ctx, bounds, backend)
    for name, points in want.items():
        assert sorted(got[name]) == sorted(ref[name]) == sorted(points)
        for pt, v in points.items():
            np.testing.assert_allclose(
                np.asarray(got[name][pt], np.float64), np.asarray(ref[name][pt], np.float64)
            )
            np.testing.assert_allclose(np.asarray(got[name][pt], np.float64), v, rtol=2e-4, atol=2e-5)


# -- 8. a recurrence whose "x" term reads the recurrence (campaign seed 518000649) -------

R8 = np.array([0.3, -0.4, 0.8, 0.1], np.float32)


def _program_8(got: dict, x_reads_y: bool) -> tuple[trl.Context, dict]:
    """``y[T - 1] = 0.5``; ``y[t] = r[t] * y[t + 1] + t * y[t + 1]`` (or ``+ t`` alone, a
    true ``x + c * y`` that scan_lift does lift)."""
    ctx = trl.Context(dims=("t",))
    with ctx as ((t, T),):
        r = trl.const(R8)[t] * 1.0
        y = trl.empty((), domain=(t,), name="y")
        y[T - 1] = trl.const(np.float32(0.5))
        x = trl.as_tensor(t) * y[t + 1] if x_reads_y else trl.as_tensor(t) * 1.0
        y[t] = y[t + 1] * r + x
        y.sink(_collect(got, "t"))
    return ctx, {T: 4}


def _want_8(x_reads_y: bool) -> np.ndarray:
    y = [0.0] * 4
    y[3] = 0.5
    for t in reversed(range(3)):
        y[t] = y[t + 1] * float(R8[t]) + (t * y[t + 1] if x_reads_y else t)
    return np.array(y)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("x_reads_y", [True, False])
@pytest.mark.parametrize("options", [{}, {"scan_lift": False}], ids=str)
def test_scan_lift_leaves_a_recurrence_whose_x_reads_it(backend: str, x_reads_y: bool, options: dict) -> None:
    """``y[t] = y[t + 1] * r[t] + t * y[t + 1]`` matched ``x + c * y[t + 1]`` with ``x = t *
    y[t + 1]``: the lifted scan read all of ``x``, which reads the scan's own rows
    (``ScheduleError: cannot schedule 'y', mul, 'y.scan'``). Against the reference evaluator
    and by hand; the independent ``x`` is still lifted."""
    from timerl.pdg.ops import OpKind as K

    got: dict = {}
    ctx, bounds = _program_8(got, x_reads_y)
    ex = ctx.compile(bounds, backend=backend, **options)
    lifted = any(n.op.kind is K.LINEAR_SCAN for n in ex.pdg)
    assert lifted == (not x_reads_y and options.get("scan_lift", True))
    ex.execute()
    ref: dict = {}
    ctx, bounds = _program_8(ref, x_reads_y)
    _reference_of(ctx, bounds, backend)
    assert sorted(got) == sorted(ref) == [(t,) for t in range(4)]
    have = np.array([got[(t,)] for t in range(4)])
    np.testing.assert_allclose(have, [ref[(t,)] for t in range(4)], rtol=1e-6)
    np.testing.assert_allclose(have, _want_8(x_reads_y), rtol=1e-5)
