"""Environments per agent (issue 34): ``trl.env.make(..., num_envs=B, agents=S)`` holds ``B``
envs per agent; agent ``k``'s envs are those of a one-agent env with seed ``seed + k``, so a
K-agent rollout equals K one-agent rollouts step for step (gymnasium and gymnax, both
backends, the rollout scanned or stepped)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import timerl as trl

K, SEED = 3, 5


def _rollout(k: int | None, env_id: str, backend: str, **options: Any) -> dict[tuple, np.ndarray]:
    """Random actions over (b, i, t) (and s), autoreset; sinks every iteration's rewards,
    done flags and observations (``k=None``: the K agents)."""
    got: dict[tuple, np.ndarray] = {}
    ctx = trl.Context(dims=("b", "i", "t", "s") if k is None else ("b", "i", "t"))
    with ctx as ((b, B), (i, I), (t, T), *agent):
        extra = (agent[0][0],) if agent else ()
        env = trl.env.make(
            env_id,
            num_envs=B,
            seed=SEED if k is None else SEED + k,
            autoreset=True,
            agents=agent[0][1] if agent else None,
        )
        o = trl.like(env.obs_space, domain=(b, i, t, *extra), name="o")
        o0 = env.reset(domain=(b, *extra))
        a = (trl.rand((), domain=(b, i, t, *extra)) * 2.0).cast(trl.int64)
        o2, r, d = env.step(a)
        o[b, 0, 0] = o0
        o[b, i, 0] = o2[b, i - 1, T - 1]
        o[b, i, t + 1] = o2
        trl.stack([r[0:B, i, 0:T], d[0:B, i, 0:T].cast(trl.float32)]).sink(
            lambda v, p: got.__setitem__(("r", p.get("s"), p["i"]), np.array(v))
        )
        o2[0:B, i, 0:T].sink(lambda v, p: got.__setitem__(("o", p.get("s"), p["i"]), np.array(v)))
    bounds = {B: 4, I: 3, T: 16}
    if agent:
        bounds[agent[0][1]] = K
    ctx.compile(bounds, backend=backend, seed=SEED if k is None else SEED + k, **options).execute()
    return got


@pytest.mark.parametrize("backend", ["jax", "torch"])
@pytest.mark.parametrize("env_id", ["gymnax.CartPole-v1", "gym.CartPole-v1"])
def test_each_agent_steps_its_own_envs(env_id: str, backend: str) -> None:
    many = _rollout(None, env_id, backend)
    assert len(many) == 2 * K * 3
    for k in range(K):
        one = _rollout(k, env_id, backend)
        for key, want in one.items():
            np.testing.assert_array_equal(many[(key[0], k, key[2])], want)
    assert not np.array_equal(many[("o", 0, 2)], many[("o", 1, 2)])


def test_a_scanned_rollout_equals_the_stepped_one() -> None:
    scanned = _rollout(None, "gymnax.CartPole-v1", "jax")
    stepped = _rollout(None, "gymnax.CartPole-v1", "jax", scan_loops=False)
    for key, want in stepped.items():
        np.testing.assert_array_equal(scanned[key], want)


def test_agents_are_refused_where_unsupported() -> None:
    ctx = trl.Context(dims=("b", "s"))
    with ctx as ((b, B), (s, S)):
        with pytest.raises(trl.TimeRLError, match="supported for 'gym"):
            trl.env.make("looptune.mm", num_envs=B, agents=S)
        with pytest.raises(trl.TimeRLError, match="one seed per agent; pass agents=S"):
            trl.env.make("gym.CartPole-v1", num_envs=B, seed=[1, 2])
