"""Without Ray (or where it is not installed), asking for runners says how to install it, and
runners are refused for env families that do not support them."""

from __future__ import annotations

import sys

import pytest

import timerl as trl


def test_without_ray_the_error_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    with trl.Context(dims=("b", "t")) as ((b, B), (t, T)):
        with pytest.raises(trl.dist.DistributedError, match=r'pip install -e "\.\[dist\]"'):
            trl.env.make("gym.CartPole-v1", num_envs=B, runners=trl.dist.ray_runners(2))
        with pytest.raises(trl.TimeRLError, match="supported for 'gym"):
            trl.env.make("gymnax.CartPole-v1", num_envs=B, runners=trl.dist.ray_runners(2))
        with pytest.raises(trl.TimeRLError, match="num_runners must be at least 1"):
            trl.dist.ray_runners(0)


def test_import_timerl_does_not_import_ray() -> None:
    import subprocess

    code = "import sys, timerl, timerl.dist; assert 'ray' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_farm_arguments_are_checked_without_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    from timerl.dist.farm import farm_from_flags

    monkeypatch.setitem(sys.modules, "ray", None)
    assert farm_from_flags("", 2) is None  # no --ray-address: no farm
    assert farm_from_flags("local", 0) == trl.dist.ray_farm(None, None)
    with pytest.raises(trl.TimeRLError, match="num_workers must be at least 1"):
        trl.dist.ray_farm(num_workers=0)
    with trl.Context(dims=("b", "t")) as ((b, B), (t, T)):
        with pytest.raises(trl.TimeRLError, match="supported for 'looptune"):
            trl.env.make("gym.CartPole-v1", num_envs=B, farm=trl.dist.ray_farm())
        with pytest.raises(trl.dist.DistributedError, match=r'pip install -e "\.\[dist\]"'):
            trl.env.make("looptune.mm", num_envs=B, measurer="analytic", farm=trl.dist.ray_farm())
