"""Memory and time with and without buffer donation (``CompileOptions(donate=True)``).

Builds ``examples/ppo.py``'s fixed-rollout PPO (``build_fixed``: ``--num-envs`` envs x
``--num-steps`` steps, ``--num-minibatches`` minibatches, ``--iterations`` iterations)
twice in one process, once with ``donate=False`` and once with ``donate=True`` (frees on
in both), then runs them alternately ``--warmup`` (uncounted: the regions compile) plus
``--rounds`` times each and reports per setting:
compile time, the median run time and iteration time, the store's peak bytes
(``memory_stats()``), how many inputs were donated (and their bytes) or refused
(held elsewhere), and whether the rollouts sunk (rewards and done flags of every step)
are identical. Then the ratios off / on. The maximum RSS is the process's and covers
both settings, so it is printed once.

    python benchmarks/memory_donate.py                               # jax, CartPole, 512 x 128
    python benchmarks/memory_donate.py --env-id gymnax.CartPole-v1
    python benchmarks/memory_donate.py --backend torch               # donation does nothing there

Timings on a shared machine are noisy; compare the ratios printed by one invocation.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="jax")
    p.add_argument("--env-id", default="CartPole-v1")
    p.add_argument("--num-envs", type=int, default=512)
    p.add_argument("--num-steps", type=int, default=128)
    p.add_argument("--num-minibatches", type=int, default=4)
    p.add_argument("--iterations", type=int, default=4)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--warmup", type=int, default=1, help="uncounted runs first (JIT compiles)")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    sys.path.insert(0, str(ROOT / "examples"))
    import ppo  # noqa: PLC0415

    from timerl.runtime.store import max_rss_bytes  # noqa: PLC0415

    args = ppo.Args(
        env_id=a.env_id,
        backend=a.backend,
        num_envs=a.num_envs,
        num_steps=a.num_steps,
        iterations=a.iterations,
        num_minibatches=a.num_minibatches,
        seed=a.seed,
    )
    state: dict[bool, dict] = {}
    for flag in (False, True):
        st = {"digest": hashlib.sha256(), "stamps": []}

        def log_fn(v, pt, st=st) -> None:
            st["digest"].update(v.tobytes())
            st["stamps"].append(time.perf_counter())

        t0 = time.perf_counter()
        ex = ppo.build_fixed(args, log_fn, donate=flag)
        st.update(ex=ex, compile_s=time.perf_counter() - t0, runs=[], its=[], digests=set())
        state[flag] = st
    for r in range(a.warmup + a.rounds):
        for flag in (False, True):
            st = state[flag]
            st["digest"], st["stamps"] = hashlib.sha256(), []
            t1 = time.perf_counter()
            st["ex"].execute()
            st["digests"].add(st["digest"].hexdigest())
            if r < a.warmup:  # compiles the regions
                continue
            st["runs"].append(time.perf_counter() - t1)
            stamps = st["stamps"]
            st["its"] += [b - c for c, b in zip(stamps, stamps[1:], strict=False)]
    mib = 1 << 20
    print(
        f"PPO {a.backend} {a.env_id}: {a.num_envs} envs x {a.num_steps} steps, {a.iterations} iterations, "
        f"M = {a.num_minibatches}, {a.rounds} timed runs each after {a.warmup} warm-up (alternated, one process)"
    )
    res = {}
    for flag in (False, True):
        st = state[flag]
        m = st["ex"].memory_stats(top=3)
        given, refused, nbytes = st["ex"]._interp.donation_stats
        res[flag] = {
            "run": statistics.median(st["runs"]),
            "it": statistics.median(st["its"]) if st["its"] else float("nan"),
            "peak": m.peak_bytes,
        }
        print(
            f"donate={flag!s:5}  compile {st['compile_s']:6.2f} s  run {res[flag]['run']:6.2f} s  "
            f"iteration {res[flag]['it']:6.3f} s  store peak {m.peak_bytes / mib:8.2f} MiB  "
            f"donated {given} inputs ({nbytes / mib:.2f} MiB) per run, refused {refused}"
        )
    off, on = res[False], res[True]
    same = state[False]["digests"] == state[True]["digests"] and len(state[False]["digests"]) == 1
    print(
        f"ratios off/on: store peak {off['peak'] / max(on['peak'], 1):.3f}x  run {off['run'] / on['run']:.3f}x  "
        f"iteration {off['it'] / on['it']:.3f}x  same rollouts: {same}  (max RSS of the process "
        f"{max_rss_bytes() / mib:.0f} MiB)"
    )


if __name__ == "__main__":
    main()
