"""Optimisers over several update dims: params over ``(i, e)`` step along ``e`` and carry into ``i + 1``.

Checked against the same updates written as a plain NumPy loop (one gradient step per
``(i, e)`` in lexicographic order), on both backends.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import timerl as trl

BACKENDS = ["jax", "torch"]
I_, T_, E_, M_ = 3, 4, 2, 2


def _data(ii: int) -> np.ndarray:
    return (np.arange(T_, dtype=np.float32) * 0.1 + 1.0 + 0.5 * ii).astype(np.float32)


def _program(opt: str, dims: tuple[str, ...], backend: str) -> dict[tuple[int, ...], float]:
    """w fits y = 2x by least squares; the data of iteration i is x[i, 0:T]."""
    seen: dict[tuple[int, ...], float] = {}
    ctx = trl.Context(dims=("i", "t") + dims)
    with ctx as ((i, I), (t, T), *rest):
        upd = tuple(s for s, _ in rest)
        w = trl.param(np.array([0.5], np.float32), (i, *upd), name="w")
        x = trl.empty((1,), domain=(i, t), name="x")
        x[i, t] = (trl.as_tensor(t) * 0.1 + trl.as_tensor(i) * 0.5 + 1.0).reshape((1,))
        pred = x * w
        loss = ((pred - x * 2.0) * (pred - x * 2.0)).sum()
        loss.backward()
        if opt == "adam":
            trl.optim.Adam([w], lr=0.1).step()
        else:
            trl.optim.SGD([w], lr=0.02, momentum=0.5).step()
        names = ("i",) + tuple(s.name for s in upd)

        def sink(v: Any, p: dict[str, int]) -> None:
            key = tuple(p[n] for n in names)
            assert key not in seen
            seen[key] = float(np.asarray(v)[0])

        w.sink(sink)
    bounds: dict[Any, int] = {I: I_, T: T_}
    for (_, bound), n in zip(rest, (E_, M_), strict=False):
        bounds[bound] = n
    ctx.compile(bounds=bounds, backend=backend).execute()
    return seen


def _reference(opt: str, inner: int) -> list[float]:
    w, m, v, buf, out, k = 0.5, 0.0, 0.0, 0.0, [], 0
    for ii in range(I_):
        xs = _data(ii)
        for _ in range(inner):
            out.append(w)
            k += 1
            g = float(np.sum(2 * (xs * w - 2 * xs) * xs))
            if opt == "adam":
                m = 0.9 * m + 0.1 * g
                v = 0.999 * v + 0.001 * g * g
                w = w - 0.1 * (m / (1 - 0.9**k)) / (np.sqrt(v / (1 - 0.999**k)) + 1e-8)
            else:
                buf = buf * 0.5 + g
                w = w - 0.02 * buf
    return out


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("opt", ["adam", "sgd"])
@pytest.mark.parametrize("dims", [("e",), ("e", "m")])
def test_updates_over_inner_dims_match_flat_loop(backend: str, opt: str, dims: tuple[str, ...]) -> None:
    got = _program(opt, dims, backend)
    inner = E_ if len(dims) == 1 else E_ * M_
    assert len(got) == I_ * inner  # every (i, e[, m]) point defined once, none beyond
    flat = [got[k] for k in sorted(got)]
    np.testing.assert_allclose(flat, _reference(opt, inner), rtol=1e-5, atol=1e-6)
