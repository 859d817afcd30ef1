"""Fused pure-op regions vs op-by-op interpretation on the REINFORCE program.

Same program, same seed, same process: runs ``examples/reinforce.py``'s program with
``fuse=False`` and ``fuse=True`` and reports wall time per iteration and the speedup.
The returns must agree (fusion changes values only by float rounding).

    python benchmarks/fusion_reinforce.py --backend jax --iterations 10
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import reinforce  # noqa: E402

import timerl as trl  # noqa: E402


def run(args: reinforce.Args, fuse: bool) -> tuple[float, list[float]]:
    rets: dict[int, list[float]] = {}
    orig = trl.Context.compile

    def compile_with(self, bounds, **kw):
        return orig(self, bounds, fuse=fuse, **kw)

    trl.Context.compile = compile_with
    try:
        ex = reinforce.build(args, lambda v, p: rets.setdefault(p["i"], []).append(float(v)))
    finally:
        trl.Context.compile = orig
    ex.execute()  # warm-up run: jit compilation, env creation
    rets.clear()
    t0 = time.perf_counter()
    ex.execute()
    dt = time.perf_counter() - t0
    return dt, [float(np.mean(rets[k])) for k in sorted(rets)]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--backend", default="jax")
    p.add_argument("--iterations", type=int, default=10)
    p.add_argument("--num-envs", type=int, default=16)
    p.add_argument("--n", type=int, default=0)
    a = p.parse_args()
    args = reinforce.Args(backend=a.backend, iterations=a.iterations, num_envs=a.num_envs, n=a.n)
    t_off, r_off = run(args, fuse=False)
    t_on, r_on = run(args, fuse=True)
    same = np.allclose(r_off, r_on)
    print(f"backend={a.backend} n={a.n} iterations={a.iterations} envs={a.num_envs}")
    print(f"unfused: {t_off:.2f}s   fused: {t_on:.2f}s   speedup: {t_off / t_on:.2f}x   same returns: {same}")


if __name__ == "__main__":
    main()
