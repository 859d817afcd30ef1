# PPO (Schulman et al., 2017) with GAE as one recurrent-tensor program over dims (b, i, t).
# The TimeRL setting: one epoch, one minibatch (the whole rollout of iteration i), so the
# policy's activations from acting are reused by the symbolic autodiff for learning.
from __future__ import annotations

import logging
import os
import sys
import time
from dataclasses import dataclass

import numpy as np

import timerl as trl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402
from _common import CheckpointArgs, checkpoint_and_compile  # noqa: E402


@dataclass
class Args(CheckpointArgs):
    env_id: str = "CartPole-v1"
    """the gymnasium environment id"""
    backend: str = "jax"
    """tensor backend: jax or torch"""
    num_envs: int = 4
    """parallel environments (the batch dim b)"""
    iterations: int = 250
    """training iterations (the dim i); each runs one episode per env"""
    lr: float = 3e-3
    """Adam learning rate (annealed linearly to 0 over the iterations)"""
    anneal_lr: bool = True
    """anneal the learning rate (an RT over i)"""
    gamma: float = 0.99
    """discount factor"""
    gae_lambda: float = 0.95
    """GAE lambda"""
    clip_coef: float = 0.2
    """surrogate clipping coefficient"""
    ent_coef: float = 0.0
    """entropy bonus coefficient"""
    vf_coef: float = 0.5
    """value-loss coefficient"""
    norm_adv: bool = True
    """normalise advantages over the rollout of each iteration"""
    hidden: int = 64
    """hidden units per layer (two layers)"""
    shared: bool = False
    """share the actor and critic trunk"""
    seed: int = 0
    """random seed"""


def parse_args(defaults: Args | None = None) -> Args:
    return _common.parse_args(Args, defaults, "PPO with GAE as a timerl program")


def build(args: Args, log_fn):
    ctx = trl.Context(dims=("b", "i", "t"))
    with ctx as ((b, B), (i, I), (t, T)):
        env = trl.env.make(f"gym.{args.env_id}", num_envs=B, seed=args.seed)
        dnn = (
            trl.DNNBuilder(domain=(i,), seed=args.seed)
            .from_env(env, hidden=[args.hidden] * 2, critic=True, shared=args.shared)
            .build()
        )
        # Acting.
        o = trl.like(env.obs_space, domain=(b, i, t), name="obs")
        o[b, i, 0] = env.reset(domain=(b, i))
        a = dnn(o)
        v = dnn.value()  # V(o[t]) from the same forward pass
        o[b, i, t + 1], r, d = env.step(a)
        # alive[t]: the env had not finished before t (done envs keep stepping with reward 0)
        alive = trl.empty((), domain=(b, i, t), name="alive")
        alive[b, i, 0] = trl.ones(())
        alive[b, i, t + 1] = 1.0 - d.cast(trl.float32)
        not_done = 1.0 - d.cast(trl.float32)
        # GAE as a backward recurrence over t (dynamic T).
        v_next = trl.empty((), domain=(b, i, t), name="v_next")
        v_next[b, i, T - 1] = trl.zeros(())
        v_next[b, i, t] = v[b, i, t + 1]
        delta = (r + args.gamma * not_done * v_next.detach() - v.detach()) * alive
        adv = trl.empty((), domain=(b, i, t), name="adv")
        adv[b, i, T - 1] = delta[b, i, T - 1]
        adv[b, i, t] = delta + args.gamma * args.gae_lambda * not_done * adv[b, i, t + 1]
        ret = adv + v.detach()
        if args.norm_adv:
            # mean and std over every alive step of the iteration's rollout
            n = alive[0:B, i, 0:T].sum()
            mu = (adv[0:B, i, 0:T] * alive[0:B, i, 0:T]).sum() / n
            dev = (adv[0:B, i, 0:T] - mu) * alive[0:B, i, 0:T]
            std = ((dev * dev).sum() / n).sqrt()
            adv_n = (adv - mu) / (std + 1e-8)
        else:
            adv_n = adv
        # Clipped surrogate (ratio = 1 in the single epoch; its gradient is grad log pi).
        logp = dnn.log_prob(a)
        ratio = (logp - logp.detach()).exp()
        pg1 = -adv_n * ratio
        pg2 = -adv_n * trl.where(ratio < 1.0 - args.clip_coef, trl.full((), 1.0 - args.clip_coef), ratio)
        pg2 = trl.where(ratio > 1.0 + args.clip_coef, -adv_n * (1.0 + args.clip_coef), pg2)
        pg_loss = trl.where(pg1 > pg2, pg1, pg2)
        v_loss = 0.5 * (v - ret) * (v - ret)
        loss = (
            (pg_loss + args.vf_coef * v_loss - args.ent_coef * dnn.entropy()) * alive / float(args.num_envs)
        )
        loss.backward()
        if args.anneal_lr:
            lr = args.lr * (1.0 - trl.as_tensor(i) / float(args.iterations))
        else:
            lr = args.lr
        trl.optim.Adam(dnn.params, lr=lr).step()
        # per env: (episode return, steps alive), reported once per iteration
        trl.stack([r[b, i, 0:T].sum(0), alive[b, i, 0:T].sum(0)]).sink(log_fn)
    return checkpoint_and_compile(ctx, args, dnn, i, {B: args.num_envs, I: args.iterations, T: d})


def main(args: Args) -> list[float]:
    logging.basicConfig(level=logging.WARNING)
    returns: dict[int, list[float]] = {}
    means: list[float] = []
    t0 = time.perf_counter()
    steps = 0

    def log_fn(v: np.ndarray, pt: dict[str, int]) -> None:
        nonlocal steps
        it = pt["i"]
        returns.setdefault(it, []).append(float(v[0]))
        steps += int(v[1])
        if len(returns[it]) == args.num_envs:
            m = float(np.mean(returns[it]))
            means.append(m)
            print(
                f"iter {it:4d}  mean return {m:7.1f}  env steps {steps:8d}  time {time.perf_counter() - t0:7.1f}s",
                flush=True,
            )

    ex = build(args, log_fn)
    print(
        f"compiled in {time.perf_counter() - t0:.1f}s; running {args.iterations} iterations on {args.backend}"
    )
    ex.execute()
    return means


if __name__ == "__main__":
    main(parse_args())
