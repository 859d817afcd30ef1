"""Env runners on Ray: a batch of ``B`` gymnasium envs split over ``K`` actors.

:func:`ray_runners` makes the configuration; ``trl.env.make(..., runners=...)`` calls its
:meth:`RayRunners.gym_state`, which connects to the cluster at once (an unreachable address
fails there, before anything compiles) and returns a :class:`RemoteGymState`: the same
``bind``/``reset``/``step`` as the in-process state, so the env's UDFs, the program and its
schedule do not change. Actors are made when the program is compiled (``B`` is known then).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

import numpy as np

from timerl.dist.cluster import connect
from timerl.envs.common import static_num_envs
from timerl.envs.gym_env import episode_seed
from timerl.errors import DistributedError, EnvNotResetError, RTDefinitionError, RuntimeExecutionError
from timerl.symbolic import Sym

log = logging.getLogger("timerl.dist")


@dataclasses.dataclass(frozen=True)
class RayRunners:
    """Where and how many env runners (Ray actors) to use; see :func:`ray_runners`."""

    num_runners: int
    address: str | None = None
    cpus_per_runner: float | None = None
    spread: bool = True
    max_restarts: int = 3

    def gym_state(
        self, env_id: str, num_envs: Any, seed: int, kwargs: dict[str, Any], autoreset: bool
    ) -> RemoteGymState:
        """The remote state of a ``gym.*`` env (called by ``trl.env.make``)."""
        return RemoteGymState(self, env_id, num_envs, seed, kwargs, autoreset)


def ray_runners(
    num_runners: int,
    address: str | None = None,
    *,
    cpus_per_runner: float | None = None,
    spread: bool = True,
    max_restarts: int = 3,
) -> RayRunners:
    """Env runners on a Ray cluster, for ``trl.env.make("gym.<id>", num_envs=B, runners=...)``.

    :param num_runners: ``K`` actors; each steps ``B / K`` envs (``K`` must divide ``B``).
    :param address: the cluster (``"host:port"`` as ``ray start --head`` prints, ``"auto"``),
        or ``None`` for a Ray instance on this machine (started if none runs in this process).
    :param cpus_per_runner: CPUs Ray reserves per actor (``None``: Ray's default for actors,
        which reserves none while it runs, so more runners than cores fit).
    :param spread: place the actors over the cluster's nodes (Ray's ``SPREAD`` strategy).
    :param max_restarts: replacements of one runner in a row before the run fails.
    """
    if int(num_runners) < 1:
        raise DistributedError(f"ray_runners: num_runners must be at least 1, got {num_runners}")
    return RayRunners(int(num_runners), address, cpus_per_runner, spread, int(max_restarts))


@dataclasses.dataclass(frozen=True)
class RunnerStats:
    """What the runners of one env did so far."""

    num_runners: int
    env_steps: int  # env transitions returned to the program (B per step call)
    replacements: int  # runners lost and replaced
    truncated_envs: int  # envs whose episode a lost runner cut short (marked done)


class RemoteGymState:
    """``_GymState``'s interface over ``K`` Ray actors, each holding ``B / K`` envs.

    ``reset`` and ``step`` send each actor its slice (all ``K`` calls in flight at once) and
    concatenate the slices in env order. A runner that dies (``RayActorError``) is replaced by
    a new actor on the same slice, reset; at that step its envs are done (truncated: the
    previous observation without autoreset, the new episode's first one with it; reward 0).
    """

    array_io = "numpy"

    def __init__(
        self,
        config: RayRunners,
        env_id: str,
        num_envs: Any,
        seed: int,
        kwargs: dict[str, Any],
        autoreset: bool,
    ) -> None:
        self.ray = connect(config.address)  # fails here, before anything compiles
        from ray.exceptions import RayActorError

        self._lost = RayActorError
        self.config = config
        self.env_id = env_id
        self.num_envs = num_envs
        self.seed = seed
        self.kwargs = kwargs
        self.autoreset = autoreset
        self.batched = isinstance(num_envs, Sym)
        self.n = 0
        self.actors: list[Any] = []
        self.placement: list[Mapping[str, Any]] = []  # per runner: pid, node, envs (at bind)
        self.slices: list[slice] = []
        self.last_obs: np.ndarray | None = None
        self._env_steps = 0
        self._replacements = 0
        self._truncated = 0
        self._episode_seed = seed
        self._actor_cls: Any = None
        # CartPoleVectorEnv with autoreset: the head draws restarted episodes' states as the
        # one-process vector env would (one generator for all B envs); see timerl.dist.actor
        self._reset_rng: np.random.Generator | None = None
        self._reset_bounds: tuple[float, float] = (0.0, 0.0)
        self._restarted: list[Any] = []

    # -- lifecycle ---------------------------------------------------------------------------
    def bind(self, bounds: Mapping[Sym, int]) -> None:
        n = static_num_envs(self.env_id, self.num_envs, bounds)
        k = self.config.num_runners
        if k > n or n % k:
            raise RTDefinitionError(
                f"env {self.env_id}: {k} runners cannot split {n} envs evenly (num_runners must "
                f"divide num_envs and be at most num_envs)"
            )
        if self.actors and self.n == n:
            return
        self.close()
        self.n = n
        per = n // k
        self.slices = [slice(j * per, (j + 1) * per) for j in range(k)]
        self.actors = [self._new_actor(sl) for sl in self.slices]
        self.placement = self.ray.get([a.info.remote() for a in self.actors])  # env errors now
        log.info("env %s: %d runners of %d envs each: %s", self.env_id, k, per, self.placement)

    def _new_actor(self, sl: slice) -> Any:
        if self._actor_cls is None:
            from timerl.dist.actor import Runner

            self._actor_cls = self.ray.remote(Runner)
        opts: dict[str, Any] = {"max_restarts": 0}
        if self.config.cpus_per_runner is not None:
            opts["num_cpus"] = self.config.cpus_per_runner
        if self.config.spread:
            opts["scheduling_strategy"] = "SPREAD"
        return self._actor_cls.options(**opts).remote(
            self.env_id, self.n, sl.start, sl.stop - sl.start, self.seed, self.kwargs, self.autoreset
        )

    def close(self) -> None:
        """Kill the actors (a later ``bind`` makes new ones)."""
        for a in self.actors:
            try:
                self.ray.kill(a)
            except Exception:  # already gone
                pass
        self.actors = []

    @property
    def stats(self) -> RunnerStats:
        return RunnerStats(self.config.num_runners, self._env_steps, self._replacements, self._truncated)

    # -- the env ------------------------------------------------------------------------------
    def reset(self, point: dict[str, int]) -> np.ndarray:
        self._episode_seed = episode_seed(self.seed, point)
        outs = self._gather("reset", [(point,)] * len(self.actors))
        for j, out in enumerate(outs):
            tries = 0
            while out is None:  # lost: a new runner resets as the lost one would have
                self._give_up_after(j, tries)
                self._replace(j)
                out = self._gather_one(self.actors[j].reset.remote(point))
                tries += 1
            outs[j] = out
        obs = np.concatenate(outs)
        self.last_obs = obs
        self._restarted = [None] * len(self.actors)
        bounds = self._gather_one(self.actors[0].head_resets.remote()) if self.autoreset else None
        self._reset_rng = None
        if bounds is not None:
            from gymnasium.utils import seeding

            self._reset_rng, _ = seeding.np_random(self._episode_seed)
            self._reset_bounds = bounds
            self._reset_rng.uniform(*bounds, size=(obs.shape[-1], self.n))  # the first states' draw
        return obs if self.batched else obs[0]

    def step(self, action: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self.last_obs is None:
            raise EnvNotResetError(f"env {self.env_id}: step before reset")
        action = np.asarray(action)
        if not self.batched:
            action = action[None]
        outs = self._gather(
            "step", [(action[sl], rs) for sl, rs in zip(self.slices, self._restarted, strict=True)]
        )
        for j, out in enumerate(outs):
            if out is None:
                outs[j] = self._truncate(j)
        obs = np.concatenate([o[0] for o in outs])
        rew = np.concatenate([o[1] for o in outs]).astype(np.float32, copy=False)
        done = np.concatenate([o[2] for o in outs])
        self._restarted = [None] * len(self.actors)
        if self._reset_rng is not None and done.any():
            obs = self._draw_restarts(obs, done)
        self.last_obs = obs
        self._env_steps += self.n
        if not self.batched:
            return obs[0], rew[0], done[0]
        return obs, rew, done

    def _draw_restarts(self, obs: np.ndarray, done: np.ndarray) -> np.ndarray:
        """The first states of the episodes that restart at this step, drawn for all ``B`` envs
        at once (as ``_reset_in_place`` does in one process); each runner installs its columns
        before its next step."""
        assert self._reset_rng is not None
        states = self._reset_rng.uniform(*self._reset_bounds, size=(obs.shape[-1], int(done.sum())))
        full = np.zeros((obs.shape[-1], self.n))
        full[:, done] = states
        obs = obs.copy()
        obs[done] = states.T.astype(obs.dtype)
        for j, sl in enumerate(self.slices):
            if done[sl].any():
                self._restarted[j] = (done[sl], full[:, sl][:, done[sl]])
        return obs

    # -- faults -------------------------------------------------------------------------------
    def _gather(self, method: str, args: list[tuple[Any, ...]]) -> list[Any]:
        """Call ``method`` on every actor at once; a lost actor's entry is None."""
        refs = [getattr(a, method).remote(*xs) for a, xs in zip(self.actors, args, strict=True)]
        try:
            return list(self.ray.get(refs))
        except self._lost:
            return [self._gather_one(r) for r in refs]

    def _gather_one(self, ref: Any) -> Any:
        try:
            return self.ray.get(ref)
        except self._lost:
            return None

    def _replace(self, j: int) -> None:
        self._replacements += 1
        sl = self.slices[j]
        log.warning(
            "env %s: runner %d (envs %d..%d) was lost; replacing it (replacement %d)",
            self.env_id,
            j,
            sl.start,
            sl.stop - 1,
            self._replacements,
        )
        try:
            self.ray.kill(self.actors[j])
        except Exception:  # already gone
            pass
        self.actors[j] = self._new_actor(sl)

    def _truncate(self, j: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Replace lost runner ``j`` mid-episode: its envs are done at this step."""
        sl = self.slices[j]
        keep = None if self.autoreset or self.last_obs is None else self.last_obs[sl]
        tries = 0
        while True:
            self._give_up_after(j, tries)
            self._replace(j)
            seed = self._episode_seed + 104729 * self._replacements
            obs = self._gather_one(self.actors[j].restart.remote(seed, keep))
            tries += 1
            if obs is not None:
                count = sl.stop - sl.start
                self._truncated += count
                return obs, np.zeros(count, np.float32), np.ones(count, bool)

    def _give_up_after(self, j: int, tries: int) -> None:
        if tries < self.config.max_restarts:
            return
        sl = self.slices[j]
        raise DistributedError(
            f"env {self.env_id}: runner {j} (envs {sl.start}..{sl.stop - 1}) was lost "
            f"{self.config.max_restarts} times in a row"
        )
