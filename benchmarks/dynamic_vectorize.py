"""Episodic programs (dynamic ``T``) with and without ``vectorize_dynamic``.

Builds an episodic program twice in one process — ``--program reinforce`` (Monte-Carlo
REINFORCE, ``examples/reinforce.py``) or ``ppo`` (episodic PPO, ``timerl.agents.ppo.build``)
— once with ``vectorize_dynamic=False`` (learning runs per timestep) and once with it on
(learning runs once per episode over batch axes padded to power-of-two buckets of ``T``),
then runs them alternately ``--rounds`` times each. Per setting it prints the compile
time, the run time, the median time of the iterations after the first ``--warm``
(by then most buckets have compiled on JAX), the statements executed and the XLA
compilations of its first run (JAX; later runs reuse the compiled code), and whether every iteration's returns are equal. Then the
ratios off / on.

    python benchmarks/dynamic_vectorize.py --backend jax --program reinforce
    python benchmarks/dynamic_vectorize.py --backend torch --program ppo --num-envs 16

Timings on a shared machine are noisy; compare the ratios printed by one invocation.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


class _Compiles(logging.Handler):
    """Counts JAX's 'Finished XLA compilation' log records."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.n = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "Finished XLA compilation" in record.getMessage():
            self.n += 1


def _build(args: argparse.Namespace, flag: bool, sink):
    if args.program == "reinforce":
        sys.path.insert(0, str(ROOT / "examples"))
        import reinforce

        a = reinforce.Args(
            backend=args.backend, iterations=args.iterations, num_envs=args.num_envs, seed=args.seed
        )
        return reinforce.build(a, sink, vectorize_dynamic=flag)
    from timerl.agents import ppo

    a = ppo.PPOArgs(backend=args.backend, iterations=args.iterations, num_envs=args.num_envs, seed=args.seed)
    return ppo.build(a, sink, vectorize_dynamic=flag)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="jax", choices=["jax", "torch"])
    p.add_argument("--program", default="reinforce", choices=["reinforce", "ppo"])
    p.add_argument("--num-envs", type=int, default=8)
    p.add_argument("--iterations", type=int, default=30)
    p.add_argument("--warm", type=int, default=10, help="iterations left out of the median")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    counter = _Compiles()
    if args.backend == "jax":
        import jax

        jax.config.update("jax_log_compiles", True)
        jl = logging.getLogger("jax")
        jl.addHandler(counter)
        jl.setLevel(logging.DEBUG)
        jl.propagate = False

    runs: dict[bool, dict] = {}
    for flag in (False, True):
        state = {"stamps": {}, "returns": {}}

        def sink(v, pt, state=state):
            state["stamps"][pt["i"]] = time.perf_counter()
            state["returns"].setdefault(pt["i"], []).append(np.asarray(v).tolist())

        t0 = time.perf_counter()
        ex = _build(args, flag, sink)
        runs[flag] = {"ex": ex, "state": state, "compile": time.perf_counter() - t0, "run": [], "iter": []}
    print(f"{args.program} on {args.backend}, {args.num_envs} envs x {args.iterations} episodes")
    same = True
    ref = None
    for _ in range(args.rounds):
        for flag in (False, True):
            r = runs[flag]
            r["state"]["stamps"].clear()
            r["state"]["returns"].clear()
            ex = r["ex"]
            c0 = counter.n
            t0 = time.perf_counter()
            ex.execute()
            r["run"].append(time.perf_counter() - t0)
            r["execs"] = ex._interp.exec_count  # counted from 0 by each run
            r.setdefault("compiles", counter.n - c0)  # the first run's
            st = [t0] + [r["state"]["stamps"][k] for k in sorted(r["state"]["stamps"])]
            r["iter"] += list(np.diff(st))[args.warm :]
            rets = r["state"]["returns"]
            ref = rets if ref is None else ref
            same = same and rets == ref
            r["steps"] = sum(len(v) for v in rets.values())
    for flag in (False, True):
        r = runs[flag]
        print(
            f"vectorize_dynamic={flag!s:5}  compile {r['compile']:6.2f} s  run {statistics.median(r['run']):7.2f} s  "
            f"iteration (median after {args.warm}) {statistics.median(r['iter']) * 1e3:8.1f} ms  "
            f"statements {r['execs']:8d}  XLA compilations (first run) {r['compiles']}"
        )
    off, on = runs[False], runs[True]
    print(
        f"off / on: run {statistics.median(off['run']) / statistics.median(on['run']):.2f}x  "
        f"iteration {statistics.median(off['iter']) / statistics.median(on['iter']):.2f}x  "
        f"statements {off['execs'] / on['execs']:.2f}x"
    )
    print(f"returns equal in every iteration: {same}")


if __name__ == "__main__":
    main()
