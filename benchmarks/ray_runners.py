"""Env steps per second with the envs on K Ray runners (issue #35), K = 1, 2, 4, 8.

The env stands in for a remote simulator: each env's ``step`` sleeps 10 ms and uses no CPU
(``SlowEnv``, registered with gymnasium; no native vector env, so one runner steps its envs
one after another). ``B`` envs, ``T`` steps of random actions; each K compiles the program
once, runs it once to warm up and then ``--repeats`` times, timed; the figure is env steps per
second (``B * T`` per run), reported with its ratio to one runner and to the in-process run.
``--env cartpole`` times gymnasium's CartPole-v1 (a fast native vector env) the same way, to
see the per-step cost of the runners themselves; ``--env ppo`` trains PPO on it
(``timerl.agents.ppo.build_fixed``, ``--steps`` per rollout) and reports seconds per iteration
(the median after the first) and whether the learning curve equals the in-process one. Run it
pinned to one core::

    taskset -c 1 python benchmarks/ray_runners.py                 # SlowEnv, B = 8, T = 50
    taskset -c 1 python benchmarks/ray_runners.py --env cartpole --envs 64 --runners 1 2
    taskset -c 1 python benchmarks/ray_runners.py --env ppo --envs 8 --steps 128 --runners 1 2
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

import gymnasium as gym
import numpy as np

SLOW_ID = "SlowEnv-v0"


class SlowEnv(gym.Env):
    """A 4-float observation, 2 actions; ``step`` waits ``delay`` seconds (no CPU)."""

    def __init__(self, delay: float = 0.01) -> None:
        self.delay = delay
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self._t = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self._t = 0
        return self.np_random.uniform(-1, 1, 4).astype(np.float32), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        time.sleep(self.delay)
        self._t += 1
        obs = self.np_random.uniform(-1, 1, 4).astype(np.float32)
        return obs, float(action), False, False, {}


if SLOW_ID not in gym.registry:
    gym.register(SLOW_ID, entry_point=f"{__name__}:SlowEnv")


def run(env_id: str, envs: int, steps: int, runners: int | None, repeats: int) -> float:
    """Env steps per second of the best of ``repeats`` timed runs."""
    import timerl as trl

    ctx = trl.Context(dims=("b", "t"))
    with ctx as ((b, B), (t, T)):
        spec = None if runners is None else trl.dist.ray_runners(num_runners=runners)
        env = trl.env.make(env_id, num_envs=B, runners=spec, autoreset=True)
        o0 = env.reset(domain=(b,))
        a = (trl.rand((), domain=(b, t)) * 2.0).cast(trl.int64)
        _, r, _ = env.step(a)
        total: list[float] = []
        r[0:B, 0:T].sum().sink(lambda v, p: total.append(float(v)))
        o0.sum().sink(lambda v, p: None)
    ex = ctx.compile({B: envs, T: steps}, backend="jax")
    ex.execute()  # warm-up: actors up, jitted regions compiled
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        ex.execute()
        best = min(best, time.perf_counter() - t0)
    if env.runners is not None:
        env.runners.close()
    return envs * steps / best


def run_ppo(envs: int, steps: int, runners: int | None, iterations: int) -> tuple[float, np.ndarray]:
    """(median seconds per PPO iteration after the first, the rewards of every rollout)."""
    import timerl as trl
    from timerl.agents.ppo import PPOArgs, build_fixed

    marks: list[float] = []
    rewards: list[np.ndarray] = []

    def log_fn(v: np.ndarray, p: dict[str, int]) -> None:
        marks.append(time.perf_counter())
        rewards.append(np.array(v))

    holder: dict[str, object] = {}

    def env_fn(args: PPOArgs, B: object) -> object:
        spec = None if runners is None else trl.dist.ray_runners(num_runners=runners)
        env = trl.env.make("gym.CartPole-v1", num_envs=B, seed=args.seed, autoreset=True, runners=spec)
        holder["env"] = env
        return env

    args = PPOArgs(
        env_id="CartPole-v1", num_envs=envs, num_steps=steps, iterations=iterations, checkpoint_every=0
    )
    build_fixed(args, log_fn, env_fn=env_fn).execute()
    env = holder["env"]
    if env.runners is not None:  # type: ignore[attr-defined]
        env.runners.close()  # type: ignore[attr-defined]
    return float(np.median(np.diff(marks)[1:])), np.stack(rewards)


def main_ppo(args: argparse.Namespace) -> None:
    base_s, base_r = run_ppo(args.envs, args.steps, None, args.iterations)
    print(f"PPO gym.CartPole-v1, B = {args.envs}, T = {args.steps}, {args.iterations} iterations")
    print(f"{'runners':>10} {'s/iteration':>12} {'vs in-process':>14} {'same curve':>11}")
    print(f"{'in-process':>10} {base_s:12.3f} {1.0:14.2f} {'':>11}")
    for k in args.runners:
        s, r = run_ppo(args.envs, args.steps, k, args.iterations)
        same = r.shape == base_r.shape and bool(np.array_equal(r, base_r))
        print(f"{k:>10} {s:12.3f} {s / base_s:14.2f} {same!s:>11}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", choices=["slow", "cartpole", "ppo"], default="slow")
    p.add_argument("--iterations", type=int, default=6, help="PPO iterations (--env ppo)")
    p.add_argument("--envs", type=int, default=8)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--runners", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--num-cpus", type=int, default=2, help="CPUs of the local Ray instance")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    # the runners' worker processes import this module to make SlowEnv: put it on their path
    here = os.path.dirname(os.path.abspath(__file__))
    os.environ["PYTHONPATH"] = os.pathsep.join([here, os.environ.get("PYTHONPATH", "")])
    sys.path.insert(0, here)
    env_id = "gym.ray_runners:SlowEnv-v0" if args.env == "slow" else "gym.CartPole-v1"
    import ray

    t0 = time.perf_counter()
    ray.init(num_cpus=args.num_cpus, include_dashboard=False, log_to_driver=False)
    print(f"ray.init: {time.perf_counter() - t0:.1f} s")
    if args.env == "ppo":
        main_ppo(args)
        ray.shutdown()
        return
    base = run(env_id, args.envs, args.steps, None, args.repeats)
    print(f"{env_id}, B = {args.envs}, T = {args.steps}, best of {args.repeats}")
    print(f"{'runners':>10} {'env steps/s':>12} {'vs 1 runner':>12} {'vs in-process':>14}")
    print(f"{'in-process':>10} {base:12.0f} {'':>12} {1.0:14.2f}")
    one = None
    for k in args.runners:
        sps = run(env_id, args.envs, args.steps, k, args.repeats)
        one = one or (sps if k == 1 else None)
        vs_one = f"{sps / one:12.2f}" if one else f"{'':>12}"
        print(f"{k:>10} {sps:12.0f} {vs_one} {sps / base:14.2f}", flush=True)
    ray.shutdown()


if __name__ == "__main__":
    main()
