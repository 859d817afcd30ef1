"""Point store accounting, the per-point RNG seed and the expression compiler."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from timerl.backends import AbstractBackend
from timerl.runtime.common import point_seed, point_seeds
from timerl.runtime.interpreter import compile_expr, compile_exprs
from timerl.runtime.store import PointStore, PoolStats
from timerl.symbolic import Slice, Sym, evaluate, smax, smin


def test_store_accounting(backend: AbstractBackend) -> None:
    st = PointStore(backend.nbytes)
    st.declare(0, 2)
    x = backend.from_numpy(np.zeros((4,), np.float32))  # 16 bytes
    y = backend.from_numpy(np.zeros((2,), np.float64))  # 16 bytes
    st.put(0, 0, (0,), x)
    st.put(0, 1, (0,), y)
    st.put(0, 0, (1,), x)
    assert (st.live_bytes, st.peak_bytes, st.live_points) == (48, 48, 3)
    st.put(0, 0, (1,), y)  # replacing keeps the count right
    assert (st.live_bytes, st.live_points) == (48, 3)
    assert st.free(0, (0,)) == 32
    assert (st.live_bytes, st.peak_bytes, st.live_points) == (16, 48, 1)
    assert st.free(0, (0,)) == 0  # freeing twice is harmless
    assert not st.has(0, 0, (0,)) and st.has(0, 0, (1,))
    with pytest.raises(KeyError):
        st.get(0, 0, (0,))
    assert st.stats().peak_bytes == 48


def test_point_seed_is_stable_and_distinct() -> None:
    assert point_seed(0, 3, (1, 2)) == point_seed(0, 3, (1, 2))
    seeds = {point_seed(s, n, p) for s, n, p in itertools.product((0, 1), (0, 7), ((), (0,), (1,), (0, 1)))}
    assert len(seeds) == 16
    assert all(0 <= s < 2**31 for s in seeds)


def test_point_seeds_vectorized_equal_point_seed_row_by_row() -> None:
    """The NumPy seeds (used for vectorized draws) are those of the per-point Python path,
    including negative coordinates and seeds above 64 bits; they are spread evenly."""
    rng = np.random.default_rng(0)
    points = rng.integers(-50, 10**6, size=(3000, 3))
    seeds = point_seeds(2**70 + 9, 11, points)
    assert seeds.tolist() == [point_seed(2**70 + 9, 11, tuple(p)) for p in points]
    assert point_seeds(5, 1, np.zeros((1, 0), np.int64))[0] == point_seed(5, 1, ())
    counts = np.bincount(seeds % 8, minlength=8)
    assert counts.min() > 0.8 * len(seeds) / 8


def test_compiled_expressions_match_evaluate() -> None:
    a, b, N = Sym("a"), Sym("b"), Sym("N", True)
    exprs = [
        a + 2 * b - 3,
        (a * 3) // 2,
        (a - b) % 4,
        smin(a + 2, N),
        smax(a - 5, b),
        (a < b) & (b <= N),
        (a == 3) | ~(b < 2),
        a == b - 1,
        (N - 1 - a) // 3,
    ]
    for va, vb, vn in itertools.product(range(-3, 4), range(-2, 3), (1, 5)):
        env = {a: va, b: vb, N: vn}
        for e in exprs:
            assert compile_expr(e)(env) == evaluate(e, env), e
    f = compile_exprs((a, Slice(a, smin(a + 2, N)), b + 1))
    assert f({a: 1, b: 2, N: 2}) == (1, range(1, 2), 3)
    assert compile_exprs(())({}) == ()


def test_store_accounting_per_pool_and_tensor(backend: AbstractBackend) -> None:
    """Per-pool and per-node live/peak bytes add up to the totals; peak_bytes keeps its meaning."""
    st = PointStore(backend.nbytes)
    st.declare(0, 1)
    st.declare(1, 1, pool="host")
    st.declare(2, 1)
    x = backend.from_numpy(np.zeros((4,), np.float32))  # 16 bytes
    big = backend.from_numpy(np.zeros((8,), np.float64))  # 64 bytes
    st.put(0, 0, (0,), x)
    st.put(1, 0, (0,), big)
    st.put(0, 0, (1,), x)
    st.free(1, (0,))
    st.put(2, 0, (), big)
    s = st.stats(top=2, labels={0: "a", 1: "b", 2: "c"})
    assert (s.live_bytes, s.peak_bytes, s.live_points) == (96, 96, 3)
    assert s.pool("device") == PoolStats(96, 96)
    assert s.pool("host") == PoolStats(0, 64)
    assert sum(p.live_bytes for _, p in s.pools) == s.live_bytes
    assert [(t.label, t.live_bytes, t.peak_bytes, t.live_points) for t in s.tensors] == [
        ("b", 0, 64, 0),
        ("c", 64, 64, 1),
    ]
    st.put(2, 0, (), x)  # replacing: the node's live bytes shrink, its peak stays
    s = st.stats(top=5)
    by = {t.node: t for t in s.tensors}
    assert (by[2].live_bytes, by[2].peak_bytes, by[2].live_points) == (16, 64, 1)
    assert by[0].label == "%0" and s.live_bytes == sum(t.live_bytes for t in s.tensors)
    assert s.max_rss_bytes > 0 and "pool host" in s.summary()
