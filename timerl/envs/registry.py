"""Environment factory: the prefix of the id picks the family."""

from __future__ import annotations

from typing import Any

from timerl.errors import TimeRLError


def make(env_id: str, num_envs: Any = 1, seed: int = 0, **kwargs: Any) -> Any:
    """Create an environment.

    - ``"gym.CartPole-v1"``: a gymnasium vector env on the host;
    - ``"brax.inverted_pendulum"``: a brax env stepped as jitted, vmapped JAX functions
      (extra keyword arguments: ``backend="spring"``, ``max_steps=1000``, and the brax
      env's own constructor arguments);
    - ``"gymnax.CartPole-v1"``: a gymnax env (JAX-native) stepped as jitted, vmapped JAX
      functions (extra keyword arguments: ``autoreset=False``, fields of the env's
      ``EnvParams`` such as ``max_steps_in_episode``, and gymnax's constructor arguments);
    - ``"looptune.mm"``: LoopTune's loop-nest scheduling of matmul (extra keyword arguments:
      ``split="train"|"test"|"all"``, ``measurer="tvm"|"analytic"``, ``max_loops=16``,
      ``episode_len=10``, ``problems=None``, ``peak=None``, ``cache_dir=None``,
      ``farm=None``: a measurement farm, ``trl.dist.ray_farm(...)``);
    - ``"tiramisu.benchmarks"`` / ``"tiramisu.random"`` / ``"tiramisu.<benchmark>"``: the
      Tiramisu-style polyhedral loop-optimisation env (extra keyword arguments:
      ``split="train"|"test"``, ``episode_len=16``, ``programs=None``, ``num_programs=64``,
      ``threads=None``, ``cache_dir=None``, ``measurer=None``, ``farm=None``).

    ``num_envs`` is the bound symbol of the batch dim (``B``) or an int. ``agents=S`` (gym and
    gymnax): ``B`` envs per agent along the agent dim whose bound is ``S`` (many agents in one
    program, ``trl.param(agents=...)``); agent ``k``'s envs are those of a one-agent env with
    seed ``seed + k`` (or ``seed[k]`` with one seed per agent).

    ``runners=trl.dist.ray_runners(num_runners=K, address=...)`` (``gym.*``): the ``B`` envs
    are split over ``K`` Ray actors, ``B / K`` each; the program does not change and a run
    observes what the one-process run observes (``docs/distributed.md``).
    """
    family, _, name = env_id.partition(".")
    if kwargs.get("agents") is not None and family not in ("gym", "gymnax"):
        raise TimeRLError(
            f"environment {env_id!r}: agents=... (one set of envs per agent) is supported for 'gym.*' and "
            "'gymnax.*' environments"
        )
    if kwargs.get("runners") is not None and family != "gym":
        raise TimeRLError(
            f"environment {env_id!r}: runners=... (envs on Ray actors) is supported for 'gym.*' environments"
        )
    if kwargs.get("farm") is not None and family not in ("looptune", "tiramisu"):
        raise TimeRLError(
            f"environment {env_id!r}: farm=... (a measurement farm) is supported for 'looptune.*' and "
            "'tiramisu.*' environments (RELEASE: farm.release_measurer())"
        )
    if family == "gym" and name:
        from timerl.envs.gym_env import GymEnv

        return GymEnv(name, num_envs, seed=seed, **kwargs)
    if family == "brax" and name:
        from timerl.envs.brax_env import BraxEnv

        return BraxEnv(name, num_envs, seed=seed, **kwargs)
    if family == "gymnax" and name:
        from timerl.envs.gymnax_env import GymnaxEnv

        return GymnaxEnv(name, num_envs, seed=seed, **kwargs)
    if family == "looptune" and name:
        from timerl.envs.looptune.env import LoopTuneEnv

        return LoopTuneEnv(name, num_envs, seed=seed, **kwargs)
    if family == "tiramisu" and name:
        from timerl.envs.tiramisu.env import TiramisuEnv

        return TiramisuEnv(name, num_envs, seed=seed, **kwargs)
    raise TimeRLError(
        f"unknown environment id {env_id!r}: use 'gym.<gymnasium id>' (e.g. 'gym.CartPole-v1') or "
        "'brax.<brax env name>' (e.g. 'brax.inverted_pendulum') or 'gymnax.<gymnax id>' (e.g. "
        "'gymnax.CartPole-v1') or 'looptune.<dataset>' (e.g. 'looptune.mm') or 'tiramisu.<set>' "
        "(e.g. 'tiramisu.benchmarks')"
    )
