"""Memory timeline of PPO with and without deallocation (the paper's Fig. 11a).

Builds ``examples/ppo.py``'s fixed-rollout PPO (``build_fixed``) with
``memory_timeline=True`` twice in one process, ``dealloc=False`` and ``dealloc=True``
(``--donate`` adds donation to the second), runs each once to compile its regions, then
once recorded, and saves a plot of the live bytes of the store's device pool (and the host
pool, when anything is in it) over the run, both settings on one time axis, to ``--out``
(PNG). Prints the peak and final live bytes of each and the number of samples.

    python benchmarks/memory_timeline.py                         # jax, 512 x 128, 3 iterations
    python benchmarks/memory_timeline.py --backend torch --out /tmp/timeline_torch.png
    python benchmarks/memory_timeline.py --overhead 3              # cost of the sampling
"""

from __future__ import annotations

import argparse
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
    p.add_argument("--iterations", type=int, default=3)
    p.add_argument("--donate", action="store_true", help="donation on in the run with frees")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(ROOT / "runs" / "memory" / "memory_timeline.png"))
    p.add_argument(
        "--overhead",
        type=int,
        default=0,
        help="instead: time N runs each with the timeline off and on (frees on)",
    )
    a = p.parse_args()
    sys.path.insert(0, str(ROOT / "examples"))
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415
    import ppo  # noqa: PLC0415

    args = ppo.Args(
        env_id=a.env_id,
        backend=a.backend,
        num_envs=a.num_envs,
        num_steps=a.num_steps,
        iterations=a.iterations,
        num_minibatches=a.num_minibatches,
        seed=a.seed,
    )
    if a.overhead:
        overhead(ppo, args, a.overhead)
        return
    mib = 1 << 20
    fig, ax = plt.subplots(figsize=(8, 4))
    for flag in (False, True):
        label = f"dealloc={flag}" + (", donate=True" if flag and a.donate else "")
        ex = ppo.build_fixed(
            args, lambda v, pt: None, dealloc=flag, donate=flag and a.donate, memory_timeline=True
        )
        ex.execute()  # compiles the regions
        t0 = time.perf_counter()
        ex.execute()
        run_s = time.perf_counter() - t0
        tl = ex.memory_timeline()
        st = ex.memory_stats()
        dev, host = tl.pool("device"), tl.pool("host")
        ax.plot(tl.seconds, [b / mib for b in dev], label=f"{label}: device", lw=1)
        if any(host):
            ax.plot(tl.seconds, [b / mib for b in host], label=f"{label}: host", lw=1, ls="--")
        print(
            f"{label:30} run {run_s:6.2f} s  store peak {st.peak_bytes / mib:8.2f} MiB  live at end "
            f"{st.live_bytes / mib:7.2f} MiB  {len(tl.seconds)} samples"
        )
    ax.set_xlabel("seconds into the run")
    ax.set_ylabel("live store bytes (MiB)")
    ax.set_title(
        f"PPO {a.backend} {a.env_id}, {a.num_envs} envs x {a.num_steps} steps, "
        f"{a.iterations} iterations, M = {a.num_minibatches}"
    )
    ax.legend()
    fig.tight_layout()
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    print(f"saved {out}")


def overhead(ppo: object, args: object, n: int) -> None:
    """Median run time with the timeline off and on, alternated in this process."""
    import statistics  # noqa: PLC0415

    exs = {flag: ppo.build_fixed(args, lambda v, pt: None, memory_timeline=flag) for flag in (False, True)}
    times: dict[bool, list[float]] = {False: [], True: []}
    for r in range(n + 1):
        for flag, ex in exs.items():
            t0 = time.perf_counter()
            ex.execute()
            if r:  # the first run compiles the regions
                times[flag].append(time.perf_counter() - t0)
    off, on = statistics.median(times[False]), statistics.median(times[True])
    samples = len(exs[True].memory_timeline().seconds)
    print(f"timeline off {off:.2f} s, on {on:.2f} s per run ({samples} samples): on/off {on / off:.3f}x")


if __name__ == "__main__":
    main()
