"""The pieces of ``examples/ppo_looptune.py`` (README command 1): the problem subsets, the
env, PPO's training with the demonstrations from :mod:`.seed_demos`, the greedy tuning of
test problems by the trained policy, the learning-curve plot and the fresh measurers of
the report. ``args`` is the example's ``Args`` (a :class:`timerl.agents.ppo.PPOArgs` with
the LoopTune fields: ``env_id``, ``measurer``, ``reward``, ``noise``, ``seed_demos``, ...).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import timerl as trl
from timerl.agents import ppo
from timerl.envs.looptune.ir import Problem

log = logging.getLogger("timerl.envs.looptune")


def subset(problems: list[Problem], n: int, seed: int) -> list[Problem]:
    """``n`` of ``problems`` drawn with ``seed`` (in dataset order); all of them if ``n <= 0``."""
    if n <= 0 or n >= len(problems):
        return list(problems)
    idx = np.random.default_rng(seed).choice(len(problems), n, replace=False)
    return [problems[int(k)] for k in sorted(idx)]


def make_env(args: Any, B: Any, split: str, problems: list[Problem], reward: str) -> Any:
    """The LoopTune env of ``args`` over ``problems`` (``B`` envs along the batch dim)."""
    return trl.env.make(
        args.env_id,
        num_envs=B,
        seed=args.seed,
        split=split,
        problems=problems,
        measurer=args.measurer,
        reward=reward,
        noise=args.noise,
        farm=farm_of(args),
    )


def farm_of(args: Any) -> Any:
    """The measurement farm of ``args.ray_address``/``args.farm_workers`` (None without one:
    measured in this process; Ray is not imported then)."""
    address = getattr(args, "ray_address", "")
    if not address:
        return None
    from timerl.dist.farm import farm_from_flags

    return farm_from_flags(address, getattr(args, "farm_workers", 0))


def latest_weights(ckpt_dir: str) -> dict[str, np.ndarray]:
    """The network's parameters (``dnn.*``) at their latest point in the latest checkpoint."""
    from timerl.runtime.checkpoint import read_values

    return {
        name: by_point[max(by_point)]
        for name, by_point in read_values(ckpt_dir).items()
        if name.startswith("dnn.") and ".adam_" not in name
    }


def tune_with_policy(args: Any, weights: dict[str, np.ndarray], problems: list[Problem]) -> dict[str, dict]:
    """Greedy rollouts of the trained policy on ``problems`` (an RT program of its own):
    per problem, the actions taken, the schedule kept (the last one with ``reward="final"``,
    else the best one of the rollout) and the seconds per problem (policy inference plus
    compiling and timing the schedules measured)."""
    B = min(args.num_envs, len(problems))
    iters = math.ceil(len(problems) / B)
    ctx = trl.Context(dims=("b", "i", "t"))
    with ctx as ((b, Bs), (i, I), (t, T)):
        env = make_env(args, Bs, "test", problems, reward="final" if args.reward == "final" else args.reward)
        dnn = (
            trl.DNNBuilder(seed=args.seed).from_env(env, hidden=[args.hidden] * 2, critic=True).build(weights)
        )
        o = trl.like(env.obs_space, domain=(b, i, t), name="obs")
        o[b, i, 0] = env.reset(domain=(b, i))
        # greedy over the actions that change the nest: an argmax on a no-op would repeat
        # it for the rest of the episode (the state, hence the choice, stays the same)
        valid = env.action_mask(o)
        a = (dnn.forward(o) + (valid - 1.0) * 1e9).argmax(-1)
        o[b, i, t + 1], _, d = env.step(a)
    ex = ctx.compile({Bs: B, I: iters, T: d}, backend=args.backend, seed=args.seed)
    t0 = time.perf_counter()
    ex.execute()
    per_problem = (time.perf_counter() - t0) / (B * iters)
    out: dict[str, dict] = {}
    for rec in env.history:
        if rec.problem.name not in out:
            kept = rec.final_key if args.reward == "final" else rec.best_key
            out[rec.problem.name] = {"actions": list(rec.actions), "state": kept, "seconds": per_problem}
    return out


def seed_env_demos(env: Any, problems: list[Problem]) -> str:
    """Measure :func:`.seed_demos.search_demos`'s candidates for ``problems`` with ``env``'s
    measurer and keep the fastest per problem as its demonstration; a one-line summary."""
    from timerl.envs.looptune.seed_demos import search_demos

    t = time.perf_counter()
    demos = search_demos(problems, env.measurer, max_steps=env.episode_len, max_loops=env.max_loops)
    kept = env.seed_demonstrations(demos)
    geo = math.exp(float(np.mean(np.log([d.speedup for d in demos])))) if demos else 1.0
    return (
        f"demonstrations: {kept} of {len(problems)} training problems, geomean {geo:.2f}x untuned "
        f"({time.perf_counter() - t:.0f}s)"
    )


