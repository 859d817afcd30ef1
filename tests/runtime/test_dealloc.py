"""Deallocation statements placed by isl (``CompileOptions(dealloc=True)``), run end to end.

An n-step program over a dynamic episode length (observations of 256 floats, rewards read
through the window ``r[t:min(t + n, T)]``): with frees its peak store bytes do not grow
with the episode length, and its sunk values equal those without frees and those of the
reference evaluator, bit for bit.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import timerl as trl
from timerl.backends import get_backend
from timerl.compile import CompileOptions, build_pdg
from timerl.runtime.reference import reference_evaluate
from timerl.schedule.ast import Dealloc, Offload, walk

D = 256  # floats per observation


def nstep_program(length: int, n: int, sink: Any) -> tuple[trl.Context, dict]:
    """Episodes of ``length`` steps; ``g[t]`` sums ``r[t:min(t + n, T)]``; sinks ``o[t].sum() * g[t]``."""
    ctx = trl.Context(dims=("i", "t"))
    with ctx as ((i, I), (t, T)):
        o = trl.empty((D,), domain=(i, t), name="obs")
        o[i, 0] = trl.zeros((D,))

        def step(ins: list[np.ndarray], pt: dict[str, int]) -> list[np.ndarray]:
            x = ins[0]
            nxt = x * np.float32(0.5) + np.float32(pt["t"] + pt["i"])
            return [nxt, np.float32(x.mean() + 1.0), np.array(pt["t"] + 1 == length)]

        specs = [((D,), trl.float32), ((), trl.float32), ((), trl.bool_)]
        nxt, r, d = trl.udf(step, specs, domain=(i, t), inputs=[o], name="step")
        o[i, t + 1] = nxt
        g = r[i, t : trl.min(t + n, T)].discounted_sum(0.9)
        (o.sum(0) * g).sink(sink)
    return ctx, {I: 2, T: d}


def _run(length: int, backend: str, **options: Any) -> tuple[dict, Any]:
    got: dict[tuple[int, int], float] = {}
    ctx, bounds = nstep_program(length, 8, lambda v, p: got.__setitem__((p["i"], p["t"]), float(v)))
    ex = ctx.compile(bounds, backend=backend, **options)
    ex.execute()
    return got, ex


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_nstep_peak_does_not_grow_with_the_episode(backend: str) -> None:
    """n = 8: O(n) observations live; peak equal at T = 100 and T = 1000 (not without frees)."""
    runs = {(L, flag): _run(L, backend, dealloc=flag) for L in (100, 1000) for flag in (False, True)}
    for L in (100, 1000):
        assert runs[(L, True)][0] == runs[(L, False)][0]  # bit for bit
        assert len(runs[(L, True)][0]) == 2 * L
    peak = {k: ex.memory_stats().peak_bytes for k, (_, ex) in runs.items()}
    assert peak[(100, True)] == peak[(1000, True)]
    assert peak[(1000, False)] > 5 * peak[(100, False)]
    assert peak[(100, True)] < 20 * 8 * D * 4  # a few windows of observations
    ex = runs[(100, True)][1]
    assert any(isinstance(x, Dealloc) for x in walk(ex.schedule.ast))


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_dealloc_equals_reference_evaluator(backend: str) -> None:
    """Frees on and off: the same values bit for bit; both equal to the reference evaluator's
    up to the compiled regions' float rounding."""
    got, _ = _run(13, backend, dealloc=True, free_iterations=False)
    assert got == _run(13, backend, dealloc=False, free_iterations=False)[0]
    want: dict[tuple[int, int], float] = {}
    ctx, bounds = nstep_program(13, 8, lambda v, p: want.__setitem__((p["i"], p["t"]), float(v)))
    reference_evaluate(build_pdg(ctx, bounds, CompileOptions()), get_backend(backend))
    assert sorted(got) == sorted(want) and len(got) == 26
    np.testing.assert_allclose([got[k] for k in sorted(got)], [want[k] for k in sorted(got)], rtol=1e-6)


