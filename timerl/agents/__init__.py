"""Agents written as timerl programs, for scripts and other agents to build on.

- :mod:`timerl.agents.ppo`: PPO with GAE (``PPOArgs``, ``build``, ``build_fixed`` and the
  loss pieces), the program of ``examples/ppo.py``, ``examples/ppo_looptune.py`` and
  ``timerl.envs.release.study``.
- :mod:`timerl.agents.dqn`: Double DQN with prioritised replay (``DQNArgs``, ``PrioritizedReplay``,
  ``ReplayUDFs``, ``build``), the program of ``examples/dqn_looptune.py``.
- :mod:`timerl.agents.tiramisu`: the Tiramisu-style loop-optimisation agent (``TiramisuArgs``,
  the GATv2 actor-critic ``GATPolicy``, ``build``, ``greedy_rollouts``, ``latest_weights``),
  the program of ``examples/ppo_tiramisu.py`` and ``timerl.envs.tiramisu.evaluate``. Import it
  as ``from timerl.agents import tiramisu`` (not loaded by ``import timerl``: it needs islpy's
  polyhedral environment).
"""

from timerl.agents import ppo as ppo

__all__ = ["ppo"]
