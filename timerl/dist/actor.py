"""The body of one runner actor: a slice of a batch of gymnasium envs.

A runner holds envs ``offset .. offset + count - 1`` of a batch of ``total`` and behaves as
those envs would inside one ``total``-env vector env, so a run split over runners observes
what the one-process run observes:

- a synchronous vector env seeds env ``j`` with ``seed + j``: the slice resets with
  ``seed + offset``;
- gymnasium's NumPy ``CartPoleVectorEnv`` draws every env's first state from one generator:
  the slice replays the ``total``-env draw and keeps its columns. With autoreset it also draws
  the states of restarted episodes, for the envs done at a step together: the head draws them
  (:class:`timerl.dist.runners.RemoteGymState`) and sends each runner its columns with the
  next step's actions (``head_resets``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from timerl.envs.gym_env import _GymState, _resettable_in_place, _same_step_mode


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

    @property
    def head_resets(self) -> bool:
        """Whether the head draws the states of restarted episodes (see the module doc)."""
        return self.autoreset and _resettable_in_place(self.venv) and not _same_step_mode(self.venv)

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
        """Where the runner runs: process id, Ray node id, its envs (first, count)."""
        import ray

        node = ray.get_runtime_context().get_node_id()
        return {"pid": os.getpid(), "node": node, "envs": (self.state.offset, self.state.n)}

    def head_resets(self) -> tuple[float, float] | None:
        """The reset bounds ``(low, high)`` when the head draws restarted episodes' states
        (after a reset), else None."""
        venv = self.state.venv
        return (venv.low, venv.high) if self.state.head_resets else None

    def reset(self, point: dict[str, int]) -> np.ndarray:
        return self.state.reset(point)

    def step(
        self, action: np.ndarray, restarted: tuple[np.ndarray, np.ndarray] | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Step the slice; ``restarted``: ``(mask, states)``, the head's draws for the envs
        that restarted at the last step (``head_resets``), installed first."""
        if restarted is not None:
            mask, states = restarted
            self.state.venv.state[:, mask] = states
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
