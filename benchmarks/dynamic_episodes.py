"""Episodes of dynamic length (``T`` found by a done-signal) with and without one switch.

Monte-Carlo REINFORCE (``examples/reinforce.py``) acts until every env's episode is done,
so its acting loop is a loop over a dynamic bound, then computes each step's return
``r[t:T].discounted_sum(gamma)``. ``--switch scan_loops`` (the default): the acting loop in
chunks (one ``lax.while_loop`` per chunk on JAX, a host loop on Torch; ``runtime/scan.py``)
or statement by statement. ``--switch suffix_scan``: the returns as rows of one suffix sum
(``pdg/passes/suffix_scan.py``) or one ``discounted_sum`` per step. For each env family and
backend this runs the same program both ways, alternated, and reports per iteration (after
``--warmup``): the milliseconds per episode step and the seconds (medians; episode lengths
differ once the two runs' trajectories do), the dispatches (``Executor.dispatches``) and the
whole run's seconds (compiles included); the episode returns must agree (over the first 10
iterations: on Torch last-bit differences between a fused region's kernels and a host loop's
grow over long runs). Run it pinned, one
thread, as the side-by-side does::

    OMP_NUM_THREADS=1 XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1" \\
        taskset -c 0 python benchmarks/dynamic_episodes.py
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

import reinforce  # noqa: E402


def run(env_id: str, backend: str, envs: int, iterations: int, warmup: int, options: dict) -> dict:
    """Seconds and dispatches per iteration, and the episode returns, for one configuration."""
    marks: list[tuple[int, float]] = []
    returns: list[float] = []
    holder: dict[str, object] = {}

    def log_fn(v: object, p: dict) -> None:
        returns.append(float(np.asarray(v)))
        if p["b"] == 0:
            marks.append((holder["ex"].dispatches, time.perf_counter()))  # type: ignore[attr-defined]

    args = reinforce.Args(
        env_id=env_id, backend=backend, num_envs=envs, iterations=iterations, seed=0, quiet=True
    )
    t0 = time.perf_counter()
    ex = reinforce.build(args, log_fn, **options)
    holder["ex"] = ex
    ex.execute()
    total = time.perf_counter() - t0
    d = np.diff([m[0] for m in marks])[warmup:]
    s = np.diff([m[1] for m in marks])[warmup:]
    (bound,) = ex.pdg.dynamic_bounds
    lengths = ex._interp.bound_values(bound)  # noqa: SLF001 - each episode's T, by iteration
    t = np.asarray([lengths[(k,)] for k in range(1, len(marks))], dtype=float)[warmup:]
    return {
        "s_per_iter": float(np.median(s)),
        "ms_per_step": float(np.median(s / t)) * 1e3,
        "steps": float(np.mean(t)),
        "dispatches": float(np.median(d)),
        "total_s": total,
        "returns": returns,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--envs", type=int, default=16)
    ap.add_argument("--iterations", type=int, default=80)
    ap.add_argument("--warmup", type=int, default=40, help="iterations left out of the medians")
    ap.add_argument("--repeats", type=int, default=2, help="alternated runs per configuration")
    ap.add_argument("--switch", default="scan_loops", choices=["scan_loops", "suffix_scan"])
    ap.add_argument(
        "--configs",
        nargs="+",
        default=["gymnax.CartPole-v1:jax", "gymnax.CartPole-v1:torch", "CartPole-v1:torch"],
    )
    a = ap.parse_args()
    print(
        f"{'env':<22} {'backend':<7} {a.switch:<11} {'ms/step':>8} {'s/iter':>8} {'T':>6} {'dispatches':>11} {'run s':>7}"
    )
    for cfg in a.configs:
        env_id, backend = cfg.split(":")
        got: dict[bool, list[dict]] = {True: [], False: []}
        for _ in range(a.repeats):
            for scan in (True, False):
                got[scan].append(run(env_id, backend, a.envs, a.iterations, a.warmup, {a.switch: scan}))
        # the same episodes while parameters agree: Torch's fused regions and a host loop's
        # kernels may round the last bit differently, which long runs amplify (JAX: all equal)
        first = a.envs * 10
        assert got[True][0]["returns"][:first] == got[False][0]["returns"][:first], (
            f"{cfg}: the returns differ"
        )
        for scan in (True, False):
            rs = got[scan]
            print(
                f"{env_id:<22} {backend:<7} {'on' if scan else 'off':<11} "
                f"{min(r['ms_per_step'] for r in rs):>8.3f} {min(r['s_per_iter'] for r in rs):>8.4f} "
                f"{rs[0]['steps']:>6.0f} {rs[0]['dispatches']:>11.0f} {min(r['total_s'] for r in rs):>7.1f}"
            )
        on = min(r["ms_per_step"] for r in got[True])
        off = min(r["ms_per_step"] for r in got[False])
        print(f"  {a.switch} on / off: {on / off:.2f}x the time per episode step")


if __name__ == "__main__":
    main()
