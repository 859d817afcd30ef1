"""Freeing finished iterations (``free_iterations``): same values, bounded memory."""

from __future__ import annotations

import numpy as np
import pytest

import timerl as trl
from timerl.plan.iterations import read_lags


def _train_w(i, t, T):
    """A parameter ``w`` over ``i`` trained by Adam on a loss over a recurrence over ``t``."""
    w = trl.param(np.array([0.5, -0.25], np.float32), domain=(i,), name="w")
    x = trl.empty((2,), domain=(i, t), name="x")
    x[i, 0] = w * 2.0
    x[i, t + 1] = (x * 0.5 + w).tanh()
    loss = (x[i, t:T].sum(0) ** 2).sum()
    loss.backward()
    trl.optim.Adam([w], lr=0.01).step()
    return w, loss


def _program(out: list):
    ctx = trl.Context(dims=("i", "t"))
    with ctx as ((i, I), (t, T)):
        _, loss = _train_w(i, t, T)
        # a look-back over every earlier iteration: its values must be kept
        hist = trl.empty((), domain=(i,), name="hist")
        hist[i] = loss[i, 0]
        hist[0 : i + 1].sum(0).sink(lambda v, p: out.append((p["i"], float(v))))
    return ctx, (I, T)


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_same_values_less_memory(backend: str) -> None:
    results, peaks = [], []
    for free in (False, True):
        out: list = []
        ctx, (I, T) = _program(out)
        ex = ctx.compile({I: 6, T: 4}, backend=backend, free_iterations=free)
        ex.execute()
        results.append(sorted(out))
        peaks.append(ex.memory_stats().peak_bytes)
    assert len(results[0]) == 6
    assert results[0] == results[1]
    assert peaks[1] < peaks[0]


def test_lags() -> None:
    out: list = []
    ctx, (I, T) = _program(out)
    from timerl.compile import CompileOptions, build_pdg

    pdg = build_pdg(ctx, {I: 3, T: 2}, CompileOptions())
    i = next(d for d, _ in pdg.dims if d.name == "i")
    lags = read_lags(pdg, i)
    named = {pdg.nodes[k].name: v for k, v in lags.items() if pdg.nodes[k].name}
    assert named["w"] == 0  # read at its own iteration (the update reads it there)
    assert max(lags.values()) == 1  # the optimiser's update is read by w[i + 1]
    assert "hist" not in named  # read by hist[0:i + 1]: kept for the whole run


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_statement_of_the_last_iteration_only_still_frees(backend: str) -> None:
    # `w[(i + 1) % I == 0]` runs at i = I - 1 only: isl emits it as `if (c0 == 5)` at the
    # constant point (5,) inside the iteration loop (as a final checkpoint is); the loop
    # is still iteration-major and earlier iterations are freed.
    results, peaks = [], []
    for free in (False, True):
        out: list = []
        ctx = trl.Context(dims=("i", "t"))
        with ctx as ((i, I), (t, T)):
            w, _ = _train_w(i, t, T)
            w[(i + 1) % 6 == 0].sink(lambda v, p, out=out: out.append((p["i"], v.tolist())), name="last_w")
        # free_iterations alone (frees placed by isl would free the earlier iterations too)
        ex = ctx.compile({I: 6, T: 4}, backend=backend, free_iterations=free, dealloc=False)
        ex.execute()
        results.append(out)
        peaks.append(ex.memory_stats().peak_bytes)
    assert [p for p, _ in results[0]] == [5]
    assert results[0] == results[1]
    assert peaks[1] < peaks[0] / 2
