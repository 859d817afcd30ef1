"""PPO on image observations under a device-memory budget (issue 11's image outcome).

``agents/ppo.py``'s fixed-rollout PPO (``build_fixed``, one update per rollout) on
``ImageDot`` (``benchmarks/memory_swap.py``: 3 x 64 x 64 float32 frames, 48 KiB per env
and step), ``--num-envs`` x ``--num-steps``. Each setting is compiled in this process,
run once uncounted, then ``--rounds`` times (median per run and per iteration; ``--rounds 0``:
the first run, timed):

* ``frees``: the defaults (deallocation placed by isl, per output; nothing moved);
* ``incrementalize``: ``incrementalize=--threshold``: the weight gradients over the rollout
  run in blocks of steps and the critic's first layer per step (no data moves);
* ``swap``: ``swap=True`` alone (the observations wait on the host until learning, which
  fetches them all at once);
* ``incrementalize+swap``: both (each block of observations fetched for its block of the
  gradients);
* ``budget``: ``memory_budget=--budget``, the setting chosen by the compiler (it tries frees,
  incrementalization, swapping, then both), after checking that ``frees`` exceeds it.

Prints each setting's device and host pool peaks (the store's accounting, every stored
tensor once per node; the budget's estimate from the schedule beside it; ``--estimate-only``:
compile and print the estimate, run nothing), the process's max RSS so far (run one setting per process to compare
it), the run and iteration times, and whether its rollouts (rewards and done flags of every
step) equal those of the first setting.

    python benchmarks/memory_image_ppo.py --num-envs 16 --num-steps 128 --budget 64MiB
    python benchmarks/memory_image_ppo.py --num-envs 256 --num-steps 1000 --iterations 1 --rounds 0 \
        --settings budget --budget 1GiB
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "examples"))
MIB = 1 << 20


def options(setting: str, a: argparse.Namespace) -> dict[str, Any]:
    incr = {"incrementalize": a.threshold}
    swap = {"swap": True, "swap_threshold": a.swap_threshold}
    return {
        "frees": {},
        "incrementalize": incr,
        "swap": swap,
        "incrementalize+swap": {**incr, **swap},
        "budget": {"memory_budget": a.budget},
    }[setting]


def main() -> None:
    from memory_swap import register_env  # noqa: PLC0415
    from ppo import Args, build_fixed  # noqa: PLC0415

    from timerl.units import parse_bytes  # noqa: PLC0415

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="torch")
    p.add_argument("--num-envs", type=int, default=16)
    p.add_argument("--num-steps", type=int, default=128)
    p.add_argument("--iterations", type=int, default=2)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threshold", default="4MiB", help="incrementalize= for the explicit settings")
    p.add_argument("--swap-threshold", type=int, default=1 << 16, help="bytes per point")
    p.add_argument("--budget", default="64MiB", help="memory_budget= of the budget setting")
    p.add_argument("--settings", default="frees,incrementalize,swap,incrementalize+swap,budget")
    p.add_argument("--estimate-only", action="store_true", help="compile and print the estimated peak only")
    a = p.parse_args()
    env = register_env(a.num_steps)
    args = Args(
        env_id=env, backend=a.backend, num_envs=a.num_envs, num_steps=a.num_steps, iterations=a.iterations
    )
    obs = a.num_envs * a.num_steps * 3 * 64 * 64 * 4
    print(f"PPO {a.num_envs} envs x {a.num_steps} steps, {a.iterations} iterations, {a.backend}: "
          f"{obs / MIB:.0f} MiB of observations per rollout")  # fmt: skip
    base: list | None = None
    for setting in a.settings.split(","):
        sunk: list = []
        t0 = time.perf_counter()
        ex = build_fixed(args, lambda v, pt, s=sunk: s.append(np.asarray(v).copy()), **options(setting, a))
        compile_s = time.perf_counter() - t0
        est = ex.plan.peak.peak_bytes
        if a.estimate_only:
            print(
                f"{setting:20} estimated device peak {est / MIB:9.2f} MiB (not run)  compile {compile_s:6.1f} s"
            )
            continue
        secs = []
        for r in range(a.rounds + 1):
            sunk.clear()
            t0 = time.perf_counter()
            ex.execute()
            if r or not a.rounds:  # --rounds 0: the one run, compilation of regions included
                secs.append(time.perf_counter() - t0)
        st = ex.memory_stats()
        dev, host = st.pool("device").peak_bytes, st.pool("host").peak_bytes
        same = base is None or (
            len(base) == len(sunk) and all(np.array_equal(x, y) for x, y in zip(base, sunk, strict=True))
        )
        base = sunk if base is None else base
        chosen = ""
        if setting == "budget":
            o = ex.options
            chosen = (
                f" (budget {parse_bytes(a.budget) / MIB:.0f} MiB: chose incrementalize={o.incrementalize}, "
                f"swap={o.swap}, swap_threshold={o.swap_threshold})"
            )
        run = statistics.median(secs)
        print(
            f"{setting:20} device peak {dev / MIB:9.2f} MiB (estimated {est / MIB:.2f})  host peak {host / MIB:9.2f} MiB  "
            f"max RSS {st.max_rss_bytes / MIB:7.0f} MiB  compile {compile_s:6.1f} s  run {run:7.2f} s  "
            f"iteration {run / a.iterations:6.2f} s  rollouts equal: {same}{chosen}",
            flush=True,
        )


if __name__ == "__main__":
    main()
