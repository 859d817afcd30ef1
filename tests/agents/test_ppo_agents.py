"""PPO with many agents in one program (issue 34): ``--num-seeds`` and ``--sweep`` train
agents along a dim ``s``; agent ``k`` equals the one-agent run with ``--seed SEED + k`` and
its sweep settings, rollout and weights bit for bit (its network, envs and random draws are
seeded as that run's), on both backends, with and without epochs and minibatches."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from timerl.agents import ppo
from timerl.errors import TimeRLError


def _run(args: ppo.PPOArgs) -> dict[tuple[Any, int], np.ndarray]:
    got: dict[tuple[Any, int], np.ndarray] = {}
    ex = ppo.build_fixed(args, lambda v, p: got.__setitem__((p.get("s"), p["i"]), np.array(v)))
    ex.execute()
    return got


@pytest.mark.parametrize(
    ("env_id", "backend", "extra"),
    [
        ("gymnax.CartPole-v1", "jax", {}),
        ("CartPole-v1", "torch", {"update_epochs": 2, "num_minibatches": 2}),
        ("gymnax.CartPole-v1", "torch", {"update_epochs": 2, "num_minibatches": 2}),
    ],
)
def test_agent_k_equals_the_one_agent_run_with_its_seed_and_settings(
    env_id: str, backend: str, extra: dict
) -> None:
    base = dict(
        env_id=env_id, num_envs=4, num_steps=32, iterations=4, backend=backend, seed=3, quiet=True, **extra
    )
    many = _run(ppo.PPOArgs(**base, num_seeds=2, sweep=("lr=3e-3,1e-2",)))
    assert sorted(many) == [(k, i) for k in range(4) for i in range(4)]
    for k, lr in enumerate([3e-3, 3e-3, 1e-2, 1e-2]):  # the grid's settings, each with 2 seeds
        one = _run(ppo.PPOArgs(**{**base, "seed": 3 + k, "lr": lr}))
        for i in range(4):
            np.testing.assert_array_equal(many[(k, i)], one[(None, i)])


def test_agent_settings_are_the_grid_times_the_seeds() -> None:
    args = ppo.PPOArgs(seed=10, num_seeds=2, sweep=("lr=1e-3,3e-3", "ent-coef=0,0.01"))
    got = ppo.agent_settings(args)
    assert len(got) == 8
    assert got[0] == {"lr": 1e-3, "ent_coef": 0.0, "seed": 10.0}
    assert got[1] == {"lr": 1e-3, "ent_coef": 0.0, "seed": 11.0}
    assert got[7] == {"lr": 3e-3, "ent_coef": 0.01, "seed": 17.0}
    with pytest.raises(TimeRLError, match="--sweep 'momentum=1'"):
        ppo.agent_settings(ppo.PPOArgs(sweep=("momentum=1",)))
    with pytest.raises(TimeRLError, match="--num-steps N"):
        ppo.check_args(ppo.PPOArgs(num_seeds=2, num_steps=0))
