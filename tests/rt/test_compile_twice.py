"""Compiling leaves the context unchanged: the same program compiles again with another
backend, other options or other bounds and gives the same results."""

from __future__ import annotations

import numpy as np

import timerl as trl


def test_one_context_compiles_three_times() -> None:
    got: list = []
    ctx = trl.Context(dims=("i", "t"))
    with ctx as ((i, I), (t, T)):
        w = trl.param(np.array([1.0, -0.5], np.float32), domain=(i,), name="w")
        x = trl.empty((2,), domain=(i, t), name="x")
        x[i, 0] = w * 1.0
        x[i, t + 1] = (x * 0.5).tanh()
        (x * w).sum().backward()
        w[i + 1] = w - 0.1 * w.grad
        w.sink(lambda v, p: got.append((p["i"], np.array(v))))
    nodes = len(ctx.graph.nodes)
    runs = []
    for bounds, backend, opts in [
        ({I: 3, T: 4}, "jax", {}),
        ({I: 3, T: 4}, "torch", {"vectorize_time": False, "fuse": False}),
        ({I: 2, T: 4}, "jax", {"scan_loops": False}),
    ]:
        got.clear()
        ctx.compile(bounds, backend=backend, **opts).execute()
        runs.append(sorted(got, key=lambda r: r[0]))
        assert len(ctx.graph.nodes) == nodes  # lowering did not add to the user's graph
    assert [k for k, _ in runs[0]] == [k for k, _ in runs[1]] == [0, 1, 2]
    assert [k for k, _ in runs[2]] == [0, 1]
    for a, b in zip(runs[0], runs[1], strict=True):
        np.testing.assert_allclose(a[1], b[1], rtol=1e-6)
    for a, b in zip(runs[0][:2], runs[2], strict=True):
        np.testing.assert_allclose(a[1], b[1], rtol=1e-6)


def test_a_program_with_a_dynamic_bound_compiles_twice() -> None:
    """Lowering used to leave the bound's setter node in the user's graph: the second
    compile found two setters of ``T`` and refused the program."""
    got: list = []
    ctx = trl.Context(dims=("i", "t"))
    with ctx as ((i, I), (t, T)):
        x = trl.empty((), domain=(i, t), name="x")
        x[i, 0] = trl.as_tensor(i) * 1.0
        x[i, t + 1] = x * 0.5 + 1.0
        done = trl.as_tensor(t, domain=(i, t)) >= trl.as_tensor(i, domain=(i, t)) + 2
        x[i, 0:T].sum(0).sink(lambda v, p: got.append((p["i"], float(v))), name="s")
    nodes = len(ctx.graph.nodes)
    runs = []
    for backend in ("torch", "jax"):
        got.clear()
        ctx.compile({I: 3, T: done}, backend=backend).execute()
        assert len(ctx.graph.nodes) == nodes
        runs.append(sorted(got))
    # episode i runs t < i + 3: x = i, i / 2 + 1, ...
    want = [(0, 2.5), (1, 6.125), (2, 10.0)]
    for run in runs:
        assert [k for k, _ in run] == [0, 1, 2]
        np.testing.assert_allclose([v for _, v in run], [v for _, v in want], rtol=1e-6)
