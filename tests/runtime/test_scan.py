"""Static loops run as one call (``runtime/scan.py``, option ``scan_loops``: one ``lax.scan``
on JAX, one loop over prepared kernels on Torch): the same values as the loop run statement
by statement and as the reference evaluator, and only loops whose statements are all
traceable are scanned."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import numpy as np
import pytest

import timerl as trl
from timerl.backends import get_backend
from timerl.compile import CompileOptions, build_pdg
from timerl.runtime.reference import reference_evaluate
from timerl.schedule.ast import Loop, walk

W = np.array([[0.5, -0.3], [0.2, 0.8]], np.float32)
TAB = np.linspace(-1.0, 1.0, 14, dtype=np.float32).reshape(7, 2)


def _program(sink_inside: bool = False) -> tuple[trl.Context, dict, dict]:
    """x[i, 0] = w[i]; x[i, t + 1] = tanh(x[i, t] @ W) + 0.1 * tab[t]; w learns from x."""
    seen: dict = {"sum": {}, "inside": {}}
    ctx = trl.Context(dims=("i", "t"))
    with ctx as ((i, I), (t, T)):
        w = trl.param(np.array([0.3, -0.2], np.float32), domain=(i,), name="w")
        x = trl.empty((2,), domain=(i, t), name="x")
        x[i, 0] = w * 1.0
        x[i, t + 1] = (x @ trl.const(W)).tanh() + trl.const(TAB)[t] * 0.1
        if sink_inside:
            x.sink(lambda v, p: seen["inside"].__setitem__((p["i"], p["t"]), np.array(v)))
        total = x[i, 0:T].sum()
        total.sink(lambda v, p: seen["sum"].__setitem__(p["i"], float(v)))
        (total * total).backward()
        w[i + 1] = w - 0.05 * w.grad
    return ctx, {I: 3, T: 7}, seen


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_a_pure_recurrence_is_scanned_with_the_same_values(backend: str) -> None:
    runs = {}
    for scan in (False, True):
        ctx, bounds, seen = _program()
        ex = ctx.compile(bounds, backend=backend, scan_loops=scan)
        ex.execute()
        runs[scan] = (seen["sum"], ex._interp.scanned_entries)
    (off, n_off), (on, n_on) = runs[False], runs[True]
    assert n_off == 0
    assert n_on == 3  # one scan per iteration i
    assert sorted(on) == [0, 1, 2] and len({round(v, 4) for v in on.values()}) == 3  # w moved
    for k in on:
        np.testing.assert_allclose(on[k], off[k], rtol=1e-6)
    ctx, bounds, seen = _program()
    reference_evaluate(build_pdg(ctx, bounds, CompileOptions()), get_backend(backend))
    for k in on:
        np.testing.assert_allclose(seen["sum"][k], on[k], rtol=1e-5)


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_the_first_iteration_runs_inside_the_scan(caplog, backend: str) -> None:
    """x[i, 0] = w reads a value from outside the loop over t: it is the carry's first
    value, and no iteration is peeled (the values: the test above and the reference)."""
    caplog.set_level(logging.DEBUG, logger="timerl.runtime.scan")
    ctx, bounds, _ = _program()
    ctx.compile(bounds, backend=backend).execute()
    scans = [r.getMessage() for r in caplog.records if "as one scan" in r.getMessage()]
    assert scans and all("7 iterations" in m and "(0 peeled before, 0 after)" in m for m in scans), scans


def test_a_scan_that_fails_from_the_first_iteration_peels_it(caplog, monkeypatch) -> None:
    """If the scan with the first iteration's values fails (JAX: nothing ran), that loop
    peels its first iteration from then on, with the same values."""
    from timerl.runtime.scan import ScannedLoop

    orig = ScannedLoop._scan

    def failing(self, peeled, vals, choice, kinds, first_values=None, tail=()):  # type: ignore[no-untyped-def]
        if first_values:
            raise TypeError("a carry of another type")
        return orig(self, peeled, vals, choice, kinds, first_values, tail)

    monkeypatch.setattr(ScannedLoop, "_scan", failing)
    caplog.set_level(logging.DEBUG, logger="timerl.runtime.scan")
    ctx, bounds, seen = _program()
    ex = ctx.compile(bounds, backend="jax")
    ex.execute()
    assert ex._interp.scanned_entries == 3
    assert any("its first iteration is peeled" in r.getMessage() for r in caplog.records)
    ctx, bounds, ref = _program()
    reference_evaluate(build_pdg(ctx, bounds, CompileOptions()), get_backend("jax"))
    for k in ref["sum"]:
        np.testing.assert_allclose(seen["sum"][k], ref["sum"][k], rtol=1e-5)


def _countdown_program(n: int = 6):
    """x[T-1] = c; x[t] = y[t+1] (t < T-1); y[t] = x[t] + 1.5, run by a loop counting t down
    (its first iteration, the base case, peeled); s = max(y[0:T]) reads the rows whole."""
    from runtime_pdgs import Builder, Program, T, c0, const, ex, loop, t

    from timerl.pdg.ir import TensorSpec
    from timerl.pdg.ops import DType, OpKind
    from timerl.schedule.ast import Seq
    from timerl.symbolic import ZERO, Slice

    b = Builder()
    v2 = TensorSpec((2,), DType.float32)
    c = b.add(OpKind.CONST, (), (v2,), "c", **const([0.25, -1.0]))
    k = b.add(OpKind.CONST, name="k", **const(1.5))
    x = b.add(OpKind.MERGE, (t,), (v2,), "x")
    y = b.add(OpKind.ADD, (t,), (v2,), "y")
    s = b.add(OpKind.MAX, (), (v2,), "s", dims=(0,), keepdim=False)  # no zero padding
    b.read(x, c, (), cond=t >= T - 1)
    b.read(x, y, (t + 1,), cond=t < T - 1)
    b.read(y, x, (t,))
    b.read(y, k, ())
    b.read(s, y, (Slice(ZERO, T),))
    ast = Seq((ex(c), ex(k), loop(c0, 0, c0 < T, ex(x, T - 1 - c0), ex(y, T - 1 - c0)), ex(s)))
    return Program(b.pdg(((t, T),), {T: n}), ast, {"x": x, "y": y, "s": s})


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_a_loop_counting_down_is_scanned_and_read_whole(backend: str) -> None:
    """The scan flips the rows of a loop that counts its points down, so the stacked array a
    slice read takes ascends like a stack of the points (peeled base case at the end)."""
    from helpers_rt import assert_matches_reference, interpret

    prog = _countdown_program()
    be = get_backend(backend)
    runs = {}
    for scan in (False, True):
        e = interpret(prog.pdg, prog.ast, be, scan_loops=scan)
        e.execute()
        runs[scan] = e
    assert runs[False].scanned_entries == 0 and runs[True].scanned_entries == 1
    s = prog.ids["s"]
    want = np.array([0.25, -1.0]) + 1.5 * 6  # y[t] = c + 1.5 (T - t), largest at t = 0
    for e in runs.values():
        np.testing.assert_allclose(e.value(s, ()), want, rtol=1e-6)
    hints = runs[True].stack_hints[(prog.ids["y"], 0)]
    ((first, rows, _),) = hints.values()
    assert (first, rows) == (0, 6)
    for t_ in range(6):
        np.testing.assert_array_equal(
            runs[True].value(prog.ids["y"], (t_,)), runs[False].value(prog.ids["y"], (t_,))
        )
    assert_matches_reference(runs[True], reference_evaluate(prog.pdg, be), prog.pdg, min_points=13)


def _lagged_read_program(n: int = 3, m: int = 2):
    """a[t, j] = c + k; g[t, j] = tanh(a[max(t - 1, 0), j]) in one loop over j inside a loop
    over t; s = max(g[0:T, 0:J])."""
    from runtime_pdgs import Builder, Program, T, c0, c1, const, ex, loop, t

    from timerl.pdg.ir import TensorSpec
    from timerl.pdg.ops import DType, OpKind
    from timerl.schedule.ast import Seq
    from timerl.symbolic import ZERO, Slice, Sym, smax

    j, J = Sym("j"), Sym("J", True)
    b = Builder()
    v2 = TensorSpec((2,), DType.float32)
    c = b.add(OpKind.CONST, (), (v2,), "c", **const([0.25, -1.0]))
    k = b.add(OpKind.CONST, name="k", **const(0.5))
    a = b.add(OpKind.ADD, (t, j), (v2,), "a")
    g = b.add(OpKind.TANH, (t, j), (v2,), "g")
    s = b.add(OpKind.MAX, (), (v2,), "s", dims=(0, 1), keepdim=False)
    b.read(a, c, ())
    b.read(a, k, ())
    b.read(g, a, (smax(t - 1, 0), j))
    b.read(s, g, (Slice(ZERO, T), Slice(ZERO, J)))
    inner = loop(c1, 0, c1 < J, ex(a, c0, c1), ex(g, c0, c1))
    ast = Seq((ex(c), ex(k), loop(c0, 0, c0 < T, inner), ex(s)))
    return Program(b.pdg(((t, T), (j, J)), {T: n, J: m}), ast, {"a": a, "g": g, "s": s})


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_a_read_local_at_one_entry_only_keeps_its_source(backend: str) -> None:
    """``g[t, j]`` reads ``a[max(t - 1, 0), j]``: at ``t = 0`` its own point, so the loop over
    ``j`` is scanned with the read inside the step; at ``t = 1`` the read is of the previous
    entry's point, the loop runs statement by statement and needs ``a[0, j]`` from the store
    (it was kept inside the scan only: RuntimeExecutionError, fuzz seed 517300057)."""
    from helpers_rt import interpret

    prog = _lagged_read_program()
    e = interpret(prog.pdg, prog.ast, get_backend(backend), scan_loops=True)
    e.execute()
    assert e.scanned_entries == 1  # t = 0 only
    want = np.tanh(np.array([0.75, -0.5]))
    np.testing.assert_allclose(e.value(prog.ids["s"], ()), want, rtol=1e-6)


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_a_loop_with_a_sink_is_not_scanned(backend: str) -> None:
    ctx, bounds, seen = _program(sink_inside=True)
    ex = ctx.compile(bounds, backend=backend, scan_loops=True)
    ex.execute()
    assert ex._interp.scanned_entries == 0
    assert len(seen["inside"]) == 3 * 7


@pytest.mark.parametrize("backend", ["jax", "torch"])
@pytest.mark.parametrize("epochs", [1, 2])
def test_ppo_on_gymnax_scans_its_rollout(epochs: int, backend: str) -> None:
    """PPO's acting loop on gymnax (observation branch, policy, env step in the carry) runs as
    one scan per iteration: the same rollouts, the same parameters to float rounding."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
    import ppo

    runs = {}
    for scan in (False, True):
        args = ppo.Args(
            env_id="gymnax.CartPole-v1",
            backend=backend,
            num_envs=4,
            num_steps=12,
            iterations=3,
            seed=1,
            ent_coef=0.01,
            update_epochs=epochs,
            num_minibatches=2 if epochs > 1 else 1,
        )
        log: list = []
        ex = ppo.build_fixed(
            args, lambda v, p, log=log: log.append((p["i"], v.copy())), scan_loops=scan, dealloc=False
        )  # the final parameters are read from the store after the run
        ex.execute()
        params = {n.name: n.id for n in ex.pdg if n.name in ("dnn.w0", "dnn.vw2")}
        last = (2,) if epochs == 1 else (2, epochs - 1, 1)
        runs[scan] = (
            log,
            {k: ex._interp.value(nid, last) for k, nid in params.items()},
            ex._interp.scanned_entries,
        )
    (log0, w0, n0), (log1, w1, n1) = runs[False], runs[True]
    # every iteration scans its rollout, and (one epoch) the loops of v_next and GAE's coefficient
    assert n0 == 0 and n1 >= 3 and n1 % 3 == 0
    assert [k for k, _ in log0] == [k for k, _ in log1] == [0, 1, 2]
    for (_, a), (_, b) in zip(log0, log1, strict=True):
        np.testing.assert_array_equal(a, b)
    assert w0.keys() == w1.keys() == {"dnn.w0", "dnn.vw2"}
    for k in w0:
        np.testing.assert_allclose(w0[k], w1[k], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_a_loop_whose_last_iteration_branches_off_scans_the_others(caplog, backend: str) -> None:
    """PPO with epochs runs ``v_next[t] = v[t + 1]`` forwards, ``v_next[T - 1] = v_last`` at
    the last iteration only: the iterations before it are one scan, the last runs after it
    (its rollouts and parameters: the test above, scans on vs off)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
    import ppo

    caplog.set_level(logging.DEBUG, logger="timerl.runtime.scan")
    args = ppo.Args(
        env_id="gymnax.CartPole-v1", backend=backend, num_envs=4, num_steps=12, iterations=2,
        update_epochs=2, num_minibatches=2,
    )  # fmt: skip
    ppo.build_fixed(args, lambda v, p: None).execute()
    scans = [r.getMessage() for r in caplog.records if "as one scan" in r.getMessage()]
    assert any("'v_next'" in m and "11 iterations" in m and "1 after" in m for m in scans), scans


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_a_loop_with_nothing_read_per_iteration_from_outside_is_scanned(caplog, backend: str) -> None:
    """No scanned input (only the carry): the scan gets its length explicitly."""
    got: dict = {}
    ctx = trl.Context(dims=("i", "t"))
    with ctx as ((i, I), (t, T)):
        w = trl.param(np.ones(2, np.float32), domain=(i,), name="w")
        x = trl.empty((2,), domain=(i, t), name="x")
        x[i, 0] = w * 1.0
        x[i, t + 1] = x * 0.5 + 0.25
        (x * w).sum().backward()
        w[i + 1] = w - 0.1 * w.grad
        w.sink(lambda v, p: got.__setitem__(p["i"], np.array(v)))
    with caplog.at_level("WARNING", logger="timerl.runtime.scan"):
        ex = ctx.compile({I: 3, T: 4}, backend=backend, scan_loops=True)
        ex.execute()
    assert not caplog.records and ex._interp.scanned_entries == 3
    want, wv = {}, np.ones(2, np.float32)
    for k in range(3):
        want[k] = wv.copy()
        xs = [wv * 1.0]
        for _ in range(3):
            xs.append(xs[-1] * 0.5 + 0.25)
        wv = wv - 0.1 * (sum(xs) + wv * (1 + 0.5 + 0.25 + 0.125))  # d/dw of sum_t x[t] * w
    for k in range(3):
        np.testing.assert_allclose(got[k], want[k], rtol=1e-6)


def test_scans_plan_and_free_every_iteration_at_once(monkeypatch) -> None:
    """The branch choices and the body's frees of a scanned loop, evaluated elementwise over
    all its iterations (NumPy), against the same run replaying them iteration by iteration:
    the same rollouts, the same points left in the store, the same peak bytes."""
    from timerl.runtime import scan

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
    import ppo

    def run() -> tuple[list, dict, int, int, list]:
        args = ppo.Args(
            env_id="gymnax.CartPole-v1", backend="jax", num_envs=4, num_steps=12, iterations=3, seed=2
        )
        log: list = []
        made: list = []
        real = scan.ScannedLoop.__init__

        def spy(self, *a, **k) -> None:
            real(self, *a, **k)
            made.append(self)

        monkeypatch.setattr(scan.ScannedLoop, "__init__", spy)
        ex = ppo.build_fixed(args, lambda v, p, log=log: log.append((p["i"], v.copy())), scan_loops=True)
        ex.execute()
        monkeypatch.setattr(scan.ScannedLoop, "__init__", real)
        interp = ex._interp
        left = {n.id: sorted(interp.points(n.id, k)) for n in ex.pdg for k in range(len(n.outputs))}
        return log, left, interp.memory_stats().peak_bytes, interp.scanned_entries, made

    log1, left1, peak1, n1, made = run()
    assert n1 >= 3
    assert any(s.frees for s in made) and all(s.range_frees is not None for s in made if s.frees)
    assert any(m.vconds is not None for s in made for m in s.members)
    monkeypatch.setattr(scan, "_range_frees", lambda stmts, ex: None)
    monkeypatch.setattr(scan.ScannedLoop, "_vector_start", lambda self, vals: None)
    log0, left0, peak0, n0, _ = run()
    assert n0 == n1 and left0 == left1 and peak0 == peak1
    assert [k for k, _ in log0] == [k for k, _ in log1] == [0, 1, 2]
    for (_, a), (_, b) in zip(log0, log1, strict=True):
        np.testing.assert_array_equal(a, b)


def test_ppo_on_gymnasium_scans_its_rollout_on_torch() -> None:
    """Torch's host loop calls a UDF without a pure form (gymnasium's NumPy CartPole) as the
    interpreter does: the same rollouts bit for bit, the same parameters to float rounding
    (the learner reads the rows stacked once by the loop, not per point)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
    import ppo

    runs = {}
    for scan in (False, True):
        args = ppo.Args(
            env_id="gym.CartPole-v1", backend="torch", num_envs=4, num_steps=12, iterations=3, seed=1
        )
        log: list = []
        ex = ppo.build_fixed(
            args, lambda v, p, log=log: log.append((p["i"], v.copy())), scan_loops=scan, dealloc=False
        )
        ex.execute()
        params = {n.name: ex._interp.value(n.id, (2,)) for n in ex.pdg if n.name in ("dnn.w0", "dnn.vw2")}
        runs[scan] = (log, params, ex._interp.scanned_entries)
    (log0, w0, n0), (log1, w1, n1) = runs[False], runs[True]
    assert n0 == 0 and n1 >= 3
    assert [k for k, _ in log0] == [k for k, _ in log1] == [0, 1, 2]
    for (_, a), (_, b) in zip(log0, log1, strict=True):
        np.testing.assert_array_equal(a, b)
    assert w0.keys() == w1.keys() == {"dnn.w0", "dnn.vw2"}
    for k in w0:
        np.testing.assert_allclose(w0[k], w1[k], rtol=1e-6, atol=1e-7)


