"""Peak store memory with and without freeing finished iterations (``free_iterations``).

Runs the REINFORCE program of ``examples/reinforce.py`` twice in one process, same seed,
and reports the point store's peak bytes (the runtime's own accounting) and the returns,
which must be equal.

    python benchmarks/memory_free_iterations.py --backend torch --iterations 10
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import reinforce  # noqa: E402

import timerl as trl  # noqa: E402


def run(args: reinforce.Args, free: bool) -> tuple[int, int, list[float]]:
    rets: list[float] = []
    orig = trl.Context.compile

    def compile_with(self, bounds, **kw):
        return orig(self, bounds, free_iterations=free, **kw)

    trl.Context.compile = compile_with
    try:
        ex = reinforce.build(args, lambda v, p: rets.append(float(v)))
    finally:
        trl.Context.compile = orig
    ex.execute()
    st = ex.memory_stats()
    return st.peak_bytes, st.live_bytes, rets


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--backend", default="torch")
    p.add_argument("--iterations", type=int, default=10)
    p.add_argument("--num-envs", type=int, default=16)
    a = p.parse_args()
    args = reinforce.Args(backend=a.backend, iterations=a.iterations, num_envs=a.num_envs)
    peak_off, live_off, r_off = run(args, free=False)
    peak_on, live_on, r_on = run(args, free=True)
    print(f"backend={a.backend} iterations={a.iterations} envs={a.num_envs}")
    print(f"keep all:         peak {peak_off / 2**20:8.1f} MiB  live at end {live_off / 2**20:8.1f} MiB")
    print(f"free iterations:  peak {peak_on / 2**20:8.1f} MiB  live at end {live_on / 2**20:8.1f} MiB")
    print(f"peak ratio: {peak_off / max(peak_on, 1):.1f}x   same returns: {r_off == r_on}")


if __name__ == "__main__":
    main()
