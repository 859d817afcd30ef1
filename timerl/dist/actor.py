"""The body of one runner actor: a slice of a batch of gymnasium envs.

A runner holds envs ``offset .. offset + count - 1`` of a batch of ``total`` and behaves as
those envs would inside one ``total``-env vector env, so a run split over runners observes
what the one-process run observes:

- a synchronous vector env seeds env ``j`` with ``seed + j``: the slice resets with
  ``seed + offset``;
- gymnasium's NumPy ``CartPoleVectorEnv`` draws every env's first state from one generator:
  the slice replays the ``total``-env draw and keeps its columns.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from timerl.envs.gym_env import _GymState, _resettable_in_place


class SliceState(_GymState):
    """A :class:`_GymState` over envs ``offset .. offset + count - 1`` of ``total``."""

    def __init__(
        self,
        env_id: str,
        total: int,
        offset: int,
        count: int,
        seed: int,
        kwargs: dict[str, Any],
        autoreset: bool,
    ) -> None:
        super().__init__(env_id, count, seed, kwargs, autoreset)
        self.batched = True  # outputs keep the env dim (the head concatenates slices)
        self.total = total
        self.offset = offset

    def reset(self, point: dict[str, int]) -> np.ndarray:
        return self.reset_seeded(self.episode_seed(point))

    def reset_seeded(self, seed: int) -> np.ndarray:
        """Reset every env of the slice as the ``total``-env vector env reset with ``seed``."""
        venv = self.venv
        if _resettable_in_place(venv):
            from gymnasium.utils import seeding

            venv.reset(seed=seed)
            rng, _ = seeding.np_random(seed)
            full = rng.uniform(low=venv.low, high=venv.high, size=(venv.state.shape[0], self.total))
            venv.state = np.ascontiguousarray(full[:, self.offset : self.offset + self.n])
            # later draws (autoreset) differ per slice; no two slices share a stream
            venv.np_random = np.random.default_rng([seed, self.offset])
            obs = venv.state.T.astype(np.float32)
        else:
            obs, _ = venv.reset(seed=seed + self.offset)
        self.done = np.zeros(self.n, dtype=bool)
        self.last_obs = np.asarray(obs)
        return self.last_obs


class Runner:
    """What a Ray actor runs (``ray.remote(Runner)``): the slice's envs, stepped on request."""

    def __init__(
        self,
        env_id: str,
        total: int,
        offset: int,
        count: int,
        seed: int,
        kwargs: dict[str, Any],
        autoreset: bool,
    ) -> None:
        self.state = SliceState(env_id, total, offset, count, seed, kwargs, autoreset)
        self.state.bind({})
        self.steps = 0

    def info(self) -> Mapping[str, Any]:
        return {"pid": os.getpid(), "envs": (self.state.offset, self.state.n)}

    def reset(self, point: dict[str, int]) -> np.ndarray:
        return self.state.reset(point)

    def step(self, action: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        out = self.state.step(action)
        self.steps += 1
        return out

    def restart(self, seed: int, last_obs: np.ndarray | None) -> np.ndarray:
        """Start in place of a lost runner: reset with ``seed``. Without autoreset the envs
        stay done until the program's next reset, repeating ``last_obs`` (reward 0)."""
        obs = self.state.reset_seeded(seed)
        if not self.state.autoreset and last_obs is not None:
            self.state.done[:] = True
            self.state.last_obs = np.asarray(last_obs)
            return self.state.last_obs
        return obs