def train(
    args: Any, problems: list[Problem], say: Callable[[str], None] = log.info
) -> tuple[list[float], list[float]]:
    """PPO (``ppo.build``) on ``problems``, with the demonstrations of :func:`seed_env_demos`
    first when ``args.seed_demos`` and ``args.bc_coef > 0``: per iteration, the mean episode
    return and the geomean over the envs of the best schedule's speedup (as the training
    measurer saw it). ``say`` gets the one-line messages (demonstrations, iterations)."""
    envs = []

    def env_fn(a: Any, B: Any) -> Any:
        env = make_env(a, B, "train", problems, reward=a.reward)
        if a.seed_demos and a.bc_coef > 0 and not envs:
            say(seed_env_demos(env, problems))
        envs.append(env)
        return env

    returns: dict[int, list[float]] = {}
    means: list[float] = []
    quiet = args.quiet or not args.progress
    run: trl.run.RunLog | None = None  # made once compiled: its bar times iterations only
    t0 = time.perf_counter()

    def log_fn(v: np.ndarray, pt: dict[str, int]) -> None:
        it = pt["i"]
        returns.setdefault(it, []).append(float(v[0]))
        if len(returns[it]) == args.num_envs:
            means.append(float(np.mean(returns[it])))
            line = f"iter {it:4d}  mean return {means[-1]:8.3f}  time {time.perf_counter() - t0:6.1f}s"
            assert run is not None
            run.log(it, line if quiet else None, mean_return=means[-1])

    ex = ppo.build(args, log_fn, env_fn)
    run = trl.run.RunLog(args.out_dir, args.iterations, "training", quiet)
    ex.execute()
    run.close()  # metrics.csv and TensorBoard events
    speedups: dict[int, list[float]] = {}
    for rec in envs[0].history:
        if rec.initial_gflops > 0 and rec.best_gflops > 0:
            speedups.setdefault(rec.reset_point, []).append(math.log(rec.best_gflops / rec.initial_gflops))
    return means, [math.exp(float(np.mean(speedups[k]))) for k in sorted(speedups)]


def plot_learning_curve(means: list[float], speedups: list[float], path: Path) -> None:
    """Mean episode return and the geomean speedup of the episodes' best schedules per iteration."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.5))
    ax1.plot(range(len(means)), means)
    ax1.set(xlabel="iteration", ylabel="mean episode return", title="PPO on LoopTune: return")
    ax2.plot(range(len(speedups)), speedups)
    ax2.set(xlabel="iteration", ylabel="geomean best / untuned", title="training episodes: best speedup")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def fresh_measurers(measurer: str) -> Callable[[], Any]:
    """A function making measurers with no disk cache (for the analytic model of the tests,
    one shared deterministic model)."""
    from timerl.envs.looptune.measure import AnalyticCostModel, TVMMeasurer

    if measurer == "tvm":
        return lambda: TVMMeasurer(disk_cache=False)
    model = AnalyticCostModel()
    return lambda: model


def curves_from_logs(paths: list[str]) -> dict[str, list[float]]:
    """Per log of ``examples/ppo_looptune.py`` (its stdout), the mean return per iteration
    from its ``training: ... mean return per iteration [...]`` line, keyed by the file name
    without its suffix (``seed3.log`` -> ``seed3``); logs without that line are left out."""
    import ast

    out = {}
    for p in paths:
        for line in Path(p).read_text().splitlines():
            if line.startswith("training:") and "mean return per iteration [" in line:
                out[Path(p).stem] = [float(x) for x in ast.literal_eval(line[line.index("[") :])]
    return out


def plot_curves(curves: dict[str, list[float]], path: Path, title: str = "PPO on LoopTune") -> None:
    """Every run's mean return per iteration in one plot (e.g. ten seeds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for label, means in curves.items():
        ax.plot(range(len(means)), means, label=label, lw=1)
    ax.set(xlabel="iteration", ylabel="mean episode return", title=title)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":  # python -m timerl.envs.looptune.ppo_run OUT.png LOG...
    import sys

    if len(sys.argv) < 3:
        sys.exit("usage: python -m timerl.envs.looptune.ppo_run OUT.png LOG [LOG ...]")
    plot_curves(curves_from_logs(sys.argv[2:]), Path(sys.argv[1]))
