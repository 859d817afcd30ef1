# REINFORCE (Williams, 1992) as a recurrent-tensor program; TimeRL paper Alg. 1.
# Monte-Carlo returns g[t] = sum_{k >= t} gamma^(k-t) r[k]; with --n, n-step returns
# g[t] = sum_{k = t}^{min(t+n, T)-1} gamma^(k-t) r[k] (TimeRL §8.4), a symbolic slice of the
# rewards over the window t:min(t+n, T). With a window the scheduler interleaves learning with
# acting (learning for step t runs n-1 steps after acting at t; Monte-Carlo returns wait for the
# episode's end). --n 20 learns CartPole reliably; --n 5 gives a weak signal (the truncated
# return is the same constant except in the last 5 steps of an episode). --num-seeds K trains
# K agents at once along a dim s (agent k as the one-agent run with --seed SEED + k).
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

import timerl as trl
from timerl.backends import import_backend
from timerl.run import RunArgs, checkpoint_and_compile


@dataclass
class Args(RunArgs):
    env_id: str = "CartPole-v1"
    """the environment id: gymnasium's (CartPole-v1), or with a family prefix (gymnax.CartPole-v1:
    JAX-native, each episode's acting loop then runs as compiled chunks)"""
    backend: str = "jax"
    """tensor backend: jax or torch"""
    num_envs: int = 16
    """parallel environments (the batch dim b)"""
    iterations: int = 60
    """training iterations (the dim i)"""
    lr: float = 1e-2
    """Adam learning rate"""
    gamma: float = 0.99
    """discount factor"""
    n: int = 0
    """n-step returns window (0: Monte-Carlo returns over t:T)"""
    hidden: int = 32
    """hidden units per layer (two layers)"""
    seed: int = 0
    """random seed"""
    num_seeds: int = 1
    """agents trained at once in one program, along a dim s: agent k runs as a one-agent run
    with --seed SEED + k would (its network, its envs, its random draws)"""
    sweep: tuple[str, ...] = ()
    """settings varied over the agents, a grid: --sweep lr=1e-2,3e-3 trains each value with
    --num-seeds seeds (fields: lr)"""
    out_dir: str = "runs/reinforce"
    """run directory: metrics.csv, TensorBoard events, learning_curve.png"""


def check_args(args: Args) -> None:
    """Raise a ``TimeRLError`` naming the flag that cannot make the program."""
    for name in ("num_envs", "iterations", "hidden", "num_seeds"):
        if getattr(args, name) < 1:
            raise trl.TimeRLError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.n < 0:
        raise trl.TimeRLError(f"--n must be 0 (Monte-Carlo returns) or a window length, got {args.n}")


def parse_args(defaults: Args | None = None) -> Args:
    return trl.run.parse_args(Args, defaults, "REINFORCE as a timerl program", check=check_args)


def build(args: Args, log_fn, **options):
    settings = trl.run.agent_settings(args.sweep, args.num_seeds, args.seed, ("lr",))
    many = len(settings) > 1  # agents along a dim s, last: indices leave it implicit
    ctx = trl.Context(dims=("b", "i", "t", "s") if many else ("b", "i", "t"))
    with ctx as ((b, B), (i, I), (t, T), *agent):
        s = (agent[0][0],) if many else ()
        env_id = args.env_id if args.env_id.split(".")[0] in ("gym", "gymnax") else f"gym.{args.env_id}"
        env = trl.env.make(env_id, num_envs=B, seed=args.seed, agents=agent[0][1] if many else None)
        seeds = [int(st["seed"]) for st in settings] if many else None
        hp = trl.run.per_agent(args, settings, s[0]) if many else args  # a learning rate per agent
        dnn = (
            trl.DNNBuilder(domain=(i, *s), seed=args.seed, seeds=seeds, agents=s)
            .from_env(env, hidden=[args.hidden] * 2)
            .build()
        )
        # Acting: o[0] from reset, o[t+1] from stepping the env with the sampled action.
        o = trl.like(env.obs_space, domain=(b, i, t, *s), name="obs")
        o[b, i, 0] = env.reset(domain=(b, i, *s))
        a = dnn(o)
        o[b, i, t + 1], r, d = env.step(a)
        # Learning: discounted returns over a symbolic slice of the rewards.
        if args.n > 0:
            g = r[b, i, t : trl.min(t + args.n, T)].discounted_sum(args.gamma)
        else:
            g = r[b, i, t:T].discounted_sum(args.gamma)
        loss = -dnn.log_prob(a) * g
        loss.backward()
        trl.optim.Adam(dnn.params, lr=hp.lr).step()
        # Episode return per env, reported once per iteration.
        r[b, i, 0:T].sum(0).sink(log_fn)
    bounds = {B: args.num_envs, I: args.iterations, T: d}
    if many:
        bounds[agent[0][1]] = len(settings)
    return checkpoint_and_compile(ctx, args, dnn, i, bounds, **options)


def main(args: Args) -> list[float]:
    trl.run.setup_logging()
    n = len(trl.run.agent_settings(args.sweep, args.num_seeds, args.seed, ("lr",)))
    returns: dict[tuple[int, int], list[float]] = {}  # (iteration, agent) -> each env's return
    per_iter: dict[int, list[float]] = {}  # iteration -> each agent's mean return
    means: list[float] = []  # per iteration: the mean over the agents
    imported = import_backend(args.backend)  # not part of the compile time below
    t0 = time.perf_counter()
    run: trl.run.RunLog | None = None  # made once compiled: its bar times iterations only

    def log_fn(v: np.ndarray, pt: dict[str, int]) -> None:
        it, k = pt["i"], pt.get("s", 0)
        got = returns.setdefault((it, k), [])
        got.append(float(v))
        if len(got) < args.num_envs:
            return
        m = float(np.mean(got))
        per_iter.setdefault(it, []).append(m)
        line = None
        if len(per_iter[it]) == n:  # the last agent of this iteration
            means.append(float(np.mean(per_iter[it])))
            spread = f" (+- {np.std(per_iter[it]):.1f} over {n} agents)" if n > 1 else ""
            line = (
                f"iter {it:4d}  mean return {means[-1]:7.1f}{spread}  time {time.perf_counter() - t0:7.1f}s"
            )
        assert run is not None
        run.log(it, line, agent=k if n > 1 else None, mean_return=m)

    ex = build(args, log_fn)
    print(
        f"{args.backend} imported in {imported:.1f}s; compiled in {time.perf_counter() - t0:.1f}s; running {args.iterations} iterations on {args.backend}"
        + (
            f" for {n} agents (seeds {args.seed}..{args.seed + n - 1}; {' '.join(args.sweep)})"
            if n > 1
            else ""
        )
    )
    run = trl.run.RunLog(args.out_dir, args.iterations, f"REINFORCE {args.env_id}", args.quiet, agents=n)
    ex.execute()
    run.close(curve="mean_return")
    return means


if __name__ == "__main__":
    main(parse_args())
