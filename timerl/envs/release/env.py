"""RELEASE's search environment for RT programs: agents walk a knob space, rewarded by
the cost model.

``KnobEnv(space, model, num_envs=B, starts=[...], episode_len=10)`` has the interface of
:class:`~timerl.envs.gym_env.GymEnv` (``reset(domain)``, ``step(action)``), so the PPO
program of ``examples/ppo.py`` runs on it unchanged, with ``B`` agents along the batch dim:

- **state** (RELEASE §4.1): the current configuration, each knob's index over its last
  index (:meth:`.KnobSpace.normalised`), float32 ``(num_knobs,)``;
- **action**: one direction per knob, ``MultiDiscrete([3] * num_knobs)``: 0 decrement,
  1 stay, 2 increment (:meth:`.KnobSpace.move`: clipped to the knob's range; a move
  outside the register-tile constraint leaves the configuration unchanged);
- **reward**: the cost model's prediction for the configuration reached (GFLOPS over the
  best measured: :class:`.CostModel`), one batched prediction per step for all agents;
- **episode**: ``episode_len`` steps; ``done`` then stays true until the next reset.

Each reset starts agent ``e`` from ``starts[e % len(starts)]`` (the tuner passes the best
measured configurations) with probability ``1 - explore``, else from a random
configuration. Every configuration reached and its reward is appended to
:attr:`KnobEnv.trajectory` (the search trajectory ``s_Θ`` the samplers pick from).

One compiled program can serve every tuning round of a layer: :meth:`KnobEnv.on_reset`
hooks the resets (where :class:`.rounds.ProgramRounds` pauses the program between
rounds) and :meth:`KnobEnv.retarget` swaps in the refitted cost model, the new start
configurations and a new seed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from timerl.envs.common import static_num_envs
from timerl.envs.gym_env import GymEnv
from timerl.envs.release.cost_model import CostModel
from timerl.envs.release.space import Config, KnobSpace
from timerl.errors import EnvNotResetError, RuntimeExecutionError, TimeRLError
from timerl.symbolic import Sym

DECREMENT, STAY, INCREMENT = 0, 1, 2


class _KnobState:
    """The ``B`` agents' configurations (a ``GymEnv`` state object: ``bind``, ``reset``, ``step``)."""

    def __init__(
        self,
        env_id: str,
        space: KnobSpace,
        model: CostModel,
        num_envs: Any,
        starts: Sequence[Config],
        episode_len: int,
        explore: float,
        seed: int,
    ) -> None:
        self.env_id, self.space, self.model = env_id, space, model
        self.num_envs = num_envs
        self.batched = isinstance(num_envs, Sym)
        self.starts = list(starts)
        self.episode_len, self.explore = episode_len, explore
        self.rng = np.random.default_rng(seed)
        self.n = 0
        self.configs: list[Config] = []
        self.steps = 0
        self.trajectory: list[tuple[Config, float]] = []
        self.before_reset: Callable[[dict[str, int]], None] | None = None

    def bind(self, bounds: Mapping[Sym, int]) -> None:
        self.n = static_num_envs(self.env_id, self.num_envs, bounds)

    def _obs(self) -> np.ndarray:
        obs = self.space.normalised(self.configs)
        return obs if self.batched else obs[0]

    def reset(self, point: dict[str, int]) -> np.ndarray:
        if self.before_reset is not None:
            self.before_reset(point)
        self.configs = []
        for e in range(self.n):
            if self.starts and self.rng.random() >= self.explore:
                self.configs.append(self.starts[e % len(self.starts)])
            else:
                self.configs.append(self.space.random(self.rng))
        self.steps = 0
        return self._obs()

    def step(self, action: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if not self.configs:
            raise EnvNotResetError(f"env {self.env_id}: step before reset")
        acts = np.asarray(action).reshape(self.n, len(self.space.knobs))
        if acts.min() < DECREMENT or acts.max() > INCREMENT:
            raise RuntimeExecutionError(
                f"env {self.env_id}: directions must be 0, 1 or 2, got {acts.tolist()}"
            )
        rew = np.zeros(self.n, np.float32)
        if self.steps < self.episode_len:
            self.configs = [self.space.move(c, a - 1) for c, a in zip(self.configs, acts, strict=True)]
            rew = self.model.predict(self.configs).astype(np.float32)
            self.trajectory.extend(zip(self.configs, rew.tolist(), strict=True))
            self.steps += 1
        done = np.full(self.n, self.steps >= self.episode_len)
        obs = self._obs()
        if not self.batched:
            return obs, rew[0], done[0]
        return obs, rew, done


class KnobEnv(GymEnv):
    """RELEASE's knob-space walk in RT programs (see the module doc)."""

    def __init__(
        self,
        space: KnobSpace,
        model: CostModel,
        num_envs: Any,
        starts: Sequence[Config] = (),
        episode_len: int = 10,
        explore: float = 0.5,
        seed: int = 0,
    ) -> None:
        import gymnasium as gym

        if episode_len < 1:
            raise TimeRLError(f"release knob env: episode_len must be >= 1, got {episode_len}")
        if not 0.0 <= explore <= 1.0:
            raise TimeRLError(f"release knob env: explore must be in [0, 1], got {explore}")
        env_id = f"release.{space.layer.name}"
        k = len(space.knobs)
        self.space = space
        self.obs_space = gym.spaces.Box(0.0, 1.0, (k,), np.float32)
        self.action_space = gym.spaces.MultiDiscrete([3] * k)
        state = _KnobState(env_id, space, model, num_envs, starts, episode_len, explore, seed)
        self._init_wrapper(env_id, num_envs, state)

    @property
    def trajectory(self) -> list[tuple[Config, float]]:
        """Every (configuration reached, reward) so far, in order."""
        return self._state.trajectory

    def retarget(self, model: CostModel, starts: Sequence[Config], seed: int) -> None:
        """Between tuning rounds of one compiled program: reward with ``model`` (e.g. the
        refitted cost model), start episodes from ``starts`` and reseed the env's random
        stream with ``seed`` (as a fresh ``KnobEnv(space, model, B, starts, seed=seed)``)."""
        st = self._state
        st.model, st.starts, st.rng = model, list(starts), np.random.default_rng(seed)

    def on_reset(self, fn: Callable[[dict[str, int]], None] | None) -> None:
        """Call ``fn(point)`` at the start of every reset (every episode), before the agents'
        start configurations are drawn, with the reset's point (e.g. ``{"i": 3}``): the hook
        where a host pauses the program between tuning rounds (:mod:`.rounds`)."""
        self._state.before_reset = fn
