"""A gymnasium continuous-control env (``Box`` actions) through the Gaussian policy head."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

import timerl as trl

NB, NI, LEN = 2, 2, 15


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_pendulum_gaussian_policy(backend: str) -> None:
    rec: dict[str, list[Any]] = {}

    def keep(key: str) -> Any:
        return lambda v, pt: rec.setdefault(key, []).append(((pt["i"], pt["b"]), np.array(v)))

    ctx = trl.Context(dims=("b", "i", "t"))
    with ctx as ((b, B), (i, I), (t, T)):
        # Pendulum never terminates: its time limit (shortened here) ends every episode.
        env = trl.env.make("gym.Pendulum-v1", num_envs=B, seed=3, max_episode_steps=LEN)
        dnn = trl.DNNBuilder(domain=(i,)).from_env(env, hidden=[16]).build()
        assert dnn.head == "gaussian"
        o = trl.like(env.obs_space, domain=(b, i, t))
        o[b, i, 0] = env.reset(domain=(b, i))
        a = dnn(o)
        o[b, i, t + 1], r, d = env.step(a)
        g = r[b, i, t:T].discounted_sum(0.99)
        loss = (-dnn.log_prob(a) * g).mean()
        loss.backward()
        trl.optim.Adam(dnn.params, lr=1e-2).step()
        r[b, i, 0:T].sink(keep("r"))
        a[b, i, 0].sink(keep("a0"))
        dnn.log_std[i].sink(lambda v, pt: rec.setdefault("log_std", []).append((pt["i"], np.array(v))))
    ctx.compile({B: NB, I: NI, T: d}, backend=backend).execute()

    rews = dict(rec["r"])
    assert sorted(rews) == [(it, e) for it in range(NI) for e in range(NB)]
    for r in rews.values():
        assert r.shape == (LEN,) and np.isfinite(r).all() and (r <= 0).all()  # Pendulum: cost <= 0
    assert all(v.shape == (1,) and np.isfinite(v).all() for _, v in rec["a0"])
    assert all(math.isfinite(float(r.sum())) for r in rews.values())
    log_std = dict(rec["log_std"])
    assert log_std[0].shape == (1,) and not np.array_equal(log_std[0], log_std[1])  # Adam moved it


def test_single_env_without_batch_dim() -> None:
    """``num_envs=1`` (no batch dim): per-point values carry no leading env dim."""
    rets: list[tuple[int, float]] = []
    ctx = trl.Context(dims=("i", "t"))
    with ctx as ((i, I), (t, T)):
        env = trl.env.make("gym.Pendulum-v1", num_envs=1, seed=0, max_episode_steps=LEN)
        dnn = trl.DNNBuilder(domain=(i,)).from_env(env, hidden=[8]).build()
        o = trl.like(env.obs_space, domain=(i, t))
        o[i, 0] = env.reset(domain=(i,))
        a = dnn(o)
        o[i, t + 1], r, d = env.step(a)
        for p in dnn.params:  # no learning: keep the parameters
            p[i + 1] = p
        r[i, 0:T].sum(0).sink(lambda v, pt: rets.append((pt["i"], float(v))))
    ctx.compile({I: 2, T: d}, backend="torch").execute()
    assert [k for k, _ in sorted(rets)] == [0, 1]
    assert all(math.isfinite(v) and v <= 0 for _, v in rets)