def test_a_udf_raising_inside_a_host_loop_names_itself_and_runs_nothing_twice() -> None:
    """An exception of a UDF in a Torch host loop is the user's error (UDF, point), raised
    once: the loop is not rerun statement by statement (the UDF would be called twice)."""
    from timerl.errors import RuntimeExecutionError
    from timerl.pdg.ops import DType

    calls: list[int] = []

    def step(ins: list, pt: dict) -> list:
        calls.append(pt["t"])
        if pt["t"] == 3:
            raise ValueError("env broke")
        return [ins[0] * 0.5 + 1.0]

    ctx = trl.Context(dims=("i", "t"))
    with ctx as ((i, I), (t, T)):
        x = trl.empty((2,), domain=(i, t), name="x")
        x[i, 0] = trl.ones((2,))
        (y,) = trl.udf(step, [((2,), DType.float32)], (i, t), [x[i, t]], name="env")
        x[i, t + 1] = y * 1.0
        x[i, T - 1].sink(lambda v, p: None)
    ex = ctx.compile({I: 2, T: 6}, backend="torch")
    assert any(ex.plan.scanned(lp) for lp in walk(ex.plan.ast) if isinstance(lp, Loop))
    with pytest.raises(RuntimeExecutionError, match=r"UDF 'env' .*ValueError: env broke .*'t': 3"):
        ex.execute()
    assert calls == [0, 1, 2, 3]
