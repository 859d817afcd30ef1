"""``timerl.agents.ppo``: the public API of the PPO program and the flags it rejects.

The program's behaviour (activation reuse, GAE's schedule, CleanRL's minibatches, short
training runs) is tested through ``examples/ppo.py`` in ``tests/examples/test_ppo_program.py``."""

from __future__ import annotations

import re

import pytest

import timerl as trl
from timerl.agents import ppo


def test_public_names() -> None:
    assert trl.agents.ppo is ppo
    for name in ("PPOArgs", "build", "build_fixed", "check_args", "gae", "gae_fixed", "normalise"):
        assert callable(getattr(ppo, name)), name
    for name in ("normalise_fixed", "surrogate", "clipped_loss", "minibatch_loss", "make_env"):
        assert callable(getattr(ppo, name)), name
    assert issubclass(ppo.PPOArgs, trl.run.RunArgs)
    docs = trl.run.field_docs(ppo.PPOArgs)
    assert docs["gae_lambda"] == "GAE lambda" and docs["out_dir"].startswith("run directory")


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"num_envs": 0}, "--num-envs must be at least 1, got 0"),
        ({"iterations": 0}, "--iterations must be at least 1"),
        ({"num_minibatches": 0}, "--num-minibatches must be at least 1"),
        ({"num_steps": -1}, "--num-steps must be 0"),
        (
            {"num_envs": 4, "num_steps": 10, "num_minibatches": 3},
            "must divide --num-envs x --num-steps = 4 x 10 = 40",
        ),
    ],
)
def test_bad_flags_fail_before_anything_is_built(kw: dict, message: str) -> None:
    made = []

    def env_fn(args: ppo.PPOArgs, B: object) -> None:
        made.append(B)
        raise AssertionError("the env was made")

    args = ppo.PPOArgs(**kw)
    with pytest.raises(trl.TimeRLError, match=re.escape(message)):
        ppo.check_args(args)
    build = ppo.build_fixed if args.num_steps > 0 else ppo.build
    with pytest.raises(trl.TimeRLError, match="must"):
        build(args, lambda v, pt: None, env_fn)
    assert not made


def test_good_flags_pass() -> None:
    ppo.check_args(ppo.PPOArgs())
    ppo.check_args(ppo.PPOArgs(num_envs=4, num_steps=128, update_epochs=4, num_minibatches=4))
    ppo.check_args(ppo.PPOArgs(num_envs=3, update_epochs=2, num_minibatches=5))  # episodic: t % M
