"""PPO with many agents in one program (issue 34): ``--num-seeds`` and ``--sweep`` train
agents along a dim ``s``; agent ``k`` equals the one-agent run with ``--seed SEED + k`` and
its sweep settings (its network, envs and random draws are seeded as that run's), on both
backends, with and without epochs and minibatches, with fixed-length rollouts
(``build_fixed``) and episodic ones (``build``, a dynamic ``T``). The rollouts (actions,
hence rewards, dones, returns) are equal bit for bit; the weights within float rounding
(contractions and sums batched over the agents add in another order, see
:func:`test_episodic_agent_k_equals_the_one_agent_run`)."""

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
    ppo.check_args(ppo.PPOArgs(num_seeds=2, num_steps=0))  # episodic agents: fine
    with pytest.raises(TimeRLError, match="--bc-coef 0"):
        ppo.check_args(ppo.PPOArgs(num_seeds=2, bc_coef=0.1))


def _run_episodic(args: ppo.PPOArgs) -> tuple[dict[tuple[Any, int], np.ndarray], dict[str, np.ndarray]]:
    """Per (agent, iteration): each env's (episode return, steps alive), rows in env order
    (agent None in a one-agent run); and the parameters at the last stored point (the
    program compiled without frees, so they stay in the store; shape ``(S, ...)`` with agents)."""
    got: dict[tuple[Any, int], dict[int, np.ndarray]] = {}
    ex = ppo.build(
        args,
        lambda v, p: got.setdefault((p.get("s"), p["i"]), {}).__setitem__(p["b"], np.array(v)),
        dealloc=False,
    )
    ex.execute()
    interp = ex._interp
    params = {
        n.name: interp.value(n.id, max(interp.points(n.id)))
        for n in ex.pdg
        if (n.name or "").startswith("dnn.") and ".adam_" not in n.name and interp.points(n.id)
    }
    assert params
    return {k: np.stack([v[b] for b in sorted(v)]) for k, v in got.items()}, params


@pytest.mark.parametrize(
    ("env_id", "backend", "agents", "extra"),
    [
        ("gymnax.CartPole-v1", "jax", {"num_seeds": 2}, {}),
        ("CartPole-v1", "jax", {"sweep": ("lr=3e-3,1e-2",)}, {"update_epochs": 2, "num_minibatches": 2}),
        ("CartPole-v1", "torch", {"num_seeds": 3}, {}),
        (
            "gymnax.CartPole-v1",
            "torch",
            {"sweep": ("lr=3e-3,1e-2",)},
            {"update_epochs": 2, "num_minibatches": 2},
        ),
    ],
)
def test_episodic_agent_k_equals_the_one_agent_run(
    env_id: str, backend: str, agents: dict, extra: dict
) -> None:
    """Episodic PPO (``--num-steps 0``): agent k of a K-agent run equals the one-agent run
    with ``--seed SEED + k`` (and its swept ``--lr``) over 3 iterations. ``T`` is the longest
    episode of every env of every agent, so a one-agent run may have a shorter ``T``: the steps
    after an env's end are masked by ``alive`` (zero loss, zero gradient).

    Each env's episode return and length per iteration are equal bit for bit (the same
    sampled actions). The weights are equal within float rounding, not bit for bit, on both
    backends (measured: at most ~2e-7 absolute after 2 updates, ~1e-5 relative on the
    smallest biases; ``build_fixed`` with agents differs as much): the weight gradients are
    contractions over (b, t) batched over the agent dim, and the padded ``T`` adds masked zero
    terms, so the sums run in another order than the one-agent run's."""
    base = dict(
        env_id=env_id, num_envs=3, iterations=3, backend=backend, seed=3, hidden=8, quiet=True, **extra
    )
    many, w_many = _run_episodic(ppo.PPOArgs(**base, **agents))
    settings = ppo.agent_settings(ppo.PPOArgs(**base, **agents))
    assert sorted(many) == [(k, i) for k in range(len(settings)) for i in range(3)]
    T = [max(many[(k, i)][:, 1].max() for k in range(len(settings))) for i in range(3)]
    assert any(many[(k, i)][:, 1].max() < T[i] for k in range(len(settings)) for i in range(3))  # padded
    for k, st in enumerate(settings):
        one, w_one = _run_episodic(
            ppo.PPOArgs(**{**base, "seed": int(st["seed"]), "lr": st.get("lr", ppo.PPOArgs.lr)})
        )
        for i in range(3):
            np.testing.assert_array_equal(many[(k, i)], one[(None, i)])
        assert w_many.keys() == w_one.keys()
        for name, w in w_one.items():
            np.testing.assert_allclose(w_many[name][k], w, rtol=1e-5, atol=1e-6, err_msg=name)
