"""Clustering tracks absolute positions along the dims a cluster lacks.

Parameters over ``(i, m)`` (``m``: minibatch updates, ``w[i, m + 1] = new[i, m]``, the last
carried to ``w[i + 1, 0]``) read at ``w[i, 0]`` by an acting chain over ``(i,)``: the path
acting -> learning -> update -> ``w[i, m + 1]`` never reaches ``w[i, 0]`` at the same ``i``,
so the acting chain may be one statement.
"""

from __future__ import annotations

import numpy as np
import pytest

import timerl as trl
from timerl.compile import CompileOptions, build_pdg
from timerl.pdg.ops import OpKind
from timerl.schedule.cluster import cluster_pdg, split_prologue


def _program(out: list):
    ctx = trl.Context(dims=("i", "m"))
    with ctx as ((i, I), (m, M)):
        w = trl.param(trl.const(np.ones(3, np.float32)), domain=(i, m), name="w")
        x = (w[i, 0] * 2.0).tanh()  # acting: over (i,), parameters at (i, 0)
        y = (x * 3.0 + 1.0).detach()  # acting is not differentiated
        d = w - y  # learning over (i, m)
        (d * d).sum().backward()
        trl.optim.SGD([w], lr=0.1).step()
        y.sum().sink(lambda v, p: out.append((p["i"], float(v))), name="y")
    return ctx, {I: 3, M: 2}


def test_acting_chain_over_i_is_one_statement() -> None:
    ctx, bounds = _program([])
    pdg = build_pdg(ctx, bounds, CompileOptions())
    _, members = cluster_pdg(split_prologue(pdg)[0])
    cluster_of = {n: r for r, ms in members.items() for n in ms}
    acting = [n.id for n in pdg if [str(d) for d in n.domain] == ["i"] and n.op.kind is not OpKind.SINK]
    assert len(acting) >= 3
    assert len({cluster_of[n] for n in acting}) == 1


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_values_match_a_numpy_loop(backend: str) -> None:
    out: list[tuple[int, float]] = []
    ctx, bounds = _program(out)
    ctx.compile(bounds, backend=backend).execute()
    w = np.ones(3)
    want = []
    for it in range(3):
        y = np.tanh(w * 2.0) * 3.0 + 1.0
        want.append((it, float(y.sum())))
        for _ in range(2):
            w = w - 0.1 * 2.0 * (w - y)  # d(sum (w - y)^2)/dw
    got = sorted(out)
    assert [k for k, _ in got] == [0, 1, 2]
    np.testing.assert_allclose([v for _, v in got], [v for _, v in want], rtol=1e-5)
