"""Regression tests for the minimal reproductions of issue 15 (each on both backends).

Every test states the value the unrolled program gives, computed by hand in its docstring.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import timerl as trl

BACKENDS = ["torch", "jax"]


def _collect(store: dict[tuple[int, ...], np.ndarray], *dims: str) -> Callable[[Any, dict[str, int]], None]:
    def fn(v: Any, p: dict[str, int]) -> None:
        key = tuple(p[d] for d in dims)
        assert key not in store, f"sink called twice at {key}"
        store[key] = np.array(v)

    return fn


def _rows(store: dict[tuple[int, ...], np.ndarray], n: int) -> np.ndarray:
    assert sorted(store) == [(k,) for k in range(n)]
    return np.stack([store[(k,)] for k in range(n)])


@pytest.mark.parametrize("backend", BACKENDS)
def test_shifted_read_broadcast_into_branch(backend: str) -> None:
    """n[T-1] = 0; n[t] = v[t+1] with a scalar v = t + 1 broadcast to (2,): the implicit
    expand is an op of the branch and must not read v[T]. Expect [2,2],[3,3],[4,4],[0,0]."""
    got: dict = {}
    ctx = trl.Context(dims=("t",))
    with ctx as ((t, T),):
        v = trl.as_tensor(t) + 1.0
        n = trl.empty((2,), domain=(t,), name="n")
        n[T - 1] = trl.zeros((2,))
        n[t] = v[t + 1]
        n.sink(_collect(got, "t"))
    ctx.compile({T: 4}, backend=backend).execute()
    np.testing.assert_allclose(_rows(got, 4), [[2, 2], [3, 3], [4, 4], [0, 0]])


@pytest.mark.parametrize("backend", BACKENDS)
def test_shifted_read_cast_into_branch(backend: str) -> None:
    """The same with an int value cast to the float RT (the other implicit adapter)."""
    got: dict = {}
    ctx = trl.Context(dims=("t",))
    with ctx as ((t, T),):
        v = trl.as_tensor(t, trl.int64) * 2
        n = trl.empty((), domain=(t,), name="n")
        n[T - 1] = trl.zeros(())
        n[t] = v[t + 1]
        n.sink(_collect(got, "t"))
    ctx.compile({T: 4}, backend=backend).execute()
    np.testing.assert_allclose(_rows(got, 4), [2, 4, 6, 0])


@pytest.mark.parametrize("backend", BACKENDS)
def test_max_over_slice_in_branch_not_taken(backend: str) -> None:
    """y[T-1] = 0; y[t] = max(y[t+1:T]) + 1: the max at t = T-1 is over an empty slice,
    but that branch is not taken there. Expect [3, 2, 1, 0]."""
    got: dict = {}
    ctx = trl.Context(dims=("t",))
    with ctx as ((t, T),):
        y = trl.empty((), domain=(t,), name="y")
        y[T - 1] = trl.zeros(())
        y[t] = y[t + 1 : T].max(0) + 1.0
        y.sink(_collect(got, "t"))
    ctx.compile({T: 4}, backend=backend).execute()
    np.testing.assert_allclose(_rows(got, 4), [3, 2, 1, 0])


def _grad_of_w(backend: str, read: Callable[[Any, Any, Any, Any], Any], T_: int = 4) -> float:
    got: dict = {}
    ctx = trl.Context(dims=("t",))
    with ctx as ((t, T),):
        w = trl.param(np.float32(0.5), name="w")
        x = trl.as_tensor(t) * w
        y = read(x, t, T, trl)
        (y * y).backward()
        w.grad.sink(_collect(got))
    ctx.compile({T: T_}, backend=backend).execute()
    return float(got[()])


GRAD_CASES = {
    # loss = sum_t (w * k(t))^2, so dloss/dw = 2 w sum_t k(t)^2 = sum_t k(t)^2 at w = 0.5
    "clamped max(t-1,0)": (lambda x, t, T, trl: x[trl.max(t - 1, 0)], 0 + 0 + 1 + 4),
    "reversal T-1-t": (lambda x, t, T, trl: x[T - 1 - t], 9 + 4 + 1 + 0),
    "floor div t//2": (lambda x, t, T, trl: x[t // 2], 0 + 0 + 1 + 1),
    "mod t%3": (lambda x, t, T, trl: x[t % 3], 0 + 1 + 4 + 0),
    "stride 2*t clamped": (lambda x, t, T, trl: x[trl.min(2 * t, T - 1)], 0 + 4 + 9 + 9),
    "constant T-1": (lambda x, t, T, trl: x[T - 1], 9),  # y = x[T-1] has no t: one term
    # windows: k(t) = sum of the indices in the window
    "window max(t-1,0):t+1": (lambda x, t, T, trl: x[trl.max(t - 1, 0) : t + 1].sum(0), 0 + 1 + 9 + 25),
    "window t:min(t+2,T)": (lambda x, t, T, trl: x[t : trl.min(t + 2, T)].sum(0), 1 + 9 + 25 + 9),
    "window 0:t//2+1": (lambda x, t, T, trl: x[0 : t // 2 + 1].sum(0), 0 + 0 + 1 + 1),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", sorted(GRAD_CASES))
def test_gradient_through_non_shift_index(backend: str, case: str) -> None:
    """DESIGN §2: gradients equal the unrolled program's whatever the affine index."""
    read, want = GRAD_CASES[case]
    assert _grad_of_w(backend, read) == pytest.approx(float(want), rel=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_gradient_through_non_shift_index_over_two_dims(backend: str) -> None:
    """x over (i, t) read at (i, max(t - 1, 0)) and the loss over (i, t): the mask is per t
    and i is recovered by the shift. loss_i = sum_t (w (i+1) k(t))^2 with k = 0,0,1,2;
    dloss/dw = 2 w sum_i (i+1)^2 * 5 = 5 * (1 + 4) = 25 at w = 0.5 (I = 2)."""
    got: dict = {}
    ctx = trl.Context(dims=("i", "t"))
    with ctx as ((i, I), (t, T)):
        w = trl.param(np.float32(0.5), name="w")
        x = trl.as_tensor(t) * (trl.as_tensor(i) + 1.0) * w
        y = x[i, trl.max(t - 1, 0)]
        (y * y).backward()
        w.grad.sink(_collect(got))
    ctx.compile({I: 2, T: 4}, backend=backend).execute()
    assert float(got[()]) == pytest.approx(25.0, rel=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_slice_of_view_with_clamped_index(backend: str) -> None:
    """u = x[max(t-2, 0)], then u[0:t+1].sum(0): the view is materialised first.
    u = 0,0,0,1, so the prefix sums are [0, 0, 0, 1]."""
    got: dict = {}
    ctx = trl.Context(dims=("t",))
    with ctx as ((t, T),):
        u = (trl.as_tensor(t) * 1.0)[trl.max(t - 2, 0)]
        u[0 : t + 1].sum(0).sink(_collect(got, "t"))
    ctx.compile({T: 4}, backend=backend).execute()
    np.testing.assert_allclose(_rows(got, 4), [0, 0, 0, 1])


def _case5(backend: str, iters: int) -> np.ndarray:
    h = np.full(2, 0.5, np.float32)
    got: dict = {}
    ctx = trl.Context(dims=("i", "t"))
    with ctx as ((i, I), (t, T)):
        w = trl.param(np.array([-0.39, 0.32], np.float32), domain=(i,), name="w")
        x1 = trl.where((I - 1 - i) % 2 == 0, trl.const(h), trl.const(h))
        a = trl.empty((2,), domain=(t,), name="a")
        b = trl.empty((), domain=(t,), name="b")
        a[0] = trl.const(h)
        a[t + 1] = ((trl.const(h) + b * 0.65) + trl.const(h)).tanh()
        b[0] = (0.5 - x1[0:I].mean(0)).mean()
        b[t + 1] = 0.5 + a[t + 1].sum() * -0.11
        y = trl.empty((), domain=(i,), name="y")
        y[0] = trl.const(np.float32(0.5))
        y[i + 1] = y * 0.81 + a[0].mean()
        (w * 1.0).sum().backward()
        y.sink(_collect(got, "i"))
        w[i + 1] = w - 0.2 * w.grad
    ctx.compile({I: iters, T: 5}, backend=backend).execute()
    return _rows(got, iters)


@pytest.mark.parametrize("backend", BACKENDS)
def test_schedule_of_separate_constants(backend: str) -> None:
    """Issue 15 case 5 (I = 5 gave a schedule that ran 'b' at t = 1 before its input).
    y[0] = 0.5, y[i+1] = 0.81 y[i] + mean(a[0]) with a[0] = 0.5."""
    want = [0.5]
    for _ in range(4):
        want.append(want[-1] * 0.81 + 0.5)
    np.testing.assert_allclose(_case5(backend, 5), want, rtol=1e-5)


def test_ast_check_catches_misordered_isl_ast() -> None:
    """isl's tree code generator emits S7 before S24 at one iteration for this schedule (isl
    0.27); the AST check must notice, and the flat-map AST must be legal."""
    from timerl.compile import CompileOptions, build_pdg
    from timerl.schedule.check import verify_ast
    from timerl.schedule.cluster import cluster_pdg, expand_ast, split_prologue
    from timerl.schedule.isl import IslProgram
    from timerl.schedule.scheduler import _checked_ast

    bad_tree = (
        '{ domain: "{ S24[t] : 0 <= t <= 3; S16[]; S33[]; S1[i] : 0 <= i <= 4; S6[t] : 0 <= t <= 4; '
        'S7[t] : 0 <= t <= 4 }", child: { schedule: "[{ S24[t] -> [(7 + 3t)]; S16[] -> [(4)]; '
        'S33[] -> [(0)]; S1[i] -> [(i)]; S6[t] -> [(4t)]; S7[t] -> [(4 + 3t)] }]", child: { schedule: '
        '"[{ S24[t] -> [(0)]; S16[] -> [(0)]; S33[] -> [(4)]; S1[i] -> [(5 - 2i)]; S6[t] -> [(3 - t)]; '
        'S7[t] -> [(1)] }]" } } }'
    )
    h = np.full(2, 0.5, np.float32)
    ctx = trl.Context(dims=("i", "t"))
    with ctx as ((i, I), (t, T)):
        w = trl.param(np.array([-0.39, 0.32], np.float32), domain=(i,), name="w")
        x1 = trl.where((I - 1 - i) % 2 == 0, trl.const(h), trl.const(h))
        a = trl.empty((2,), domain=(t,), name="a")
        b = trl.empty((), domain=(t,), name="b")
        a[0] = trl.const(h)
        a[t + 1] = ((trl.const(h) + b * 0.65) + trl.const(h)).tanh()
        b[0] = (0.5 - x1[0:I].mean(0)).mean()
        b[t + 1] = 0.5 + a[t + 1].sum() * -0.11
        y = trl.empty((), domain=(i,), name="y")
        y[0] = trl.const(np.float32(0.5))
        y[i + 1] = y * 0.81 + a[0].mean()
        (w * 1.0).sum().backward()
        y.sink(lambda v, p: None)
        w[i + 1] = w - 0.2 * w.grad
    bounds = {I: 5, T: 5}
    pdg = build_pdg(ctx, bounds, CompileOptions())
    rest, prologue = split_prologue(pdg)
    small, members = cluster_pdg(rest)
    assert sorted(small.nodes) == [1, 6, 7, 16, 24, 33], "the program lowers differently; update the tree"
    import islpy as isl

    prog = IslProgram(small)
    sched = isl.Schedule.read_from_str(prog.ctx, bad_tree)
    validity = prog.dependences(proximity=False)
    tree_ast, _ = prog.build_ast(sched)
    assert not prog.ast_violations(tree_ast, validity, same_point_ok=True).is_empty()
    ast, _ = _checked_ast(small, prog, sched, validity, True)
    from timerl.schedule import ast as tast

    full = tast.Seq(tuple(tast.Exec(n, ()) for n in prologue) + (expand_ast(ast, members),))
    verify_ast(pdg, full, {I: 5, T: 5})


@pytest.mark.parametrize("backend", BACKENDS)
def test_dynamic_bound_in_as_tensor(backend: str) -> None:
    """as_tensor(T - 1 - t) with T found at run time (t >= 5 ends the episode: T = 6)."""
    got: dict = {}
    ctx = trl.Context(dims=("t",))
    with ctx as ((t, T),):
        done = trl.as_tensor(t) >= 5.0
        (trl.as_tensor(T - 1 - t) * 1.0).sink(_collect(got, "t"))
    ctx.compile({T: done}, backend=backend).execute()
    np.testing.assert_allclose(_rows(got, 6), [5, 4, 3, 2, 1, 0])


@pytest.mark.parametrize("backend", BACKENDS)
def test_dynamic_bound_in_where_and_reversed_read(backend: str) -> None:
    """where(t < T - 2, ...) and a reversed read x[T - 1 - t] of a dynamic episode (T = 4)."""
    got: dict = {}
    ctx = trl.Context(dims=("t",))
    with ctx as ((t, T),):
        done = trl.as_tensor(t) >= 3.0
        x = trl.as_tensor(t) * 10.0
        v = trl.where(t < T - 2, x[T - 1 - t], trl.zeros(()) - 1.0)
        v.sink(_collect(got, "t"))
    ctx.compile({T: done}, backend=backend).execute()
    np.testing.assert_allclose(_rows(got, 4), [30, 20, -1, -1])


def _batch_program(B_: int) -> trl.Context:
    """~20 RT statements over (b, i, t) where a b-domain tensor is read at a fixed b."""
    ctx = trl.Context(dims=("b", "i", "t"))
    with ctx as ((b, B), (i, I), (t, T)):
        w = trl.param(np.array([0.3, -0.2], np.float32), domain=(i,), name="w")
        x1 = trl.empty((2,), domain=(b, i, t), name="x1")
        x1[b, i, 0] = w * (trl.as_tensor(b) + 1.0)
        x1[b, i, t + 1] = (x1[b, i, t] * w).tanh() + 0.1
        s = x1[0, i, 0 : t + 1].sum(0)
        y = trl.empty((2,), domain=(i, t), name="y")
        y[i, 0] = s[i, 0]
        y[i, t + 1] = y[i, t] * 0.5 + s[i, t + 1]
        (y * y).sum().backward()
        w[i + 1] = w - 0.1 * w.grad
        y[i, T - 1].sum().sink(lambda v, p: None)
    ctx.compile({B: B_, I: 3, T: 3}, backend="torch")
    return ctx


def test_compile_work_does_not_grow_with_a_static_batch_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 15 case 7: B = 4 took 14 s, B = 8 44 s (and B = 2 over a minute here): isl now
    schedules with the static bounds as parameters, so what it is given (the parameters and
    the statements' domains) is the same whatever B is; only the AST pins B's value."""
    from timerl.schedule import isl as tisl

    seen: dict[int, list[tuple[tuple[str, ...], dict[str, int]]]] = {}
    real = tisl.IslProgram.__init__

    def spy(self: Any, pdg: Any, ctx: Any = None, parametric: bool = False) -> None:
        real(self, pdg, ctx, parametric)
        if parametric:
            seen.setdefault(current, []).append(
                (tuple(self.params), {b.name: v for b, v in self.fixed.items()})
            )

    monkeypatch.setattr(tisl.IslProgram, "__init__", spy)
    for current in (2, 8):
        _batch_program(current)
    assert seen[2] and len(seen[2]) == len(seen[8])
    for (p2, f2), (p8, f8) in zip(seen[2], seen[8], strict=True):
        assert p2 == p8 and "B" in p2  # B is an isl parameter, not a constant
        assert f2.pop("B") == 2 and f8.pop("B") == 8 and f2 == f8


def test_isl_budget_falls_back_with_a_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    """When isl runs past its budget, a coarser (Feautrier) schedule is used and logged."""
    from timerl.schedule import isl as tisl
    from timerl.schedule import scheduler

    warnings: list[str] = []

    class _Log:  # the module's logger may be disabled by a library's logging config
        def warning(self, msg: str, *args: Any) -> None:
            warnings.append(msg % args)

        def debug(self, *args: Any) -> None:
            pass

    monkeypatch.setattr(scheduler, "log", _Log())
    monkeypatch.setattr(scheduler, "ISL_BUDGET_S", 0.0)  # a reply before the deadline check cannot win
    monkeypatch.setattr(tisl, "_SOLVER_START_S", 0.0)
    got: dict = {}
    ctx = trl.Context(dims=("t",))
    with ctx as ((t, T),):
        x = trl.empty((), domain=(t,), name="x")
        x[0] = trl.ones(())
        x[t + 1] = x[t] * 2.0
        x.sink(_collect(got, "t"))
    try:
        ctx.compile({T: 4}, backend="torch").execute()
    except trl.TimeRLError as e:  # the fallback ran past the budget too: a clear error, no hang
        assert "budget" in str(e)
        assert warnings
        return
    assert any("ran past" in w for w in warnings), warnings
    np.testing.assert_allclose(_rows(got, 4), [1, 2, 4, 8])


def _shared_param_per_episode(backend: str, over_t_alone: bool) -> float:
    got: dict = {}
    ctx = trl.Context(dims=("i", "t"))
    with ctx as ((i, I), (t, T)):
        w = trl.param(np.float32(0.5), name="w")
        if over_t_alone:  # the product is a node over t alone, read at every i
            x = (trl.as_tensor(t) + 1.0) * w + trl.as_tensor(i) * 0.0
        else:
            x = (trl.as_tensor(t) + 1.0 + trl.as_tensor(i) * 0.0) * w
        (x * x).backward()
        w.grad.sink(_collect(got))
        done = trl.as_tensor(t) >= trl.as_tensor(i % 2) + 2
    ctx.compile({I: 3, T: done}, backend=backend).execute()
    return float(got[()])


@pytest.mark.parametrize("backend", BACKENDS)
def test_gradient_of_a_shared_parameter_over_per_episode_dynamic_T(backend: str) -> None:
    """Found by the fuzzer: w (no dims) used at every (i, t) with T per i (T_i = 3 + i % 2);
    the gradient sums over t up to each episode's own T. x = w (t + 1), loss = sum x^2,
    dloss/dw = 2 w sum_i sum_{t < T_i} (t + 1)^2 = (1 + 4 + 9) * 2 + (1 + 4 + 9 + 16) = 58."""
    assert _shared_param_per_episode(backend, False) == pytest.approx(58.0, rel=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_gradient_through_a_node_over_t_alone_under_per_episode_T(backend: str) -> None:
    """The same with the product over t alone: summing its readers' gradients over i at
    each t would need every episode's T at once (a node over t alone has no single T).
    Autodiff keeps that gradient over (i, t) and sums over i later, at the parameter
    (t first, up to each episode's T): 58 as above, not 42 (one T = 3 for every i)."""
    assert _shared_param_per_episode(backend, True) == pytest.approx(58.0, rel=1e-6)


def _over_t_alone(backend: str, variant: str) -> dict:
    """x = (t + 1) w over t alone (w = 0.5, no dims), I = 2, T = 3, read at every (i, t)."""
    got: dict = {}
    ctx = trl.Context(dims=("i", "t"))
    with ctx as ((i, I), (t, T)):
        w = trl.param(np.float32(0.5), name="w")
        x = (trl.as_tensor(t) + 1.0) * w
        if variant == "read at x[i]":  # the reader's i picks x's point: no sum over i to defer
            y = x[i] * (trl.as_tensor(t) + 1.0)
            (y * y).backward()
        elif variant == "also read over t alone":  # one reader lacks i: summed at once
            y = x + trl.as_tensor(i) * 0.0
            z = x * 2.0
            (y * y).backward()
            (z * z).backward()
        else:
            y = x + trl.as_tensor(i) * 0.0
            (y * y).backward()
            x.grad.sink(_collect(got, "t"))
        w.grad.sink(_collect(got))
    ctx.compile({I: 2, T: 3}, backend=backend).execute()
    return got


@pytest.mark.parametrize("backend", BACKENDS)
def test_gradient_kept_over_i_is_not_kept_where_the_reader_indexes_with_i(backend: str) -> None:
    """y[i, t] = x[i] (t + 1) = (i + 1)(t + 1) w: dL/dw = 2 w sum_i (i + 1)^2 sum_t (t + 1)^2
    = 2 * 0.5 * 5 * 14 = 70 (a gradient of x kept over i as well would count each point I times)."""
    assert float(_over_t_alone(backend, "read at x[i]")[()]) == pytest.approx(70.0, rel=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_gradient_over_t_alone_with_a_reader_without_i(backend: str) -> None:
    """x read at every (i, t) by y = x and over t alone by z = 2 x: dL/dw = 2 w I sum (t + 1)^2
    + 8 w sum (t + 1)^2 = 28 + 56 = 84."""
    assert float(_over_t_alone(backend, "also read over t alone")[()]) == pytest.approx(84.0, rel=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_grad_of_a_node_whose_gradient_is_kept_over_i(backend: str) -> None:
    """x.grad read by the user is over x's own domain: dL/dx[t] = sum_i 2 y = 2 I (t + 1) w
    = 2, 4, 6; and dL/dw = sum_t (t + 1) dL/dx[t] = 2 + 8 + 18 = 28."""
    got = _over_t_alone(backend, "grad of x")
    np.testing.assert_allclose([got[(k,)] for k in range(3)], [2.0, 4.0, 6.0], rtol=1e-6)
    assert float(got[()]) == pytest.approx(28.0, rel=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("options", [{}, {"dce": False}, {"dce": False, "check_reads": False}])
def test_dead_value_reading_a_branch_neighbour_is_accepted_without_dce(backend: str, options: dict) -> None:
    """Found by the fuzzer (seed 4011: a `where(~(a > c), ...)` whose unused `b < c` read
    x[t + 1]): a value nobody reads, `(0.1 - x[t + 1]) < 0.25` beside the backward
    recurrence x[T - 1] = 0, x[t] = x[t + 1] / 2 + 1, reads x[T] at t = T - 1. With dce on it
    was removed; with it off the compile failed (UndefinedPointError), or with check_reads
    off too, the run. A value no reader uses is evaluated nowhere. Expect 1.75, 1.5, 1, 0."""
    got: dict = {}
    ctx = trl.Context(dims=("t",))
    with ctx as ((t, T),):
        x = trl.empty((), domain=(t,), name="x")
        x[T - 1] = trl.zeros(())
        nxt = x[t + 1]
        unused = (0.1 - nxt) < 0.25
        x[t] = nxt * 0.5 + 1.0
        x.sink(_collect(got, "t"))
    del unused
    ctx.compile({T: 4}, backend=backend, **options).execute()
    np.testing.assert_allclose(_rows(got, 4), [1.75, 1.5, 1.0, 0.0])
