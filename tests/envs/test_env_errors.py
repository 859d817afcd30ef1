"""The errors a user meets first when naming an environment: what went wrong and what ids look like."""

from __future__ import annotations

import pytest

import timerl as trl


def test_unknown_gymnasium_id_names_it_and_the_id_forms() -> None:
    with pytest.raises(
        trl.TimeRLError, match=r"gymnasium cannot make 'CartPol-v1'.*Ids look like 'CartPole-v1'"
    ) as info:
        trl.env.make("gym.CartPol-v1", num_envs=2)
    assert "gymnax.<id>" in str(info.value)
    assert info.value.__cause__ is not None  # gymnasium's own error, chained


def test_unknown_family_lists_the_families() -> None:
    with pytest.raises(trl.TimeRLError, match="unknown environment id 'atari.Pong'.*'gym.<gymnasium id>'"):
        trl.env.make("atari.Pong", num_envs=2)
