"""Fused pure-op regions give the values of op-by-op interpretation (up to float rounding:
XLA may contract ``a * b + c`` into one fused multiply-add inside a compiled region)."""

from __future__ import annotations

import numpy as np

import timerl as trl
from timerl.plan.fusable import fusable


def _program(out: list):
    ctx = trl.Context(dims=("i", "t"))
    with ctx as ((i, I), (t, T)):
        w = trl.param(np.array([0.5, -0.25], np.float32), domain=(i,), name="w")
        x = trl.empty((2,), domain=(i, t), name="x")
        x[i, 0] = w * 2.0
        x[i, t + 1] = (x * 0.5 + w).tanh() * 1.5 - x.exp() * 0.1  # a chain of pure ops
        g = x[i, t:T].sum(0)
        loss = (g * g).sum()
        loss.backward()
        trl.optim.SGD([w], lr=0.001).step()
        g.sink(lambda v, p: out.append((p["i"], p["t"], np.array(v))))
    return ctx, (I, T)


def test_fused_equals_unfused_on_jax() -> None:
    runs = []
    for fuse in (False, True):
        out: list = []
        ctx, (I, T) = _program(out)
        ex = ctx.compile({I: 3, T: 4}, backend="jax", fuse=fuse)
        ex.execute()
        runs.append(sorted(out, key=lambda r: (r[0], r[1])))
    assert len(runs[0]) == 12
    for a, b in zip(*runs, strict=True):
        assert a[:2] == b[:2]
        np.testing.assert_allclose(a[2], b[2], rtol=1e-5, atol=1e-5)


def test_fused_regions_exist_and_skip_effectful_ops() -> None:
    out: list = []
    ctx, (I, T) = _program(out)
    ex = ctx.compile({I: 2, T: 3}, backend="jax")
    ex.execute()
    interp = ex._interp
    assert interp._fused, "no fused region was formed"
    for key in interp._fused:
        # (members, donated inputs): a fusable node alone becomes a region when it donates
        members, donate = key if isinstance(key[0], tuple) else (key, ())
        assert len(members) >= 2 or donate
        assert all(fusable(ex.pdg.nodes[m]) for m in members)


def test_only_outputs_read_outside_a_region_are_stored() -> None:
    """A member read only by later members at the same point stays inside the compiled region
    (not stored); a member read elsewhere is stored at every point it ran."""
    out: list = []
    ctx, (I, T) = _program(out)
    ex = ctx.compile({I: 2, T: 3}, backend="jax", dealloc=False)  # the store is read after the run
    ex.execute()
    interp, pdg = ex._interp, ex.pdg
    internal, external = [], []
    for key in interp._fused:
        members = key[0] if isinstance(key[0], tuple) else key
        inside = set(members)
        for m in members:
            outs = pdg.out_edges(m)
            (external if not outs or any(e.sink not in inside for e in outs) else internal).append(m)
    assert internal and external
    assert all(not interp.points(m) for m in internal)
    assert all(interp.points(m) for m in external if pdg.nodes[m].domain)
