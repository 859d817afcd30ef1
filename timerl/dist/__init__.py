"""Distributed execution on Ray, behind a small interface (``pip install -e ".[dist]"``).

``trl.env.make("gym.CartPole-v1", num_envs=B, runners=trl.dist.ray_runners(num_runners=K))``
splits the ``B`` envs over ``K`` Ray actors (runners); the program and its schedule do not
change. ``trl.env.make("looptune.mm", ..., farm=trl.dist.ray_farm(address, num_workers=N))``
measures on ``N`` Ray workers (a measurement farm, also for ``tiramisu.*`` and RELEASE).
Ray is imported only when runners or a farm start, so timerl works without it.
See ``docs/distributed.md``.
"""

from __future__ import annotations

from timerl.dist.cluster import connect
from timerl.dist.farm import Farm, FarmStats, RayFarm, ray_farm
from timerl.dist.runners import RayRunners, RunnerStats, ray_runners
from timerl.errors import DistributedError

__all__ = [
    "DistributedError",
    "Farm",
    "FarmStats",
    "RayFarm",
    "RayRunners",
    "RunnerStats",
    "connect",
    "ray_farm",
    "ray_runners",
]
