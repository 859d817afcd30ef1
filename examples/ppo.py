# PPO (Schulman et al., 2017) with GAE on any env (gymnasium, brax, gymnax, looptune), as
# one recurrent-tensor program over dims (b, i, t): the TimeRL setting (one epoch, one
# minibatch) reuses the acting forward pass for learning; --update-epochs E and
# --num-minibatches M add the update dims (e, m), CleanRL's minibatches with --num-steps.
# The program (GAE, clipped surrogate, value loss, entropy bonus, Adam) is
# timerl/agents/ppo.py (`timerl.agents.ppo`); this script trains it and logs the returns.
#   python examples/ppo.py --num-envs 8 --num-steps 128 --iterations 100 --backend torch
# --num-seeds K (and --sweep lr=3e-4,1e-3 ...) trains K agents (x the grid) at once in one
# program along a dim s: agent k as the one-agent run with --seed SEED + k would, episodic
# (T: the longest episode of every agent's envs) or with --num-steps N.
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

import timerl as trl
from timerl.agents.ppo import EnvFn, PPOArgs, agent_settings, build, build_fixed, check_args, make_env
from timerl.backends import import_backend


@dataclass
class Args(PPOArgs):
    """PPO's hyperparameters (``timerl.agents.ppo.PPOArgs``: --env-id, --num-envs, --lr, ...)
    and the run flags (``timerl.run.RunArgs``); a field declared here adds a flag."""


def parse_args(defaults: Args | None = None) -> Args:
    return trl.run.parse_args(Args, defaults, "PPO with GAE as a timerl program", check=check_args)


def timed_env(env_fn: EnvFn) -> tuple[EnvFn, list[float]]:
    """``env_fn``, adding the seconds it takes to the list returned beside it (the env's own
    setup: importing its library, compiling its step), reported apart from timerl's compile."""
    spent = [0.0]

    def made(*a: Any) -> Any:
        t = time.perf_counter()
        try:
            return env_fn(*a)
        finally:
            spent[0] += time.perf_counter() - t

    return made, spent


def _ready(args: Args, imported: float, env_s: float, t0: float, who: str) -> str:
    """The line printed once the program is compiled: where the time before the run went."""
    compiled = time.perf_counter() - t0 - env_s
    return (
        f"{args.backend} imported in {imported:.1f}s; env made in {env_s:.1f}s; compiled in {compiled:.1f}s; "
        f"running {args.iterations} iterations on {args.backend}{who}"
    )


def main(args: Args, env_fn: EnvFn = make_env) -> list[float]:
    """Train with one episode per env and iteration (``--num-steps 0``), else with
    fixed-length rollouts (:func:`main_fixed`); returns the mean return per iteration. With
    ``--num-seeds`` / ``--sweep`` (K agents in one program): each agent's curve is logged
    (metrics.csv's ``agent`` column, TensorBoard ``agent_<k>/``), and the mean over the
    agents returned."""
    trl.run.setup_logging()
    if args.num_steps > 0:
        return main_fixed(args, env_fn)
    settings = agent_settings(args)
    n = len(settings)
    returns: dict[tuple[int, int], list[float]] = {}  # (iteration, agent) -> each env's return
    per_iter: dict[int, list[float]] = {}  # iteration -> each agent's mean return
    means: list[float] = []  # per iteration: the mean over the agents
    imported = import_backend(args.backend)  # not part of the compile time below
    t0 = time.perf_counter()
    steps = [0] * n  # env steps so far, per agent (the printed line: their mean)
    run: trl.run.RunLog | None = None  # made once compiled: its bar times iterations only

    def log_fn(v: np.ndarray, pt: dict[str, int]) -> None:
        it, k = pt["i"], pt.get("s", 0)
        got = returns.setdefault((it, k), [])
        got.append(float(v[0]))
        steps[k] += int(v[1])
        if len(got) < args.num_envs:
            return
        m = float(np.mean(got))
        del returns[(it, k)]
        per_iter.setdefault(it, []).append(m)
        line = None
        if len(per_iter[it]) == n:  # the last agent of this iteration
            mean, spread = _over_agents(per_iter.pop(it))
            means.append(mean)
            line = (
                f"iter {it:4d}  mean return {means[-1]:9.3f}{spread}  env steps {sum(steps) // n:8d}  "
                f"time {time.perf_counter() - t0:7.1f}s"
            )
        assert run is not None
        run.log(it, line, agent=k if n > 1 else None, mean_return=m, env_steps=steps[k])

    env_fn, env_s = timed_env(env_fn)
    ex = build(args, log_fn, env_fn)
    who = f" for {n} agents ({_describe(settings)})" if n > 1 else ""
    print(_ready(args, imported, env_s[0], t0, who))
    run = trl.run.RunLog(args.out_dir, args.iterations, f"PPO {args.env_id}", args.quiet, agents=n)
    ex.execute()
    run.close(curve="mean_return", x="env_steps")
    return means


