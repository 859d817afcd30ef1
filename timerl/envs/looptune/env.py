"""LoopTune as a timerl environment: ``trl.env.make("looptune.mm", num_envs=B, ...)``.

Datasets (:mod:`.dataset`): ``looptune.mm`` (matmul, the paper's), ``looptune.bmm``,
``looptune.conv1d``, ``looptune.conv2d``; ``problems=[...]`` may mix kernels. The
observation has the same layout for every kernel, so a policy trained on one runs on all.

Each of the ``B`` envs holds one :class:`~timerl.envs.looptune.ir.LoopState`. Reset
picks a problem per env and returns the untiled nest's :func:`~.ir.features`, flattened
to ``(max_loops * 20,)``; ``step(action)`` applies one of the 10 actions per env and
rewards ``(GFLOPS(S') - GFLOPS(S)) / peak`` (the paper's formula). An invalid action is
a no-op with reward exactly 0 (the schedule, hence its cached GFLOPS, is unchanged). An
episode is ``episode_len`` actions; then the env is done and stays done (reward 0, the
last observation repeated) until the next reset, as in ``GymEnv``, so the dynamic bound
``T: d`` ends after ``episode_len`` steps.

Problems: with ``split="train"``, reset at point ``k`` (the sum of the reset point's
coordinates other than the batch dim, as in ``GymEnv``) draws the ``B`` problems with
``numpy.random.default_rng(seed + 7919 * k)``; with ``split="test"`` env ``e`` gets
test problem ``(k * B + e) mod len(test)``, so ``iterations x B`` enumerates the test
set in order. ``problems=[...]`` replaces the split's list. ``split="all"`` uses every
problem of the dataset.

The ``B`` envs are measured one after the other in this process: two measuring
processes at once spoil the timings on a small machine (``farm=`` measures them at once on
a measurement farm's workers, one pinned core each). Every finished episode is
appended to :attr:`LoopTuneEnv.history` (an :class:`EpisodeRecord`).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from timerl.envs.common import pick_batch, static_num_envs
from timerl.envs.demos import DemoBufferFn, Demonstrations, buffer_rows
from timerl.envs.gym_env import GymEnv
from timerl.envs.looptune import dataset as ds
from timerl.envs.looptune.analytic import AnalyticCostModel
from timerl.envs.looptune.ir import (
    ACTIONS,
    MAX_LOOPS,
    NUM_FEATURES,
    LoopState,
    Problem,
    apply_action,
    features,
    initial_state,
    is_valid,
)
from timerl.envs.looptune.measure import Measurer, machine_peak, make_measurer
from timerl.errors import EnvNotResetError, RuntimeExecutionError, TimeRLError
from timerl.pdg.ops import DType
from timerl.rt.tensor import RecurrentTensor
from timerl.rt.udf import UDFFn, udf
from timerl.symbolic import Sym

log = logging.getLogger("timerl.envs.looptune")

SPLITS = ("train", "test", "all")
REWARDS = ("step", "final", "best", "log")
DEFAULT_NOISE = 0.03  # reward="log": relative gains below 3 % are taken for timing noise


@dataclass(frozen=True)
class EpisodeRecord:
    """One finished episode of one env (GFLOPS as measured by the env's measurer)."""

    reset_point: int  # k: the reset's point (see the module doc)
    env_index: int  # e: the env within the batch
    problem: Problem
    initial_key: str
    final_key: str
    best_key: str
    initial_gflops: float
    final_gflops: float
    best_gflops: float
    actions: tuple[int, ...]

    @property
    def speedup(self) -> float:
        """Final over initial GFLOPS (0 when the initial nest failed)."""
        return self.final_gflops / self.initial_gflops if self.initial_gflops > 0 else 0.0


class _Episode:
    """Mutable per-env bookkeeping of the running episode."""

    def __init__(self, k: int, e: int, state: LoopState, g: float) -> None:
        self.k, self.e = k, e
        self.initial, self.initial_g = state, g
        self.state, self.g = state, g
        self.best, self.best_g = state, g
        self.best_step = 0  # actions that reached ``best``
        self.ref_g = g  # reward="log": the best GFLOPS rewarded so far
        self.actions: list[int] = []

    def record(self) -> EpisodeRecord:
        return EpisodeRecord(
            self.k,
            self.e,
            self.initial.problem,
            self.initial.key,
            self.state.key,
            self.best.key,
            self.initial_g,
            self.g,
            self.best_g,
            tuple(self.actions),
        )


class _LoopTuneState:
    """The ``B`` episodes (a ``GymEnv`` state object: ``bind``, ``reset``, ``step``)."""

    def __init__(
        self,
        env_id: str,
        num_envs: Any,
        seed: int,
        problems: list[Problem],
        in_order: bool,
        measurer: Measurer,
        peak: float,
        max_loops: int,
        episode_len: int,
        reward: str = "step",
        noise: float = DEFAULT_NOISE,
    ) -> None:
        self.env_id = env_id
        self.reward = reward
        self.noise = noise
        self.num_envs = num_envs
        self.seed = int(seed)
        self.problems = problems
        self.in_order = in_order
        self.measurer = measurer
        self.peak = float(peak)
        self.max_loops = max_loops
        self.episode_len = episode_len
        self.batched = isinstance(num_envs, Sym)
        self.n = 0
        self.episodes: list[_Episode] = []
        self.steps = 0
        self.history: list[EpisodeRecord] = []
        self.last_obs: np.ndarray | None = None
        # per problem: the actions to the fastest measured schedule of any finished episode
        self.demos = Demonstrations()
        self._replays: dict[tuple, tuple[np.ndarray, ...]] = {}

    def bind(self, bounds: Mapping[Sym, int]) -> None:
        self.n = static_num_envs(self.env_id, self.num_envs, bounds)

    def demo_buffer(
        self, slots: int, min_speedup: float, part: int = 0, parts: int = 1
    ) -> tuple[np.ndarray, ...]:
        """Buffer imitation's batch (:func:`timerl.envs.demos.buffer_rows`): per problem of
        this part, the states along its kept demonstration (if it reaches ``min_speedup``),
        replayed from the untuned nest without measuring; per row the observation, the
        demonstration's action and a weight (1.0 on a demonstration step, 0.0 on an empty
        row)."""

        def rows_of(p: int | None, per: int) -> tuple[np.ndarray, ...]:
            problem = self.problems[0 if p is None else p]
            acts = () if p is None else self.demos.actions(problem.name, min_speedup)[:per]
            key = (problem.name, acts, per)
            if key not in self._replays:
                self._replays[key] = self._replay(problem, acts, per)
            return self._replays[key]

        return buffer_rows(len(self.problems), slots, part, parts, rows_of)

    def _replay(self, problem: Problem, actions: Sequence[int], per: int) -> tuple[np.ndarray, ...]:
        obs = np.zeros((per, self.max_loops * NUM_FEATURES), np.float32)
        acts = np.zeros(per, np.int64)
        weight = np.zeros(per, np.float32)
        s = initial_state(problem)
        obs[:] = features(s, self.max_loops).reshape(-1)
        for j, a in enumerate(actions):
            obs[j] = features(s, self.max_loops).reshape(-1)
            acts[j], weight[j] = a, 1.0
            s = apply_action(s, a, self.max_loops)
        return obs, acts, weight

    def _pick(self, k: int) -> list[Problem]:
        return pick_batch(self.problems, k, self.n, self.in_order, self.seed)

    def _obs(self) -> np.ndarray:
        obs = np.stack([features(ep.state, self.max_loops).reshape(-1) for ep in self.episodes])
        self.last_obs = obs
        return obs if self.batched else obs[0]

    def _prefetch(self, states: list[LoopState]) -> None:
        """Measure ``states`` together where the measurer takes batches (a farm's: they go
        out at once); the per-env loop then reads them from its cache."""
        many = getattr(self.measurer, "gflops_many", None)
        if many is not None and len(states) > 1:
            many(states)

    def reset(self, point: dict[str, int]) -> np.ndarray:
        k = sum(point.values())
        self.episodes = []
        starts = [initial_state(p) for p in self._pick(k)]
        self._prefetch(starts)
        for e, s in enumerate(starts):
            self.episodes.append(_Episode(k, e, s, self.measurer.gflops(s)))
        self.steps = 0
        return self._obs()

    def step(self, action: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if not self.episodes or self.last_obs is None:
            raise EnvNotResetError(f"env {self.env_id}: step before reset")
        acts = np.asarray(action).reshape(-1)
        if acts.shape[0] != self.n:
            raise RuntimeExecutionError(f"env {self.env_id}: got {acts.shape[0]} actions for {self.n} envs")
        was_done = self.steps >= self.episode_len
        rew = np.zeros(self.n, np.float32)
        if not was_done:
            last = self.steps + 1 == self.episode_len
            nexts = []
            for e, ep in enumerate(self.episodes):
                a = int(acts[e])
                if not 0 <= a < len(ACTIONS):
                    raise RuntimeExecutionError(
                        f"env {self.env_id}: action {a} outside 0..{len(ACTIONS) - 1} ({', '.join(ACTIONS)})"
                    )
                nexts.append(apply_action(ep.state, a, self.max_loops))
            final = self.reward == "final"
            self._prefetch(
                [
                    nxt
                    for ep, nxt in zip(self.episodes, nexts, strict=True)
                    if (last if final else nxt is not ep.state)
                ]
            )
            for e, ep in enumerate(self.episodes):
                a = int(acts[e])
                nxt = nexts[e]
                if self.reward == "final" and not last:
                    ep.state = nxt  # measured at the end only: reward 0 until then
                    ep.actions.append(a)
                    continue
                g = ep.g if nxt is ep.state and self.reward != "final" else self.measurer.gflops(nxt)
                if self.reward == "best":
                    rew[e] = max(0.0, g - ep.best_g) / self.peak
                elif self.reward == "log":
                    rew[e] = self._log_gain(ep, g)
                else:
                    rew[e] = (g - ep.g) / self.peak
                ep.state, ep.g = nxt, g
                ep.actions.append(a)
                if g > ep.best_g:
                    ep.best, ep.best_g, ep.best_step = nxt, g, len(ep.actions)
            self.steps += 1
            if self.steps == self.episode_len:
                self._finish()
            obs = self._obs()
        else:
            obs = self.last_obs if self.batched else self.last_obs[0]
        done = np.full(self.n, self.steps >= self.episode_len)
        if not self.batched:
            return obs, rew[0], done[0]
        return obs, rew, done

    def _log_gain(self, ep: _Episode, g: float) -> float:
        """``log(g / ref)`` when ``g`` beats the best GFLOPS rewarded so far by more than
        the noise margin (then ``g`` becomes the reference), else 0."""
        if g <= 0:
            return 0.0
        if ep.ref_g <= 0:  # the untuned nest failed: nothing to compare with
            ep.ref_g = g
            return 0.0
        gain = math.log(g / ep.ref_g)
        if gain <= math.log1p(self.noise):
            return 0.0
        ep.ref_g = g
        return gain

    def _finish(self) -> None:
        recs = [ep.record() for ep in self.episodes]
        self.history.extend(recs)
        for ep in self.episodes:  # measured gains only: a failed untuned nest (0 GFLOPS) has none
            if ep.initial_g > 0 and ep.best_step > 0:
                kept = _effective(ep.initial, ep.actions[: ep.best_step], self.max_loops)
                if self.demos.remember(ep.initial.problem.name, ep.best_g / ep.initial_g, kept):
                    log.debug("%s: new demonstration for %s: %s", self.env_id, ep.initial.problem.name, kept)
        init = np.mean([r.initial_gflops for r in recs])
        final = np.mean([r.final_gflops for r in recs])
        best = np.mean([r.best_gflops for r in recs])
        log.info(
            "%s reset %d: %d episodes, mean GFLOPS %.1f -> %.1f (best %.1f), %d episodes so far",
            self.env_id,
            recs[0].reset_point,
            len(recs),
            init,
            final,
            best,
            len(self.history),
        )


def _effective(state: LoopState, actions: Sequence[int], max_loops: int) -> list[int]:
    """``actions`` without the no-ops (invalid actions leave the state as it is)."""
    kept = []
    for a in actions:
        nxt = apply_action(state, a, max_loops)
        if nxt is not state:
            kept.append(a)
            state = nxt
    return kept


class _MaskFn(UDFFn):
    """The valid-action mask of every env's current state (see :meth:`LoopTuneEnv.action_mask`)."""

    def __init__(self, state: _LoopTuneState) -> None:
        super().__init__(self._call, f"{state.env_id}.action_mask")
        self.state = state

    def _call(self, inputs: list[np.ndarray], point: dict[str, int]) -> list[np.ndarray]:
        st = self.state
        if not st.episodes:
            raise RuntimeExecutionError(f"env {st.env_id}: action_mask before reset")
        mask = np.array(
            [[float(is_valid(ep.state, a, st.max_loops)) for a in range(len(ACTIONS))] for ep in st.episodes],
            np.float32,
        )
        return [mask if st.batched else mask[0]]


class LoopTuneEnv(GymEnv):
    """LoopTune in RT programs (same interface as ``GymEnv``; see the module doc).

    ``trl.env.make("looptune.<dataset>", num_envs=B, seed=0, split="train", measurer="tvm",
    max_loops=16, episode_len=10, problems=None, peak=None, cache_dir=None)``:

    - ``measurer``: ``"tvm"`` (compile and time), ``"analytic"`` (CI tests only) or any
      object with ``name`` and ``gflops(state)``;
    - ``peak``: the reward's denominator in GFLOPS; by default :func:`.machine_peak` for
      real measurers and :attr:`AnalyticCostModel.peak` for the analytic model;
    - ``max_loops``: rows of the observation; splits beyond it are invalid actions;
    - ``cache_dir``: where the TVM measurer and the peak keep their disk caches;
    - ``reward``: ``"step"`` (the paper's per-action ``ΔGFLOPS / peak``) or ``"final"``
      (0 until the last action, then ``(GFLOPS(final) - GFLOPS(initial)) / peak``: the same
      episode return with two measurements per episode, for evaluating a trained policy)
      or ``"best"`` (``max(0, GFLOPS(S') - best so far) / peak``: the return is the gain of
      the best schedule of the episode, the one a tuner keeps; actions after it are not
      penalised, so exploring is never worse than stopping) or ``"log"`` (the same with
      ``log(GFLOPS(S') / best so far)``, paid only when it beats ``noise`` (default 3 %),
      so timing noise is not rewarded: the return is the log speedup of the best schedule,
      the same scale on every problem and machine, no ``peak`` needed);
    - ``farm``: a measurement farm (``trl.dist.ray_farm(address, num_workers)``): the
      ``measurer`` runs on its Ray workers, one step's ``B`` measurements at once, and this
      process writes the cache (``docs/distributed.md``). Without it the ``B`` envs are
      measured one after the other in this process.
    """

    def __init__(
        self,
        name: str,
        num_envs: Any,
        seed: int = 0,
        split: str = "train",
        measurer: str | Measurer = "tvm",
        max_loops: int = MAX_LOOPS,
        episode_len: int = 10,
        problems: Sequence[Problem] | None = None,
        peak: float | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        reward: str = "step",
        noise: float = DEFAULT_NOISE,
        farm: Any = None,
    ) -> None:
        import gymnasium as gym

        env_id = f"looptune.{name}"
        if split not in SPLITS:
            raise TimeRLError(f"env {env_id}: unknown split {split!r}; use one of {', '.join(SPLITS)}")
        if reward not in REWARDS:
            raise TimeRLError(f"env {env_id}: reward must be one of {', '.join(REWARDS)}, got {reward!r}")
        if episode_len < 1:
            raise TimeRLError(f"env {env_id}: episode_len must be >= 1, got {episode_len}")
        if not 0.0 <= noise < 1.0:
            raise TimeRLError(f"env {env_id}: noise must be in [0, 1), got {noise}")
        if problems is not None:
            plist = list(problems)
            if not plist:
                raise TimeRLError(f"env {env_id}: problems= is empty; pass at least one Problem")
        else:
            train, test = ds.split(name, seed=0)
            plist = {"train": train, "test": test, "all": ds.problems(name)}[split]
        need = max(len(initial_state(p).loops) for p in plist)
        if max_loops < need:
            raise TimeRLError(
                f"env {env_id}: max_loops={max_loops} is less than the {need} loops of an untiled nest "
                f"of these problems; use max_loops >= {need}"
            )
        if farm is not None:  # measured on Ray workers (connects now: before anything compiles)
            meas = farm.looptune_measurer(measurer, cache_dir)
        else:
            meas = make_measurer(measurer, cache_dir)
        if peak is None:
            known = meas.peak if isinstance(meas, AnalyticCostModel) else getattr(meas, "peak", None)
            peak = known if known is not None else machine_peak(cache_dir)
        if not peak > 0:
            raise TimeRLError(f"env {env_id}: peak must be > 0 GFLOPS, got {peak}")
        self.measurer = meas
        self.peak = float(peak)
        self.problems = plist
        self.max_loops = max_loops
        self.episode_len = episode_len
        self.obs_space = gym.spaces.Box(0.0, np.inf, (max_loops * NUM_FEATURES,), np.float32)
        self.action_space = gym.spaces.Discrete(len(ACTIONS))
        state = _LoopTuneState(
            env_id,
            num_envs,
            seed,
            plist,
            split == "test",
            meas,
            self.peak,
            max_loops,
            episode_len,
            reward=reward,
            noise=noise,
        )
        self._init_wrapper(env_id, num_envs, state)

    def action_mask(self, obs: RecurrentTensor) -> RecurrentTensor:
        """``1.0`` for the actions that change each env's current state, ``0.0`` for the
        no-ops (a cursor at the top cannot move up, a split larger than the loop, ...), a
        float32 ``(10,)`` per point of ``obs``. It reads the env's state, so it depends on
        ``obs`` (the observation of that state) and is computed after the step that made it;
        e.g. ``(logits + (mask - 1) * 1e9).argmax(-1)`` picks the best valid action."""
        return self._action_mask_udf(_MaskFn(self._state), len(ACTIONS), obs)

    def demo_slots(self, parts: int = 1) -> int:
        """The slot dim's bound that :meth:`demo_buffer` needs: a row per problem of a part
        (``ceil(problems / parts)``) and per action of an episode."""
        return -(-len(self.problems) // parts) * self.episode_len

    def demo_buffer(
        self,
        domain: Sequence[Sym],
        slot_dim: Sym,
        slots: Sym,
        min_speedup: float = 1.1,
        after: Sequence[RecurrentTensor] = (),
        part: Sym | None = None,
        parts: int = 1,
    ) -> tuple[RecurrentTensor, RecurrentTensor, RecurrentTensor]:
        """Buffer imitation (as :meth:`TiramisuEnv.demo_buffer
        <timerl.envs.tiramisu.env.TiramisuEnv.demo_buffer>`): ``(obs, action, weight)`` at
        every point of ``domain`` (e.g. ``(i, k)``), all slots of ``slot_dim`` (bound
        ``slots`` = :meth:`demo_slots`) made by one call per point of the other dims: per
        problem, the states along its kept demonstration (the actions to the fastest measured
        schedule of its training episodes so far, no-ops left out, if it beats the untuned
        nest by ``min_speedup``), replayed from the untuned nest without measurements;
        ``weight`` 1.0 on a demonstration step, 0.0 on an empty slot. ``after``: RTs the call
        waits for (e.g. the iteration's rewards, so that the episodes just finished count).
        ``part`` (a dim of ``domain``) of ``parts``: at ``part = q`` only the problems ``p``
        with ``p % parts == q``."""
        fn = DemoBufferFn(self._state, min_speedup, slots, part, parts)
        obs, act, weight = udf(
            fn,
            [((self.max_loops * NUM_FEATURES,), DType.float32), ((), DType.int64), ((), DType.float32)],
            tuple(domain),
            list(after),
            name=f"{self.env_id}.demo_buffer",
            batch_dims=(slot_dim,),
        )
        return obs, act, weight

    def seed_demonstrations(self, demos: Sequence[Any]) -> int:
        """Add measured demonstrations made outside the env (e.g. :func:`.seed_demos.search_demos`:
        items with ``problem`` (name), ``speedup`` and ``actions``) to :attr:`demonstrations`;
        each is kept unless the problem already has a faster one. Returns how many were kept."""
        kept = 0
        for d in demos:
            acts = _effective(initial_state(Problem.from_name(d.problem)), d.actions, self.max_loops)
            kept += self._state.demos.remember(d.problem, float(d.speedup), acts)
        return kept

    @property
    def demonstrations(self) -> dict[str, tuple[float, tuple[int, ...]]]:
        """Per problem, the kept best measured episode: (speedup over the untuned nest, the
        actions to its fastest schedule, no-ops left out); filled as training episodes finish."""
        return self._state.demos

    @property
    def history(self) -> list[EpisodeRecord]:
        """Every finished episode so far, in order."""
        return self._state.history
