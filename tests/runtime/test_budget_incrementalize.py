"""``memory_budget`` chooses incrementalization (``plan/peak.py::fit_by_incrementalizing``):
when the schedule with frees does not fit, the reductions are incrementalized with the
largest of a few thresholds whose estimate fits; when none fits, ``MemoryBudgetError``
still names the largest tensors."""

from __future__ import annotations

import numpy as np
import pytest

import timerl as trl
from timerl.errors import MemoryBudgetError

N = 4000  # rows: each (N, 16) float32 tensor is 256,000 bytes


def _program() -> tuple[trl.Context, dict, list]:
    """Four SGD steps of a tanh layer over N rows; the rows depend on the weights, so every
    iteration computes its own (N, 16) and (N, 8) tensors and the weight gradient sums over
    the rows. With ``fuse=False`` every one of them is stored: about 1.9 MB at once."""
    out: list = []
    rng = np.random.default_rng(0)
    ctx = trl.Context(dims=("i",))
    with ctx as ((i, I),):
        w = trl.param(rng.normal(0, 0.3, (16, 8)).astype(np.float32), domain=(i,), name="w")
        x = trl.const(rng.normal(0, 1, (N, 16)).astype(np.float32)) * (w.sum() * 0.01 + 1.0)
        y = (x @ w).tanh()
        (y * y).sum().backward()
        trl.optim.SGD([w], lr=0.01).step()
        w.sink(lambda v, p: out.append(np.array(v)))
    return ctx, {I: 4}, out


def test_budget_chooses_incrementalization_when_frees_do_not_fit() -> None:
    ctx, bounds, base = _program()
    plain = ctx.compile(bounds, backend="torch", fuse=False)
    assert plain.plan.peak.peak_bytes > 10**6
    plain.execute()
    ctx, bounds, out = _program()
    ex = ctx.compile(bounds, backend="torch", fuse=False, memory_budget="1MB")
    # budget // 4 = 250,000 B gives two blocks of the rows, not enough; 62,500 B fits
    assert ex.options.incrementalize == 62_500 and ex.options.dealloc
    assert any(d.name.startswith("di") for d, _ in ex.pdg.dims)
    assert ex.plan.peak.peak_bytes <= 10**6
    ex.execute()
    assert ex.memory_stats().peak_bytes <= 10**6
    assert len(out) == len(base) == 4
    for a, b in zip(out, base, strict=True):
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-5)  # summation order


def test_nothing_fits_names_the_largest_tensors() -> None:
    ctx, bounds, out = _program()
    with pytest.raises(MemoryBudgetError) as info:
        ctx.compile(bounds, backend="torch", fuse=False, memory_budget="200KB")
    msg = str(info.value)
    assert "memory_budget=195.31 KiB" in msg and "per point" in msg and "const defined" in msg
    assert "Incrementalizing the reductions" in msg and "did not fit either" in msg
    assert not out


def test_a_given_threshold_is_not_changed() -> None:
    """With ``incrementalize`` given, the budget only checks it (no other threshold is tried)."""
    ctx, bounds, _ = _program()
    with pytest.raises(MemoryBudgetError) as info:
        ctx.compile(bounds, backend="torch", fuse=False, memory_budget="1MB", incrementalize=10**6)
    assert "Incrementalizing" not in str(info.value)


D = 1024  # floats per step of the "image" below (4 KiB)


def _image_program() -> tuple[trl.Context, dict, list]:
    """An episode of 64 per-step 'images' (a recurrence: acting), a value of each summed over
    the episode (learning waits for its end), and a tanh layer trained on the images (its
    weight gradient contracts them over the steps). With frees alone every image is live when
    learning starts (256 KiB)."""
    out: list = []
    rng = np.random.default_rng(4)
    ctx = trl.Context(dims=("i", "t"))
    with ctx as ((i, I), (t, T)):
        w = trl.param(rng.normal(0, 0.1, (D, 2)).astype(np.float32), domain=(i,), name="w")
        o = trl.empty((D,), domain=(i, t), name="img")
        o[i, 0] = trl.const(rng.normal(0, 1, D).astype(np.float32)) + trl.as_tensor(i)
        o[i, t + 1] = (o * 0.5).tanh()
        v = (o @ trl.const(rng.normal(0, 0.1, (D, 2)).astype(np.float32))).tanh()
        s = v[i, 0:T].sum()
        y = (o @ w).tanh()
        (y * s.detach()).sum().backward()
        trl.optim.SGD([w], lr=0.01).step()
        w.sink(lambda x, p: out.append((p["i"], np.array(x))))
    return ctx, {I: 2, T: 64}, out


@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_budget_chooses_incrementalization_and_swapping_together(backend: str) -> None:
    """64 KiB: frees alone hold ~300 KB; incrementalized alone the images still wait on the
    device for their block, swapped alone learning fetches them all at once; together each
    block of images comes back from the host for its block of the gradient: the device pool
    stays under the budget, the host holds the episode, the weights are the same."""
    ctx, bounds, base = _image_program()
    ex = ctx.compile(bounds, backend=backend, scan_loops=False)
    ex.execute()
    assert ex.memory_stats().pool("device").peak_bytes > 4 * 64 * 1024
    ctx, bounds, out = _image_program()
    ex = ctx.compile(bounds, backend=backend, scan_loops=False, memory_budget="64KiB")
    assert ex.options.incrementalize is not None and ex.options.swap
    ex.execute()
    st = ex.memory_stats()
    assert st.pool("device").peak_bytes <= 64 * 1024 < st.pool("host").peak_bytes
    assert [p for p, _ in out] == [p for p, _ in base] == [0, 1]
    for (_, a), (_, b) in zip(out, base, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