def finished_returns(
    running: np.ndarray, rewards: np.ndarray, dones: np.ndarray, known: np.ndarray | None = None
) -> list[float]:
    """The returns of the episodes that end in a rollout (``rewards``, ``dones``: (envs, steps)),
    env by env in step order; ``running`` (per env: the return of its unfinished episode) is
    carried in place. In NumPy: a loop over the steps cost ~5 ms per 8 x 1,000 rollout, a
    sixth of PPO's whole iteration there. ``known`` (per env, carried in place): whether its
    unfinished episode's return is known; after a resume it is not (the episode began before
    the checkpoint), so that env's first finished episode is left out."""
    totals = np.cumsum(rewards, axis=1) + running[:, None]  # each env's return so far
    env, _ = np.nonzero(dones)
    ends = totals[dones]  # row-major: env by env, steps in order
    first = np.ones(len(env), dtype=bool)
    first[1:] = env[1:] != env[:-1]
    starts = np.where(first, 0.0, np.roll(ends, 1))  # the previous end in the same env
    final = np.ones(len(env), dtype=bool)
    final[:-1] = env[:-1] != env[1:]
    last = np.zeros(len(running))
    last[env[final]] = ends[final]  # each env's last end
    running[:] = totals[:, -1] - last
    got = ends - starts
    if known is not None:
        keep = ~(first & ~known[env])
        known[env] = True
        got = got[keep]
    return got.tolist()


def main_fixed(args: Args, env_fn: EnvFn = make_env) -> list[float]:
    """Train with fixed-length rollouts; returns, per iteration, the mean return of the
    episodes that finished in it (the previous mean when none did). With ``--num-seeds`` /
    ``--sweep`` (K agents in one program): each agent's curve is logged (metrics.csv's
    ``agent`` column, TensorBoard ``agent_<k>/``), and the mean over the agents returned."""
    imported = import_backend(args.backend)  # not part of the compile time below
    t0 = time.perf_counter()
    settings = agent_settings(args)
    n = len(settings)
    running = np.zeros((n, args.num_envs))  # return of each env's current episode, per agent
    known = np.full((n, args.num_envs), not args.resume)  # resumed: episodes began before it
    curves: list[dict[int, float]] = [{} for _ in range(n)]  # per agent: the mean return per iteration
    means: list[float] = []
    run: trl.run.RunLog | None = None  # made once compiled: its bar times iterations only

    def log_fn(v: np.ndarray, pt: dict[str, int]) -> None:
        it, k = pt["i"], pt.get("s", 0)
        eps = finished_returns(running[k], v[0], v[1] > 0, known[k])
        m = float(np.mean(eps)) if eps else (curves[k][max(curves[k])] if curves[k] else 0.0)
        curves[k][it] = m
        steps = (it + 1) * args.num_envs * args.num_steps
        line = None
        if all(it in c for c in curves):  # the last agent of this iteration
            mean, spread = _over_agents([c[it] for c in curves])
            means.append(mean)
            line = (
                f"iter {it:4d}  mean return {means[-1]:9.3f}{spread}  episodes {len(eps):4d}  "
                f"env steps {steps:8d}  time {time.perf_counter() - t0:7.1f}s"
            )
        assert run is not None
        run.log(it, line, agent=k if n > 1 else None, mean_return=m, episodes=len(eps), env_steps=steps)

    env_fn, env_s = timed_env(env_fn)
    ex = build_fixed(args, log_fn, env_fn)
    who = f" for {n} agents ({_describe(settings)})" if n > 1 else ""
    print(_ready(args, imported, env_s[0], t0, who))
    run = trl.run.RunLog(args.out_dir, args.iterations, f"PPO {args.env_id}", args.quiet, agents=n)
    ex.execute()
    run.close(curve="mean_return", x="env_steps")
    return means


def _over_agents(now: list[float]) -> tuple[float, str]:
    """The mean of one iteration's per-agent values and, with several agents, their spread
    and worst, as the progress line prints them."""
    spread = f" (+- {np.std(now):.3f} over {len(now)} agents, worst {min(now):.3f})" if len(now) > 1 else ""
    return float(np.mean(now)), spread


def _describe(settings: list[dict[str, float]]) -> str:
    """The agents' seeds and swept settings, short."""
    seeds = [int(st["seed"]) for st in settings]
    swept = sorted({k for st in settings for k in st if k != "seed"})
    grid = ", ".join(f"{k} in {sorted({st[k] for st in settings})}" for k in swept)
    return f"seeds {seeds[0]}..{seeds[-1]}" + (f"; {grid}" if grid else "")


if __name__ == "__main__":
    main(parse_args())
