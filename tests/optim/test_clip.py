"""``max_grad_norm``: gradients scaled together to a global norm (as ``clip_grad_norm_``)."""

from __future__ import annotations

import numpy as np
import pytest

import timerl as trl


@pytest.mark.parametrize("backend", ["jax", "torch"])
@pytest.mark.parametrize("max_norm", [0.5, 100.0])
def test_sgd_with_clipped_global_norm_matches_numpy(backend: str, max_norm: float) -> None:
    c1 = np.array([3.0, -4.0], np.float32)
    c2 = np.array([[1.0, 2.0]], np.float32)
    out: list = []
    ctx = trl.Context(dims=("i",))
    with ctx as ((i, I),):
        w1 = trl.param(np.zeros(2, np.float32), domain=(i,), name="w1")
        w2 = trl.param(np.zeros((1, 2), np.float32), domain=(i,), name="w2")
        ((w1 * trl.const(c1)).sum() + (w2 * trl.const(c2)).sum() + (w1 * w1).sum()).backward()
        trl.optim.SGD([w1, w2], lr=0.1, max_grad_norm=max_norm).step()
        trl.stack([w1, w2[i, 0]]).sink(lambda v, p: out.append((p["i"], v.copy())))
    ctx.compile({I: 3}, backend=backend).execute()
    a, b = np.zeros(2), np.zeros((1, 2))
    want = []
    for k in range(3):
        want.append((k, np.stack([a, b[0]])))
        g1, g2 = c1 + 2 * a, c2
        norm = np.sqrt((g1**2).sum() + (g2**2).sum())
        s = min(1.0, max_norm / (norm + 1e-6))
        a, b = a - 0.1 * s * g1, b - 0.1 * s * g2
    for (k, v), (kw, vw) in zip(sorted(out, key=lambda x: x[0]), want, strict=True):
        assert k == kw
        np.testing.assert_allclose(v, vw, rtol=1e-5, atol=1e-6)