def test_dealloc_frees_every_read_point_and_keeps_unread_ones() -> None:
    """After the run only the prologue's constants are left: every point over (i, t) is read
    (a free drops all outputs of its node: o_next[i, T - 1], never read, with r and done)."""
    _, ex = _run(20, "torch", dealloc=True, free_iterations=False)
    left = [n for n in ex.pdg if ex._interp.points(n.id)]
    assert left and all(not n.domain for n in left)
    keep = _run(20, "torch", dealloc=False, free_iterations=False)[1]
    assert ex.memory_stats().live_points == len(left) and keep.memory_stats().live_points > 100


# -- a per-episode dynamic T: frees wait until T decides their readers --------------------------
def _half_program(sink: Any) -> tuple[trl.Context, dict]:
    """``y[i, t] = 2 x[i, t // 2]``, ``x[i, t] = t + i`` (also sunk), ``T = i + 3``: whether
    ``x[i, p]`` has a reader at ``2 p`` is known only once the episode reached ``2 p``."""
    ctx = trl.Context(dims=("i", "t"))
    with ctx as ((i, I), (t, T)):
        x = trl.as_tensor(t) * 1.0 + trl.as_tensor(i)
        x.sink(lambda v, p: sink.__setitem__(("x", p["i"], p["t"]), float(v)))
        (x[i, t // 2] * 2.0).sink(lambda v, p: sink.__setitem__(("y", p["i"], p["t"]), float(v)))
        done = trl.as_tensor(t) >= trl.as_tensor(i) + 2.0
    return ctx, {I: 3, T: done}


def _backward_program(sink: Any) -> tuple[trl.Context, dict]:
    """``x[i, T - 1] = 0``, ``x[i, t] = 0.9 x[i, t + 1] + a[i]`` with ``a[i] = i / 2 + 1`` (also
    sunk), ``T = 2 i + 1``: ``a[i]`` is read along ``t`` only if ``T >= 2``."""
    ctx = trl.Context(dims=("i", "t"))
    with ctx as ((i, I), (t, T)):
        a = trl.as_tensor(i) * 0.5 + 1.0
        a.sink(lambda v, p: sink.__setitem__(("a", p["i"]), float(v)))
        x = trl.empty((), domain=(i, t), name="x")
        x[i, T - 1] = trl.zeros(())
        x[i, t] = x[i, t + 1] * 0.9 + a
        x.sink(lambda v, p: sink.__setitem__(("x", p["i"], p["t"]), float(v)))
        done = trl.as_tensor(t) >= trl.as_tensor(i) * 2.0
    return ctx, {I: 3, T: done}


def _expected(program: Any) -> dict:
    if program is _half_program:
        out = {("x", i, t): float(t + i) for i in range(3) for t in range(i + 3)}
        out.update({("y", i, t): 2.0 * (t // 2 + i) for i in range(3) for t in range(i + 3)})
        return out
    out = {}
    for i in range(3):
        a, x = i / 2 + 1, 0.0
        out[("a", i)] = a
        for t in reversed(range(2 * i + 1)):
            x = 0.0 if t == 2 * i else 0.9 * x + a
            out[("x", i, t)] = x
    return out


@pytest.mark.parametrize("program", [_half_program, _backward_program])
@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_frees_wait_for_the_per_episode_bound_that_decides_their_readers(program: Any, backend: str) -> None:
    """Issue 15 fuzz seeds 6057 and 6054: a free whose readers depend on ``T`` further than the
    current step (``x[t // 2]``; ``a[i]`` read along ``t < T - 1``) was guarded by
    ``T <= 2 * c1`` / ``T == 1`` before ``T`` was known (``BoundError``). Now it waits for the
    setter point that decides it, and every read point is still freed."""
    got: dict = {}
    ctx, bounds = program(got)
    ex = ctx.compile(bounds, backend=backend, dealloc=True, free_iterations=False)
    ex.execute()
    want = _expected(program)
    assert sorted(got) == sorted(want)
    np.testing.assert_allclose([got[k] for k in sorted(want)], [want[k] for k in sorted(want)], rtol=1e-6)
    assert any(isinstance(x, Dealloc) for x in walk(ex.schedule.ast))
    assert all(not n.domain for n in ex.pdg if ex._interp.points(n.id))  # only the prologue's constants


# -- a node whose outputs are read at different times is freed per output ------------------------
def _fixed_program(length: int, sink: Any) -> tuple[trl.Context, dict]:
    """A step with a large observation (read by the next step only) and a reward (read after
    the episode, ``r[i, 0:T]``), over a static ``T``."""
    ctx = trl.Context(dims=("i", "t"))
    with ctx as ((i, I), (t, T)):
        o = trl.empty((D,), domain=(i, t), name="obs")
        o[i, 0] = trl.zeros((D,))

        def step(ins: list[np.ndarray], pt: dict[str, int]) -> list[np.ndarray]:
            x = ins[0]
            return [x * np.float32(0.5) + np.float32(pt["t"] + pt["i"]), np.float32(x.mean() + 1.0)]

        nxt, r = trl.udf(
            step, [((D,), trl.float32), ((), trl.float32)], domain=(i, t), inputs=[o], name="step"
        )
        o[i, t + 1] = nxt
        r[i, 0:T].sum(0).sink(sink)
    return ctx, {I: 2, T: length}


@pytest.mark.parametrize("swap", [False, True])
@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_outputs_read_at_different_times_are_freed_apart(backend: str, swap: bool) -> None:
    """The observation output is freed after the next step reads it, not with the rewards
    after the episode: peak store bytes do not grow with ``T`` by an observation per step.
    Same values as without frees and as the reference evaluator; every read point is freed.
    With swapping, the step is not swapped (it would move the observation whole, with the
    rewards, to the host and keep it there)."""
    runs = {}
    for length in (8, 64):
        for flag in (False, True):
            got: dict[int, float] = {}
            ctx, bounds = _fixed_program(length, lambda v, p, g=got: g.__setitem__(p["i"], float(v)))
            opts = {"swap": True, "swap_threshold": 256} if swap and flag else {}
            ex = ctx.compile(bounds, backend=backend, dealloc=flag, free_iterations=False, **opts)
            ex.execute()
            runs[(length, flag)] = (got, ex)
    for length in (8, 64):
        assert runs[(length, True)][0] == runs[(length, False)][0]
    obs = D * 4
    peak = {k: ex.memory_stats().peak_bytes for k, (_, ex) in runs.items()}
    assert peak[(64, False)] - peak[(8, False)] > 56 * obs  # without frees every observation stays
    assert peak[(64, True)] - peak[(8, True)] < 4 * obs  # with them: the rewards' few bytes only
    ex = runs[(64, True)][1]
    step = next(n.id for n in ex.pdg if n.name == "step")
    parts = {f.outputs for f in walk(ex.schedule.ast) if isinstance(f, Dealloc) and f.node == step}
    assert (0,) in parts and (1,) in parts
    assert not any(isinstance(x, Offload) and x.node == step for x in walk(ex.schedule.ast))
    left = [n for n in ex.pdg if ex._interp.points(n.id)]
    assert all(not n.domain for n in left)  # o_next[I - 1, T - 1] too (its own free, unread there)
    want: dict[int, float] = {}
    ctx, bounds = _fixed_program(64, lambda v, p: want.__setitem__(p["i"], float(v)))
    reference_evaluate(build_pdg(ctx, bounds, CompileOptions()), get_backend(backend))
    np.testing.assert_allclose([runs[(64, True)][0][k] for k in (0, 1)], [want[0], want[1]], rtol=1e-6)
