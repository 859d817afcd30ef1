"""Python-level dispatches and seconds per PPO iteration as T grows (issue #39's host-bound row).

PPO on gymnax's CartPole with few envs is bound by the host: what matters is how many
statements the interpreter runs from Python per iteration, which should not grow with the
rollout length T once every loop over t compiles as one scan. For each T this runs
``examples/ppo.py``'s fixed-length program and reports, per iteration (after ``--warmup``),
the dispatches (``Executor.dispatches``: one per region, node or scanned loop entry) and the
seconds. Run it pinned, one thread, as the side-by-side does::

    OMP_NUM_THREADS=1 XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1" \\
        taskset -c 0 python benchmarks/host_dispatches.py --steps 250 1000 4000
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from timerl.agents.ppo import PPOArgs, build_fixed


def run(
    steps: int, envs: int, iterations: int, warmup: int, backend: str, compiled: bool | str = True
) -> tuple[float, float, float, str]:
    """(dispatches per iteration, seconds per iteration, compile seconds, how the body ran)
    for one T; ``compiled``: ``compile_iterations`` (True, False or "auto")."""
    marks: list[tuple[int, float]] = []
    holder: dict[str, object] = {}

    def log_fn(*_: object) -> None:
        marks.append((holder["ex"].dispatches, time.perf_counter()))  # type: ignore[attr-defined]

    args = PPOArgs(
        env_id="gymnax.CartPole-v1",
        num_envs=envs,
        num_steps=steps,
        iterations=iterations,
        update_epochs=1,
        num_minibatches=1,
        backend=backend,
        checkpoint_every=0,
    )
    t0 = time.perf_counter()
    ex = build_fixed(args, log_fn, compile_iterations=compiled)
    compile_s = time.perf_counter() - t0
    holder["ex"] = ex
    ex.execute()
    d = np.diff([m[0] for m in marks])[warmup:]
    s = np.diff([m[1] for m in marks])[warmup:]
    return float(np.mean(d)), float(np.median(s)), compile_s, ex.iteration_body


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])  # as the other benchmarks
    ap.add_argument("--steps", type=int, nargs="+", default=[250, 1000, 4000], help="rollout lengths T")
    ap.add_argument("--envs", type=int, default=8, help="parallel environments")
    ap.add_argument("--iterations", type=int, default=6, help="PPO iterations per T")
    ap.add_argument("--warmup", type=int, default=2, help="iterations left out (compilation)")
    ap.add_argument("--backend", default="jax", choices=["jax", "torch"])
    ap.add_argument(
        "--body",
        default="both",
        choices=["compiled", "statements", "both", "auto", "all"],
        help="the iteration body as one compiled call (compile_iterations=True), statement by "
        "statement (False), both, as the default chooses (auto), or all three",
    )
    a = ap.parse_args()
    modes: list[bool | str] = {
        "compiled": [True],
        "statements": [False],
        "both": [False, True],
        "auto": ["auto"],
        "all": [False, True, "auto"],
    }[a.body]
    print(f"{'T':>6} {'body':>10} {'dispatches/iter':>16} {'s/iter':>9} {'compile s':>10}")
    for T in a.steps:
        for compiled in modes:
            d, s, c, how = run(T, a.envs, a.iterations, a.warmup, a.backend, compiled)
            body = {True: "one call", False: "statements", "auto": "auto"}[compiled]
            print(f"{T:>6} {body:>10} {d:>16.1f} {s:>9.4f} {c:>10.1f}", flush=True)
            if compiled == "auto":
                print(f"{'':>6} auto: {how}", flush=True)


if __name__ == "__main__":
    main()
