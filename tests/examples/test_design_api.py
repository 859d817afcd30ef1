"""The program of DESIGN.md §2, written exactly as there (small bounds), on both backends."""

from __future__ import annotations

import math

import pytest

import timerl as trl


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_design_program_runs(backend: str, tmp_path) -> None:
    seen: list[tuple[int, int, float]] = []
    ctx = trl.Context(num_dims=3)
    with ctx as ((b, B), (i, I), (t, T)):
        env = trl.env.make("gym.CartPole-v1", num_envs=B)
        dnn = trl.DNNBuilder(domain=(i,)).from_env(env, hidden=[64, 64]).build()
        o = trl.like(env.obs_space, domain=(b, i, t))
        o[b, i, 0] = env.reset(domain=(b, i))
        a = dnn(o)
        o[b, i, t + 1], r, d = env.step(a)
        g = r[b, i, t:T].discounted_sum(0.99)
        loss = (-dnn.log_prob(a) * g).mean()
        loss.backward()
        trl.optim.Adam(dnn.params, lr=1e-3).step()
        r[b, i, 0:T].sum(0).sink(lambda v, pt: seen.append((pt["i"], pt["b"], float(v))))
        dnn[(i + 1) % 2 == 0].checkpoint(str(tmp_path) + "/")
    executor = ctx.compile({B: 3, I: 2, T: d}, backend=backend)
    executor.execute()
    assert sorted((it, env_b) for it, env_b, _ in seen) == [(it, e) for it in range(2) for e in range(3)]
    assert all(math.isfinite(v) and 1 <= v <= 500 for *_, v in seen)
    assert any(tmp_path.iterdir())  # the checkpoint at i = 1 was written
