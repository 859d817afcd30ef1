"""Loops over a dynamic bound (``for t < T``, ``T`` found by a done-signal inside the loop)
run in chunks (``runtime/scan.py``: a ``lax.while_loop`` on JAX, a host loop on Torch, that
stops after the step whose done-signal holds): the same values as the loop run statement by
statement and as the reference evaluator, random draws included, for episodes shorter than
one chunk, ending in the first step, and spanning several chunks."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import timerl as trl
from timerl.backends import get_backend
from timerl.compile import CompileOptions, build_pdg
from timerl.runtime.reference import reference_evaluate

W = np.array([[0.5, -0.3], [0.2, 0.8]], np.float32)
ENDS = (5, 1, 40, 17)  # episode i ends after ENDS[i] steps: within a chunk, at once, over chunks


def _program(seen: dict[str, Any]) -> tuple[trl.Context, dict]:
    """x[i, 0] = w[i]; x[i, t + 1] = tanh(x[i, t] @ W) + 0.1 * noise[i, t]; the episode of i
    ends at step ENDS[i] - 1; w learns from the sum of x over the episode."""
    ctx = trl.Context(dims=("i", "t"))
    with ctx as ((i, I), (t, T)):
        w = trl.param(np.array([0.3, -0.2], np.float32), domain=(i,), name="w")
        x = trl.empty((2,), domain=(i, t), name="x")
        x[i, 0] = w * 1.0
        noise = trl.rand((2,), domain=(i, t), name="noise")
        x[i, t + 1] = (x @ trl.const(W)).tanh() + noise * 0.1
        steps = trl.empty((), domain=(i, t), name="steps")  # steps[i, t] = t + 1
        steps[i, 0] = trl.const(np.float32(1.0))
        steps[i, t + 1] = steps + 1.0
        d = steps >= trl.const(np.asarray(ENDS, np.float32))[i]
        total = x[i, 0:T].sum()
        total.sink(lambda v, p: seen.__setitem__(p["i"], float(v)))
        (total * total).backward()
        w[i + 1] = w - 0.01 * w.grad
    return ctx, {I: len(ENDS), T: d}


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_a_loop_over_a_dynamic_bound_runs_in_chunks_with_the_same_values(caplog, backend: str) -> None:
    caplog.set_level(logging.DEBUG, logger="timerl.runtime.scan")
    runs = {}
    for scan in (False, True):
        seen: dict[int, float] = {}
        ctx, bounds = _program(seen)
        ex = ctx.compile(bounds, backend=backend, scan_loops=scan)
        ex.execute()
        runs[scan] = (seen, ex._interp.scanned_entries)
    (off, n_off), (on, n_on) = runs[False], runs[True]
    assert n_off == 0
    # chunks: 16 at first, then the bucket (16, 64, 256, 1024) that holds the previous episode,
    # the next one inside an episode: 5 -> [16], 1 -> [16] (stops after one step), 40 -> [16,
    # 64], 17 -> [64]
    chunks = [
        int(r.getMessage().split(": ")[1].split()[0])
        for r in caplog.records
        if "as one scan" in r.getMessage()
    ]
    assert n_on == 5 and chunks == [16, 64], caplog.text  # compiled once per length
    assert sorted(on) == list(range(len(ENDS)))
    for k in on:
        np.testing.assert_allclose(on[k], off[k], rtol=1e-5)
    ref: dict[int, float] = {}
    ctx, bounds = _program(ref)
    reference_evaluate(build_pdg(ctx, bounds, CompileOptions()), get_backend(backend))
    for k in on:
        np.testing.assert_allclose(ref[k], on[k], rtol=1e-5)


def test_the_plan_says_a_dynamic_loop_is_scanned() -> None:
    ctx, bounds = _program({})
    ex = ctx.compile(bounds, backend="jax")
    text = ex.plan.pretty()
    assert "for (" in text and "T;" in text
    loops = [ln for ln in text.splitlines() if "< T;" in ln]
    assert loops and "# scanned (in chunks until its dynamic bound is found)" in loops[0], loops
    ctx, bounds = _program({})
    ex = ctx.compile(bounds, backend="jax", memory_budget="1GB", max_bounds={"T": 64})
    loops = [ln for ln in ex.plan.pretty().splitlines() if "< T;" in ln]
    assert loops and "a memory_budget is set" in loops[0], loops


@pytest.mark.parametrize("backend", ["jax", "torch"])
@pytest.mark.parametrize("n", [0, 3])
def test_reinforce_on_gymnax_over_dynamic_episodes_equals_the_unscanned_run(backend: str, n: int) -> None:
    """REINFORCE on gymnax's CartPole (the episode ends when every env is done), Monte-Carlo
    and n-step (learning interleaved with acting): the Monte-Carlo acting loop runs in chunks,
    and the episode returns equal the unscanned run's."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
    import reinforce

    runs = {}
    for scan in (False, True):
        args = reinforce.Args(
            env_id="gymnax.CartPole-v1", backend=backend, n=n, num_envs=4, iterations=3, seed=2
        )
        got: list[tuple[int, int, float]] = []
        ex = reinforce.build(
            args, lambda v, p, got=got: got.append((p["i"], p["b"], float(v))), scan_loops=scan
        )
        ex.execute()
        runs[scan] = (got, ex._interp.scanned_entries)
    (a, n0), (b, n1) = runs[False], runs[True]
    assert n0 == 0 and (n1 >= 3 or n > 0)  # n-step: acting runs beside learning, under an If
    assert len(a) == 3 * 4 and a == b  # episode returns: integers, equal iff the same actions


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_an_episode_past_max_bounds_stops_at_the_same_step_in_chunks(backend: str) -> None:
    """Under ``max_bounds={T: 12}`` an episode of 40 steps stops with ``BoundError`` at the
    step that passes the bound, as the unscanned loop does: no chunk runs past it."""
    msgs = []
    for scan in (False, True):
        ctx, bounds = _program({})
        ex = ctx.compile(bounds, backend=backend, scan_loops=scan, max_bounds={"T": 12})
        with pytest.raises(trl.BoundError) as info:
            ex.execute()
        msgs.append(str(info.value))
    assert msgs[0] == msgs[1]
    assert "t = 11" in msgs[1] and "{i: 2}" in msgs[1], msgs[1]
