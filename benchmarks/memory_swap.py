"""Swapping observations to host memory (issue 11, deliverable 5; the paper's Fig. 11).

A gymnasium env with image observations (``ImageDot-v0``: a 3 x 64 x 64 float32 frame
with a moving dot, two actions, reward 1 when the action follows the dot, episodes of
exactly ``--length`` steps) is trained by

* ``mc``: a Monte-Carlo program over a dynamic ``T`` (the episode's done flag ends it):
  a linear policy acts on the images, and learning sinks, per step, the return-weighted
  image ``(o[t] * r[t:T].discounted_sum).sum()`` (the per-step term of a score-function
  gradient): the returns make learning wait for the end of the episode, so without
  swapping every observation of the episode stays on the device; at ``T = --short`` and
  ``T = --length``;
* ``reinforce``: ``examples/reinforce.py``'s Monte-Carlo REINFORCE (an MLP on the images,
  Adam): its weight gradient is one contraction over the episode, which reads every
  observation at once (incrementalization's case), at ``T = --short``;
* ``ppo``: ``agents/ppo.py``'s fixed-rollout PPO (``build_fixed``) with ``--ppo-envs`` x
  ``--ppo-steps`` (the issue's 256 x 1000 image rollout is 12.6 GB of observations: scaled
  down to this machine).

Each setting is built twice in one process, ``swap=False`` and ``swap=True`` (threshold
``--threshold`` bytes per point), run once uncounted (compiles the regions), then
``--rounds`` times alternating the two; prints the device and host pool peaks, the run
times (median) and their ratio, and checks that the sunk values are equal. Saves the
device / host timeline of the reinforce runs at ``T = --length`` to ``--out``.

    python benchmarks/memory_swap.py                       # torch, reinforce T = 100 / 1000, ppo
    python benchmarks/memory_swap.py --backend jax --skip-ppo
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
H = W = 64


def register_env(length: int) -> str:
    """``ImageDot-v0`` with episodes of ``length`` steps (re-registered per length)."""
    import gymnasium as gym  # noqa: PLC0415

    class ImageDot(gym.Env):
        def __init__(self) -> None:
            self.observation_space = gym.spaces.Box(0.0, 1.0, (3 * H * W,), np.float32)
            self.action_space = gym.spaces.Discrete(2)
            self.t = 0
            self.pos = 0

        def _obs(self) -> np.ndarray:
            img = np.zeros((3, H, W), np.float32)
            img[self.t % 3, self.pos % H, (self.pos * 7) % W] = 1.0
            return img.reshape(-1)

        def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[np.ndarray, dict]:
            super().reset(seed=seed)
            self.t, self.pos = 0, int(self.np_random.integers(H))
            return self._obs(), {}

        def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
            reward = float(int(action) == self.pos % 2)
            self.t += 1
            self.pos += 1 + int(action)
            return self._obs(), reward, self.t >= length, False, {}

    name = f"ImageDot{length}-v0"
    if name not in gym.registry:
        gym.register(id=name, entry_point=ImageDot)
    return name


def mc_program(a: argparse.Namespace, length: int, sunk: dict, **options: Any) -> Any:
    """The ``mc`` program (module doc), compiled."""
    import timerl as trl  # noqa: PLC0415

    ctx = trl.Context(dims=("b", "i", "t"))
    with ctx as ((b, B), (i, I), (t, T)):
        env = trl.env.make(f"gym.{register_env(length)}", num_envs=B, seed=0)
        dnn = trl.DNNBuilder(domain=(), seed=0).from_env(env, hidden=[]).build()  # fixed: acting only
        o = trl.like(env.obs_space, domain=(b, i, t), name="obs")
        o[b, i, 0] = env.reset(domain=(b, i))
        act = dnn(o)
        o[b, i, t + 1], r, d = env.step(act)
        g = r[b, i, t:T].discounted_sum(0.99)
        (o * g).sum(0).sink(lambda v, pt: sunk.__setitem__((pt["i"], pt["t"]), np.asarray(v).tolist()))
    return ctx.compile({B: a.num_envs, I: a.iterations, T: d}, backend=a.backend, **options)


def alternate(exs: dict[bool, Any], rounds: int) -> dict[bool, float]:
    """Median run time of each executor, runs alternated after one uncounted run each."""
    times: dict[bool, list[float]] = {k: [] for k in exs}
    for r in range(rounds + 1):
        for k, ex in exs.items():
            t0 = time.perf_counter()
            ex.execute()
            if r:
                times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def report(label: str, exs: dict[bool, Any], secs: dict[bool, float], same: bool) -> None:
    mib = 1 << 20
    for flag, ex in exs.items():
        st = ex.memory_stats()
        print(
            f"{label:28} swap={flag!s:5}  device peak {st.pool('device').peak_bytes / mib:9.2f} MiB  "
            f"host peak {st.pool('host').peak_bytes / mib:9.2f} MiB  run {secs[flag]:7.2f} s"
        )
    off, on = (exs[f].memory_stats().pool("device").peak_bytes for f in (False, True))
    print(
        f"{label:28} device peak off/on {off / max(on, 1):.2f}x, run time on/off "
        f"{secs[True] / secs[False]:.2f}x, sunk values equal: {same}"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="torch")
    p.add_argument("--num-envs", type=int, default=4)
    p.add_argument("--short", type=int, default=100)
    p.add_argument("--length", type=int, default=1000)
    p.add_argument("--iterations", type=int, default=2)
    p.add_argument("--threshold", type=int, default=1 << 16, help="swap_threshold (bytes per point)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--ppo-envs", type=int, default=16)
    p.add_argument("--ppo-steps", type=int, default=128)
    p.add_argument("--skip-ppo", action="store_true")
    p.add_argument("--out", default=str(ROOT / "runs" / "memory" / "memory_swap.png"))
    a = p.parse_args()
    sys.path.insert(0, str(ROOT / "examples"))
    import reinforce  # noqa: PLC0415

    timelines = {}
    for length in (a.short, a.length):
        sunk: dict[bool, dict] = {False: {}, True: {}}
        exs = {
            flag: mc_program(
                a, length, sunk[flag], swap=flag, swap_threshold=a.threshold, memory_timeline=True
            )
            for flag in (False, True)
        }
        secs = alternate(exs, a.rounds)
        report(f"mc T={length}", exs, secs, sunk[False] == sunk[True])
        if length == a.length:
            timelines = {flag: ex.memory_timeline() for flag, ex in exs.items()}
    env = register_env(a.short)
    args = reinforce.Args(env_id=env, backend=a.backend, num_envs=a.num_envs, iterations=a.iterations)
    sunk = {False: {}, True: {}}
    exs = {
        flag: reinforce.build(
            args,
            lambda v, pt, s=sunk[flag]: s.__setitem__((pt["i"], len(s)), np.asarray(v).tolist()),
            swap=flag,
            swap_threshold=a.threshold,
        )
        for flag in (False, True)
    }
    secs = alternate(exs, a.rounds)
    report(f"reinforce T={a.short}", exs, secs, sunk[False] == sunk[True])
    if not a.skip_ppo:
        ppo_run(a)
    plot(timelines, a)


def ppo_run(a: argparse.Namespace) -> None:
    import ppo  # noqa: PLC0415

    env = register_env(a.ppo_steps)
    args = ppo.Args(
        env_id=env, backend=a.backend, num_envs=a.ppo_envs, num_steps=a.ppo_steps, iterations=a.iterations
    )
    sunk: dict[bool, list] = {False: [], True: []}
    exs = {
        flag: ppo.build_fixed(
            args,
            lambda v, pt, s=sunk[flag]: s.append(np.asarray(v).tolist()),
            swap=flag,
            swap_threshold=a.threshold,
        )
        for flag in (False, True)
    }
    secs = alternate(exs, a.rounds)
    report(f"ppo {a.ppo_envs}x{a.ppo_steps} 3x64x64", exs, secs, sunk[False] == sunk[True])


def plot(timelines: dict[bool, Any], a: argparse.Namespace) -> None:
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    mib = 1 << 20
    fig, ax = plt.subplots(figsize=(8, 4))
    for flag, tl in timelines.items():
        ax.plot(tl.seconds, [x / mib for x in tl.pool("device")], label=f"swap={flag}: device", lw=1)
        if any(tl.pool("host")):
            ax.plot(tl.seconds, [x / mib for x in tl.pool("host")], label=f"swap={flag}: host", lw=1, ls="--")
    ax.set_xlabel("seconds into the run")
    ax.set_ylabel("live store bytes (MiB)")
    ax.set_title(
        f"Monte-Carlo program (mc), {a.backend}, 3x64x64 observations, {a.num_envs} envs, T = {a.length}"
    )
    ax.legend()
    fig.tight_layout()
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    print(f"saved {out}")


if __name__ == "__main__":
    main()
