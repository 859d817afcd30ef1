"""Seeded random RT programs over (b?, i, t) with a static T, for pass differential tests.

Each program has a recurrence over ``t`` (which must stay per point), pure functions of
it and of random inputs read at ``t``, at a constant point, shifted with a guard, through
windows and totals, a parameter ``w`` over ``i`` trained by SGD on a loss summed over
``t`` (so the weight gradient is a summed outer product), and sinks that record values.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

import timerl as trl

F = 3  # per-point feature size


def build(seed: int, batch: bool) -> tuple[trl.Context, dict[Any, int], list]:
    """The program for ``seed``; returns (context, bounds, the list the sinks fill)."""
    rng = np.random.default_rng(seed)
    out: list = []

    def sink(tag: int) -> Callable[[np.ndarray, dict[str, int]], None]:
        return lambda v, pt: out.append((tag, tuple(sorted(pt.items())), np.array(v, dtype=np.float64)))

    ctx = trl.Context(dims=("b", "i", "t") if batch else ("i", "t"))
    with ctx as dims:
        if batch:
            (b, B), (i, I), (t, T) = dims
            full: tuple = (b, i, t)
        else:
            (i, I), (t, T) = dims
            full = (i, t)
        w = trl.param(rng.normal(0, 0.5, (F, F)).astype(np.float32), domain=(i,), name="w")
        u = trl.rand((F,), domain=full)
        x = trl.empty((F,), domain=full, name="x")
        x[(*full[:-1], 0)] = u[(*full[:-1], 0)] * 0.5
        x[(*full[:-1], t + 1)] = (x * float(rng.uniform(0.3, 0.9)) + u[(*full[:-1], t + 1)]).tanh()
        pool = [u, x, (u @ w).tanh()]
        for k in range(int(rng.integers(3, 7))):
            a = pool[int(rng.integers(len(pool)))]
            c = pool[int(rng.integers(len(pool)))]
            kind = int(rng.integers(9))
            if kind == 0:
                y = a * c + 0.1
            elif kind == 1:
                y = (a - c * 0.5).tanh()
            elif kind == 2:  # a value read at the last step, broadcast over t
                y = a + c[(*full[:-1], T - 1)]
            elif kind == 3:  # a look-ahead with a guard (branching definition)
                y = trl.empty((F,), domain=full, name=f"ahead{k}")
                y[(*full[:-1], T - 1)] = a[(*full[:-1], T - 1)] * 0.0
                y[full] = a[(*full[:-1], t + 1)] * 0.7
            elif kind == 4:  # a suffix window summed
                y = a[(*full[:-1], slice(t, T))].sum(0) * 0.1
            elif kind == 5:  # the iteration's total, broadcast back over t
                y = a * 0.5 + a[(*full[:-1], slice(0, T))].mean(0)
            elif kind == 6:
                y = (a @ w) * 0.3 + c
            elif kind == 7:  # a backward linear recurrence (GAE's shape)
                y = trl.empty((F,), domain=full, name=f"back{k}")
                y[(*full[:-1], T - 1)] = a[(*full[:-1], T - 1)] * 0.5
                y[full] = a + (c.tanh() * 0.9) * y[(*full[:-1], t + 1)]
            else:  # a forward one (a running sum)
                y = trl.empty((F,), domain=full, name=f"fwd{k}")
                y[(*full[:-1], 0)] = c[(*full[:-1], 0)]
                y[full] = a * 0.5 + (c.tanh() * 0.5) * y[(*full[:-1], t - 1)]
            pool.append(y)
        z = pool[-1]
        loss = (z * z).sum() * 0.01 + ((u @ w).tanh() * x).sum() * 0.1
        loss.backward()
        w[i + 1] = w - 0.05 * w.grad
        w.sink(sink(0))
        z.sink(sink(1))
        z[(*full[:-1], slice(0, T))].sum(0).sink(sink(2))
    bounds = {I: 3, T: int(rng.integers(2, 6))}
    if batch:
        bounds[B] = int(rng.integers(1, 4))
    return ctx, bounds, out


def outputs(seed: int, batch: bool, backend: str, **options: Any) -> list:
    ctx, bounds, out = build(seed, batch)
    ctx.compile(bounds, backend=backend, **options).execute()
    return sorted(out, key=lambda r: (r[0], r[1]))
