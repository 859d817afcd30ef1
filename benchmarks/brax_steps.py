"""Env-steps per second of a brax env inside a timerl program, per backend.

Three measurements, all in one process (brax's jitted reset/step compile once):

- ``raw``: the cached jitted brax step called in a Python loop with random actions (the
  ceiling; what ``timerl.envs.brax_env`` itself adds is the done masking in the same jit);
- ``act``: a timerl program that only acts (Gaussian MLP policy -> ``env.step``), with the
  JAX and the Torch backend (on Torch, observations and actions cross through DLPack);
- ``learn``: the same program plus REINFORCE (``log_prob``, ``backward``, Adam).

Each program is executed once to warm up (compilations), then timed; steps are counted as
``B * T`` per iteration (``T``: that iteration's episode length, the longest in the batch).

    python benchmarks/brax_steps.py --env inverted_pendulum --num-envs 64 --iterations 5
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import jax
import numpy as np

import timerl as trl
from timerl.envs import brax_env


def raw(name: str, n: int, steps: int) -> float:
    c = brax_env.compiled(name)
    dev = c.device
    with jax.enable_x64(False):
        st, obs, done, cnt = c.reset(jax.device_put(np.uint32(0), dev), n)
        limit = jax.device_put(np.int32(10**9), dev)  # never time out
        acts = [
            jax.device_put(np.random.default_rng(k).uniform(-1, 1, (n, c.act_size)).astype(np.float32), dev)
            for k in range(8)
        ]
        done = jax.device_put(np.zeros(n, bool), dev)  # keep stepping: ignore terminations
        st, obs, _, _, cnt = c.step(st, obs, done, cnt, acts[0], limit)  # warm-up
        jax.block_until_ready(obs)
        t0 = time.perf_counter()
        for k in range(steps):
            st, obs, _, _, cnt = c.step(st, obs, done, cnt, acts[k % 8], limit)
        jax.block_until_ready(obs)
        return n * steps / (time.perf_counter() - t0)


def program(
    name: str, backend: str, n: int, iters: int, max_steps: int, learn: bool
) -> tuple[float, list[int]]:
    lengths: dict[int, int] = {}

    def record(v: Any, pt: dict[str, int]) -> None:
        lengths[pt["i"]] = int(np.shape(v)[0])

    ctx = trl.Context(dims=("b", "i", "t"))
    with ctx as ((b, B), (i, I), (t, T)):
        env = trl.env.make(f"brax.{name}", num_envs=B, seed=0, max_steps=max_steps)
        dnn = trl.DNNBuilder(domain=(i,)).from_env(env, hidden=[64, 64]).build()
        o = trl.like(env.obs_space, domain=(b, i, t))
        o[b, i, 0] = env.reset(domain=(b, i))
        a = dnn(o)
        o[b, i, t + 1], r, d = env.step(a)
        if learn:
            g = r[b, i, t:T].discounted_sum(0.99)
            loss = (-dnn.log_prob(a) * g).mean()
            loss.backward()
            trl.optim.Adam(dnn.params, lr=1e-3).step()
        else:  # keep the policy parameters alive across iterations without learning
            for p in dnn.params:
                p[i + 1] = p
        r[b, i, 0:T].sink(record)
    ex = ctx.compile({B: n, I: iters, T: d}, backend=backend)
    ex.execute()  # warm-up: compilations
    lengths.clear()
    t0 = time.perf_counter()
    ex.execute()
    dt = time.perf_counter() - t0
    steps = n * sum(lengths.values())
    return steps / dt, [lengths[k] for k in sorted(lengths)]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--env", default="inverted_pendulum")
    p.add_argument("--num-envs", type=int, default=64)
    p.add_argument("--iterations", type=int, default=5)
    p.add_argument("--max-steps", type=int, default=1000)
    p.add_argument("--raw-steps", type=int, default=200)
    p.add_argument("--backends", default="jax,torch")
    p.add_argument(
        "--torch-threads",
        type=int,
        default=0,
        help="torch.set_num_threads(n) if n > 0: on a small CPU box torch's spinning OpenMP "
        "threads and XLA's thread pool compete, and 1 thread is much faster",
    )
    a = p.parse_args()
    if a.torch_threads > 0:
        import torch

        torch.set_num_threads(a.torch_threads)
    t0 = time.perf_counter()
    brax_env.compiled(a.env)
    import torch

    print(
        f"env brax.{a.env} (spring), B={a.num_envs}, iterations={a.iterations}, "
        f"max_steps={a.max_steps}, torch threads={torch.get_num_threads()}"
    )
    rate = raw(a.env, a.num_envs, a.raw_steps)
    print(
        f"raw jitted step:            {rate:10.0f} env-steps/s   (first use incl. compile {time.perf_counter() - t0:.1f}s)"
    )
    for backend in a.backends.split(","):
        for learn in (False, True):
            rate, lens = program(a.env, backend, a.num_envs, a.iterations, a.max_steps, learn)
            kind = "act+learn" if learn else "act"
            print(f"timerl {backend:5s} {kind:9s}:     {rate:10.0f} env-steps/s   episode lengths T={lens}")


if __name__ == "__main__":
    main()
