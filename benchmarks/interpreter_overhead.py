"""Interpreter overhead per executed AST node (issue 10, item 6).

A recurrence over ``t`` of ``--ops`` cheap scalar ops per step, run unfused, so every op is
one ``Exec`` of the AST: gather the input, run the kernel, store the output. The same ops
are then called directly on the backend in a Python loop (``backend.run`` with the same
inputs), in the same process. The difference per executed node is the interpreter's
overhead (target < 20 us).

    python benchmarks/interpreter_overhead.py --backend torch --steps 2000 --ops 20
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import timerl as trl
from timerl.backends import get_backend
from timerl.pdg.ops import Op, OpKind


def program(ops: int) -> tuple[trl.Context, object]:
    ctx = trl.Context(dims=("t",))
    with ctx as ((t, T),):
        x = trl.empty((), domain=(t,), name="x")
        x[0] = trl.const(np.float32(0.5))
        y = x
        for k in range(ops):
            y = y * 0.999 if k % 2 == 0 else y + 0.001
        x[t + 1] = y
        x[T - 1].sink(lambda v, p: None)
    return ctx, T


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="torch", choices=["torch", "jax"])
    p.add_argument("--steps", type=int, default=2000, help="T: steps of the recurrence")
    p.add_argument("--ops", type=int, default=20, help="scalar ops per step")
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    ctx, T = program(a.ops)
    ex = ctx.compile({T: a.steps}, backend=a.backend, fuse=False)
    best = float("inf")
    for _ in range(a.repeats):
        t0 = time.perf_counter()
        ex.execute()
        best = min(best, time.perf_counter() - t0)
    n = ex._interp.exec_count
    be = get_backend(a.backend)
    mul = Op.make(OpKind.MUL)
    x = be.from_numpy(np.float32(0.5))
    c = be.from_numpy(np.float32(0.999))
    t0 = time.perf_counter()
    for _ in range(n):
        x = be.run(mul, [x, c], (), (False, False), {})
    raw = time.perf_counter() - t0
    print(f"backend={a.backend} executed nodes={n} run={best:.3f}s per node={1e6 * best / n:.1f}us")
    print(f"raw backend.run loop: {1e6 * raw / n:.1f}us per op")
    print(f"interpreter overhead per executed node: {1e6 * (best - raw) / n:.1f}us")


if __name__ == "__main__":
    main()
