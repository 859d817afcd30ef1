"""Agents written as timerl programs, for scripts and other agents to build on.

- :mod:`timerl.agents.ppo`: PPO with GAE (``PPOArgs``, ``build``, ``build_fixed`` and the
  loss pieces), the program of ``examples/ppo.py``, ``examples/ppo_looptune.py`` and
  ``examples/release.py``.
"""

from timerl.agents import ppo as ppo

__all__ = ["ppo"]
