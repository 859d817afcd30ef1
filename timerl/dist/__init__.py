"""Distributed execution on Ray, behind a small interface (``pip install -e ".[dist]"``).

``trl.env.make("gym.CartPole-v1", num_envs=B, runners=trl.dist.ray_runners(num_runners=K))``
splits the ``B`` envs over ``K`` Ray actors (runners); the program and its schedule do not
change. Ray is imported only when a runner set is made, so timerl works without it.
See ``docs/distributed.md``.
"""

from __future__ import annotations

from timerl.dist.cluster import connect
from timerl.dist.runners import RayRunners, RunnerStats, ray_runners
from timerl.errors import DistributedError

__all__ = ["DistributedError", "RayRunners", "RunnerStats", "connect", "ray_runners"]
