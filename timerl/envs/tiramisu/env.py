"""The Tiramisu-style environment: ``trl.env.make("tiramisu.<set>", num_envs=B, ...)``.

Each of the ``B`` envs holds one program and its current :class:`~.schedule.Schedule`
with a focused branch. Reset picks a program per env (see ``sets``) and returns the
untransformed program's graph (:mod:`.features`, flattened to ``OBS_SIZE``). ``step(a)``
applies one of the 84 actions (:mod:`.actions`: the paper's 56, plus skew by 2, wavefront
skew, shift, fusion, one-step time tiling and aligned fusion of the next branch, interchanges of levels 4-6) to the focused branch:

- a transformation that applies, is legal (exact isl dependences) and compiles to a
  correct program: reward ``log4(t_prev / t_new)`` (the speedup over the previous state);
- ``next``: the focus moves to the next branch, reward ``log4(0.9)``; after the last
  branch the episode is done;
- an action that does not apply, is illegal, or whose program fails to compile or
  computes a wrong result: a logged no-op with reward ``log4(0.9)``. Illegal schedules
  never reach the compiler.

An episode also ends after ``episode_len`` actions; a done env stays done (reward 0,
last observation) until the next reset, as in ``GymEnv``, so ``T: d`` works.

Sets: ``tiramisu.benchmarks`` (the 8 functions of §4.1.2; ``split="test"`` or default
walk them in order per env, ``split="train"`` draws them), ``tiramisu.random`` (generated
programs, ``num_programs`` of stream ``seed``), or one benchmark by name
(``tiramisu.mvt``). ``programs=[...]`` replaces the set.
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
from timerl.envs.tiramisu.actions import ACTIONS, NEXT, NUM_ACTIONS, apply_action
from timerl.envs.tiramisu.benchmarks import BENCHMARKS, benchmark
from timerl.envs.tiramisu.features import OBS_SIZE, check_representable, flatten, graph
from timerl.envs.tiramisu.generator import random_programs
from timerl.envs.tiramisu.legality import LegalityChecker
from timerl.envs.tiramisu.measure import Measurer
from timerl.envs.tiramisu.program import Program
from timerl.envs.tiramisu.schedule import Schedule, initial_schedule
from timerl.envs.tiramisu.surrogate import Surrogate
from timerl.errors import EnvNotResetError, RuntimeExecutionError, TimeRLError
from timerl.pdg.ops import DType
from timerl.rt.tensor import RecurrentTensor
from timerl.rt.udf import UDFFn, udf
from timerl.symbolic import Sym

__all__ = ["PENALTY", "EpisodeRecord", "TiramisuEnv", "TiramisuTask", "programs_of"]

log = logging.getLogger("timerl.envs.tiramisu")

PENALTY = math.log(0.9, 4)  # log4(0.9): illegal action or branch switch


def programs_of(name: str, seed: int = 0, num_programs: int = 64) -> list[Program]:
    """The programs of set ``name`` (see the module doc)."""
    if name == "benchmarks":
        return [benchmark(n) for n in BENCHMARKS]
    if name == "random":
        return random_programs(num_programs, seed)
    if name in BENCHMARKS:
        return [benchmark(name)]
    raise TimeRLError(
        f"unknown Tiramisu set {name!r}: use 'tiramisu.benchmarks', 'tiramisu.random' or one benchmark "
        f"({', '.join(BENCHMARKS)})"
    )


class TiramisuTask:
    """One program with its legality checker (dependences computed once) and measurer:
    the transition function of an episode, usable without an RT program (searches, tests)."""

    def __init__(self, program: Program, measurer: Measurer) -> None:
        check_representable(program)
        self.program = program
        self.legal = LegalityChecker(program)
        self.measurer = measurer
        self.initial = initial_schedule(program)

    def seconds(self, sched: Schedule) -> float:
        return self.measurer.seconds(sched)

    def try_action(self, sched: Schedule, branch: int, a: int) -> Schedule | None:
        """The next schedule if ``a`` applies and is legal (not measured), else None."""
        new = apply_action(sched, branch, a)
        if new is None or not self.legal(new):
            return None
        return new


@dataclass(frozen=True)
class EpisodeRecord:
    """One finished episode of one env."""

    reset_point: int
    env_index: int
    program: str
    initial_seconds: float
    final_seconds: float
    best_seconds: float
    final_key: str
    best_key: str
    actions: tuple[int, ...]
    predicted_steps: int = 0  # steps whose time the surrogate predicted (not measured)
    final_predicted: bool = False  # final_seconds is a prediction
    best_predicted: bool = False  # best_seconds is a prediction
    demo_steps: int = 0  # leading actions replayed from the program's best episode (self-imitation)

    @property
    def speedup(self) -> float:
        return self.initial_seconds / self.final_seconds

    @property
    def best_speedup(self) -> float:
        return self.initial_seconds / self.best_seconds


class _Episode:
    def __init__(self, k: int, e: int, task: TiramisuTask) -> None:
        self.k, self.e, self.task = k, e, task
        self.sched = task.initial
        self.t0 = self.t = task.seconds(self.sched)
        if not math.isfinite(self.t0):
            raise RuntimeExecutionError(
                f"the untransformed program {task.program.name} failed to compile or run"
            )
        self.best, self.best_t = self.sched, self.t
        self.t_predicted = self.best_predicted = False
        self.predicted_steps = 0
        self.branch = 0
        self.actions: list[int] = []
        self.best_step = 0  # actions that reached ``best``
        self.demo: tuple[int, ...] = ()  # actions to replay first (self-imitation), see ``demo_actions``
        self.demo_steps = 0
        self.visited = {self.sched.key}  # schedules of this episode (the mask hides returns)
        self.done = False

    def record(self) -> EpisodeRecord:
        return EpisodeRecord(
            self.k,
            self.e,
            self.task.program.name,
            self.t0,
            self.t,
            self.best_t,
            self.sched.key,
            self.best.key,
            tuple(self.actions),
            self.predicted_steps,
            self.t_predicted,
            self.best_predicted,
            self.demo_steps,
        )


class _TiramisuState:
    def __init__(
        self,
        env_id: str,
        num_envs: Any,
        seed: int,
        tasks: list[TiramisuTask],
        in_order: bool,
        episode_len: int,
        surrogate: Surrogate | None = None,
        demo_prob: float = 0.0,
        demo_min_speedup: float = 1.1,
    ) -> None:
        self.env_id = env_id
        self.demo_prob = float(demo_prob)
        self.demo_min_speedup = float(demo_min_speedup)
        # per program: the fastest measured schedule of any finished episode (speedup, actions to it)
        self.demos = Demonstrations()
        self._buffer_cache: dict[tuple, tuple[np.ndarray, ...]] = {}  # demo_buffer's replays
        self.surrogate = surrogate
        self.num_envs = num_envs
        self.seed = int(seed)
        self.tasks = tasks
        self.in_order = in_order
        self.episode_len = episode_len
        self.batched = isinstance(num_envs, Sym)
        self.n = 0
        self.episodes: list[_Episode] = []
        self.steps = 0
        self.history: list[EpisodeRecord] = []
        self.last_obs: np.ndarray | None = None
        self.illegal = 0
        self.failed = 0

    def bind(self, bounds: Mapping[Sym, int]) -> None:
        self.n = static_num_envs(self.env_id, self.num_envs, bounds)

    def _pick(self, k: int) -> list[TiramisuTask]:
        return pick_batch(self.tasks, k, self.n, self.in_order, self.seed)

    def _obs(self) -> np.ndarray:
        obs = np.stack([flatten(*graph(ep.sched, ep.branch)) for ep in self.episodes])
        self.last_obs = obs
        return obs if self.batched else obs[0]

    def _prefetch(self, scheds: list[Schedule]) -> None:
        """Measure ``scheds`` together where the measurer takes batches (a farm's: they go
        out at once) and every new schedule is measured (no surrogate); the per-env loop
        then reads them from its cache."""
        many = getattr(self.tasks_measurer, "measure_many", None)
        if many is not None and self.surrogate is None and len(scheds) > 1:
            many(scheds)

    @property
    def tasks_measurer(self) -> Any:
        return self.tasks[0].measurer if self.tasks else None

    def reset(self, point: dict[str, int]) -> np.ndarray:
        k = sum(point.values())
        picked = self._pick(k)
        self._prefetch([t.initial for t in picked])
        self.episodes = [_Episode(k, e, t) for e, t in enumerate(picked)]
        self.steps = 0
        if self.demo_prob > 0.0:
            self._assign_demos(k)
        return self._obs()

    def _remember(self, ep: _Episode) -> None:
        """Keep ``ep``'s fastest schedule as its program's demonstration if it was measured
        (not predicted) and beats the one kept so far."""
        if ep.best_predicted or ep.best_step == 0:
            return
        self.demos.remember(ep.task.program.name, ep.t0 / ep.best_t, ep.actions[: ep.best_step])

    def _assign_demos(self, k: int) -> None:
        """With probability ``demo_prob`` per env, the episode of reset ``k`` first replays
        its program's kept demonstration (if one reaches ``demo_min_speedup``)."""
        rng = np.random.default_rng(self.seed + 104729 + 7919 * k)
        for ep in self.episodes:
            speedup, actions = self.demos.get(ep.task.program.name, (0.0, ()))
            if rng.random() < self.demo_prob and speedup >= self.demo_min_speedup:
                ep.demo = actions

    def demo_actions(self, action: np.ndarray, mask: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """The actions to play: each env's sampled one, or the next action of its episode's
        demonstration while one is being replayed (flag 1.0). A demonstration action the mask
        removes ends the replay (the sampled action is played)."""
        acts = np.asarray(action).reshape(-1).copy()
        flags = np.zeros(acts.shape[0], np.float32)
        m = None if mask is None else np.asarray(mask).reshape(acts.shape[0], NUM_ACTIONS)
        for e, ep in enumerate(self.episodes):
            j = len(ep.actions)
            if ep.done or j >= len(ep.demo):
                continue
            if m is not None and m[e, ep.demo[j]] <= 0.0:
                log.debug(
                    "%s: demonstration of %s masked at step %d; replay ends",
                    self.env_id,
                    ep.task.program.name,
                    j,
                )
                ep.demo = ()
                continue
            acts[e], flags[e] = ep.demo[j], 1.0
            ep.demo_steps += 1
        return acts, flags

    def demo_buffer(
        self, slots: int, legal: bool, min_speedup: float, part: int = 0, parts: int = 1
    ) -> tuple[np.ndarray, ...]:
        """Buffer imitation's batch: the states of each program's kept demonstration (if it
        reaches ``min_speedup``), replayed from the program's initial schedule without
        measurements. The programs ``p`` with ``p % parts == part`` (e.g. one minibatch's
        share) in order, ``slots // ceil(programs / parts)`` rows each (``episode_len``):
        row ``q * L + j`` is step ``j`` of the ``q``-th of them. Per row: the observation,
        the action mask there (as ``mask(legal)``: applicable / legal, not yet visited), the
        demonstration's action and a weight (1.0, or 0.0 for an empty row and for a replayed
        action that the mask removes: it was a no-op in its episode)."""

        def rows_of(p: int | None, per: int) -> tuple[np.ndarray, ...]:
            task = self.tasks[0 if p is None else p]
            return self._replayed(task, legal, math.inf if p is None else min_speedup, per)

        return buffer_rows(len(self.tasks), slots, part, parts, rows_of)

    def _replayed(self, task: TiramisuTask, legal: bool, min_speedup: float, per: int) -> tuple:
        actions = self.demos.actions(task.program.name, min_speedup)
        key = (task.program.name, actions, legal, per)
        if key not in self._buffer_cache:
            self._buffer_cache[key] = _replay(task, actions[:per], legal, per)
        return self._buffer_cache[key]

    def _step_one(self, ep: _Episode, a: int, tried: Any = None) -> float:
        """``tried``: ``(new,)`` when ``try_action`` was already called for this step."""
        if not 0 <= a < NUM_ACTIONS:
            raise RuntimeExecutionError(f"env {self.env_id}: action {a} outside 0..{NUM_ACTIONS - 1}")
        ep.actions.append(a)
        if a == NEXT:
            ep.branch += 1
            if ep.branch >= len(ep.task.program.branches):
                ep.done = True
                ep.branch = len(ep.task.program.branches) - 1
            return PENALTY
        new = ep.task.try_action(ep.sched, ep.branch, a) if tried is None else tried[0]
        if new is None:
            self.illegal += 1
            log.debug(
                "%s: %s on branch %d of %s is illegal or does not apply",
                self.env_id,
                ACTIONS[a].name,
                ep.branch,
                ep.task.program.name,
            )
            return PENALTY
        if self.surrogate is not None:
            t, measured = self.surrogate.seconds(new, ep.best_t)
        else:
            t, measured = ep.task.seconds(new), True
        if not math.isfinite(t):
            self.failed += 1
            log.warning(
                "%s: %s on %s failed to compile/run or computed a wrong result; penalised",
                self.env_id,
                ACTIONS[a].name,
                ep.task.program.name,
            )
            return PENALTY
        r = math.log(ep.t / t, 4)
        ep.sched, ep.t, ep.t_predicted = new, t, not measured
        ep.predicted_steps += not measured
        ep.visited.add(new.key)
        if t < ep.best_t:
            ep.best, ep.best_t, ep.best_predicted = new, t, not measured
            ep.best_step = len(ep.actions)
        return r

    def step(self, action: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if not self.episodes or self.last_obs is None:
            raise EnvNotResetError(f"env {self.env_id}: step before reset")
        acts = np.asarray(action).reshape(-1)
        if acts.shape[0] != self.n:
            raise RuntimeExecutionError(f"env {self.env_id}: got {acts.shape[0]} actions for {self.n} envs")
        rew = np.zeros(self.n, np.float32)
        any_live = False
        tried: dict[int, tuple[Schedule | None]] = {}
        if self.surrogate is None and hasattr(self.tasks_measurer, "measure_many"):
            for e, ep in enumerate(self.episodes):
                a = int(acts[e])
                if not ep.done and 0 <= a < NUM_ACTIONS and a != NEXT:
                    tried[e] = (ep.task.try_action(ep.sched, ep.branch, a),)
            self._prefetch([new for (new,) in tried.values() if new is not None])
        for e, ep in enumerate(self.episodes):
            if ep.done:
                continue
            any_live = True
            rew[e] = self._step_one(ep, int(acts[e]), tried.get(e))
            if len(ep.actions) >= self.episode_len:
                ep.done = True
            if ep.done:
                self.history.append(ep.record())
                self._remember(ep)
        if any_live:
            self.steps += 1
            obs = self._obs()
        else:
            obs = self.last_obs if self.batched else self.last_obs[0]
        done = np.array([ep.done for ep in self.episodes])
        if not self.batched:
            return obs, rew[0], done[0]
        return obs, rew, done

    def mask(self, legal: bool) -> np.ndarray:
        out = np.zeros((len(self.episodes), NUM_ACTIONS), np.float32)
        for e, ep in enumerate(self.episodes):
            out[e] = _mask_row(ep.task, ep.sched, ep.branch, ep.visited, legal)[0]
        return out


def _mask_row(
    task: TiramisuTask, sched: Schedule, branch: int, visited: set, legal: bool
) -> tuple[np.ndarray, dict[int, Schedule | None]]:
    """One state's action mask (``next`` always; another action where it applies, or with
    ``legal`` is legal, and leads to a schedule not yet visited) and the schedule each
    action other than ``next`` leads to (None: it does not apply)."""
    row = np.zeros(NUM_ACTIONS, np.float32)
    nxt: dict[int, Schedule | None] = {}
    for a in range(NUM_ACTIONS):
        if a == NEXT:
            row[a] = 1.0
            continue
        new = nxt[a] = (task.try_action if legal else apply_action)(sched, branch, a)
        row[a] = float(new is not None and new.key not in visited)
    return row, nxt


def _replay(task: TiramisuTask, actions: Sequence[int], legal: bool, steps: int) -> tuple[np.ndarray, ...]:
    """``demo_buffer``'s rows for one program: ``actions`` replayed from the initial schedule
    (no measurement), padded to ``steps`` rows of weight 0 (the initial state, ``next``)."""
    obs = np.zeros((steps, OBS_SIZE), np.float32)
    mask = np.zeros((steps, NUM_ACTIONS), np.float32)
    mask[:, NEXT] = 1.0
    acts = np.full(steps, NEXT, np.int64)
    weight = np.zeros(steps, np.float32)
    sched, branch, visited = task.initial, 0, {task.initial.key}
    obs[:] = flatten(*graph(sched, branch))
    n_branches = len(task.program.branches)
    for j, a in enumerate(actions):
        if branch >= n_branches:
            break
        obs[j] = flatten(*graph(sched, branch))
        mask[j], nxt = _mask_row(task, sched, branch, visited, legal)
        acts[j] = a
        if mask[j, a] <= 0.0:  # a no-op in its episode: nothing to imitate, the state stays
            continue
        weight[j] = 1.0
        if a == NEXT:
            branch += 1
            continue
        new = nxt[a] if legal else task.try_action(sched, branch, a)
        if new is None:  # applies but illegal (structural mask): a no-op in its episode too
            weight[j] = 0.0
            continue
        sched = new
        visited.add(new.key)
    return obs, mask, acts, weight


class _EpisodeFn(UDFFn):
    """A UDF of the env's running episodes, named ``<env id>.<what>``; calling it before the
    env's reset raises."""

    what = ""

    def __init__(self, state: _TiramisuState) -> None:
        super().__init__(self._checked, f"{state.env_id}.{self.what}")
        self.state = state

    def _checked(self, inputs: list[np.ndarray], point: dict[str, int]) -> list[np.ndarray]:
        if not self.state.episodes:
            raise RuntimeExecutionError(f"env {self.state.env_id}: {self.what} before reset")
        return self._call(inputs, point)

    def _call(self, inputs: list[np.ndarray], point: dict[str, int]) -> list[np.ndarray]:
        raise NotImplementedError


class _MaskFn(_EpisodeFn):
    what = "action_mask"

    def __init__(self, state: _TiramisuState, legal: bool) -> None:
        super().__init__(state)
        self.legal = legal

    def _call(self, inputs: list[np.ndarray], point: dict[str, int]) -> list[np.ndarray]:
        st = self.state
        m = st.mask(self.legal)
        return [m if st.batched else m[0]]


class _DemoFn(_EpisodeFn):
    what = "demo_actions"

    def __init__(self, state: _TiramisuState, masked: bool) -> None:
        super().__init__(state)
        self.masked = masked

    def _call(self, inputs: list[np.ndarray], point: dict[str, int]) -> list[np.ndarray]:
        st = self.state
        a = np.asarray(inputs[0])
        acts, flags = st.demo_actions(a, inputs[1] if self.masked else None)
        acts = acts.astype(a.dtype)
        return [acts, flags] if st.batched else [acts.reshape(a.shape), flags[0]]


class TiramisuEnv(GymEnv):
    """The Tiramisu-style environment in RT programs (``GymEnv`` interface; module doc).

    ``trl.env.make("tiramisu.<set>", num_envs=B, seed=0, split="train", episode_len=16,
    programs=None, num_programs=64, threads=None, cache_dir=None, measurer=None,
    surrogate="off", surrogate_options=None)``.
    ``measurer``: a :class:`~.measure.Measurer` to share (its caches) between envs.
    ``surrogate``: ``off`` (every new schedule measured) or ``lgbm`` (a
    :class:`~.surrogate.Surrogate` measures some and predicts the rest with a cost model;
    ``surrogate_options``: its keyword arguments); the reward keeps its definition, with
    predicted times where a step was not measured (:attr:`EpisodeRecord.predicted_steps`).
    ``farm``: a measurement farm (``trl.dist.ray_farm(address, num_workers)``; when no
    ``measurer`` is given): schedules are compiled and timed on its Ray workers (``threads``
    default 1 there: a worker owns one core), one step's new schedules at once
    (``docs/distributed.md``).
    """

    def __init__(
        self,
        name: str,
        num_envs: Any,
        seed: int = 0,
        split: str = "train",
        episode_len: int = 16,
        programs: Sequence[Program] | None = None,
        num_programs: int = 64,
        threads: int | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        measurer: Measurer | None = None,
        surrogate: str = "off",
        surrogate_options: Mapping[str, Any] | None = None,
        demo_prob: float = 0.0,
        demo_min_speedup: float = 1.1,
        farm: Any = None,
    ) -> None:
        import gymnasium as gym

        env_id = f"tiramisu.{name}"
        if split not in ("train", "test"):
            raise TimeRLError(f"env {env_id}: split must be 'train' or 'test', got {split!r}")
        if episode_len < 1:
            raise TimeRLError(f"env {env_id}: episode_len must be >= 1, got {episode_len}")
        plist = list(programs) if programs is not None else programs_of(name, seed, num_programs)
        if not plist:
            raise TimeRLError(f"env {env_id}: no programs")
        if measurer is not None:
            self.measurer = measurer
        elif farm is not None:  # on Ray workers (connects now: before anything compiles)
            self.measurer = farm.tiramisu_measurer(cache_dir=cache_dir, threads=threads or 1)
        else:
            self.measurer = Measurer(cache_dir, threads)
        self.tasks = [TiramisuTask(p, self.measurer) for p in plist]
        if surrogate not in ("off", "lgbm"):
            raise TimeRLError(f"env {env_id}: surrogate must be 'off' or 'lgbm', got {surrogate!r}")
        if surrogate == "off" and surrogate_options:
            raise TimeRLError(f"env {env_id}: surrogate_options given with surrogate='off'")
        self.surrogate = (
            Surrogate(self.measurer, plist, **dict(surrogate_options or {})) if surrogate == "lgbm" else None
        )
        self.obs_space = gym.spaces.Box(-np.inf, np.inf, (OBS_SIZE,), np.float32)
        self.action_space = gym.spaces.Discrete(NUM_ACTIONS)
        if not 0.0 <= demo_prob <= 1.0:
            raise TimeRLError(f"env {env_id}: demo_prob must be in [0, 1], got {demo_prob}")
        state = _TiramisuState(
            env_id,
            num_envs,
            seed,
            self.tasks,
            split == "test",
            episode_len,
            self.surrogate,
            demo_prob,
            demo_min_speedup,
        )
        self._init_wrapper(env_id, num_envs, state)

    def action_mask(self, obs: RecurrentTensor, legal: bool = False) -> RecurrentTensor:
        """``1.0`` for the actions that apply to each env's state (``legal=True``: that are
        also legal, a dependence check per action) and lead to a schedule not yet visited
        in the episode (no undoing I(l,l+1) or R(l), no toggling between unroll factors),
        ``0.0`` else; float32 ``(NUM_ACTIONS,)`` per
        point of ``obs`` (computed after the step that made ``obs``)."""
        return self._action_mask_udf(_MaskFn(self._state, legal), NUM_ACTIONS, obs)

    def demo_actions(
        self, action: RecurrentTensor, mask: RecurrentTensor | None = None
    ) -> tuple[RecurrentTensor, RecurrentTensor]:
        """Self-imitation's replay (``demo_prob`` > 0): ``(played, demo)`` at the points of
        ``action``. ``played`` is ``action`` except while the episode replays its program's
        kept demonstration (the actions to the fastest measured schedule of any earlier
        episode of that program, if it reaches ``demo_min_speedup``; chosen at reset with
        probability ``demo_prob``), where it is the demonstration's next action and ``demo``
        is 1.0. Step the env with ``played``; a demonstration action that ``mask`` removes
        ends the replay."""
        ins = [action] if mask is None else [action, mask]
        played, flag = udf(
            _DemoFn(self._state, mask is not None),
            [(tuple(action.shape), action.dtype), ((), DType.float32)],
            action.domain,
            ins,
            name=f"{self.env_id}.demo_actions",
            batch_dims=(self.batch_dim,) if self.batch_dim is not None else (),
        )
        return played, flag

    def demo_buffer(
        self,
        domain: Sequence[Sym],
        slot_dim: Sym,
        slots: Sym,
        legal: bool = False,
        min_speedup: float = 1.1,
        after: Sequence[RecurrentTensor] = (),
        part: Sym | None = None,
        parts: int = 1,
    ) -> tuple[RecurrentTensor, RecurrentTensor, RecurrentTensor, RecurrentTensor]:
        """Buffer imitation: ``(obs, mask, action, weight)`` at every point of ``domain`` (e.g.
        ``(i, k)``), all slots of ``slot_dim`` (bound ``slots``: programs x ``episode_len``)
        made by one call per point of the other dims: per program, the states along its kept
        demonstration (the actions to the fastest measured schedule of its training episodes
        so far, if it reaches ``min_speedup``), replayed from the initial schedule without
        measurements; ``weight`` 1.0 on a demonstration step, 0.0 on an empty slot (see
        ``_TiramisuState.demo_buffer``). ``after``: RTs the call waits for (e.g. the
        iteration's rewards, so that the episodes that just finished count). ``part`` (a dim
        of ``domain``, e.g. the minibatch ``m``) of ``parts``: at ``part = q`` only the
        programs ``p`` with ``p % parts == q`` (``slots``: their share x ``episode_len``)."""
        st = self._state

        def call(n: int, min_speedup: float, q: int, parts: int) -> tuple[np.ndarray, ...]:
            return st.demo_buffer(n, legal, min_speedup, q, parts)

        fn = DemoBufferFn(st, min_speedup, slots, part, parts, call)
        obs, mask, act, weight = udf(
            fn,
            [
                ((OBS_SIZE,), DType.float32),
                ((NUM_ACTIONS,), DType.float32),
                ((), DType.int64),
                ((), DType.float32),
            ],
            tuple(domain),
            list(after),
            name=f"{self.env_id}.demo_buffer",
            batch_dims=(slot_dim,),
        )
        return obs, mask, act, weight

    @property
    def demonstrations(self) -> dict[str, tuple[float, tuple[int, ...]]]:
        """Per program, the kept best measured episode: (speedup, the actions to its fastest
        schedule); filled as training episodes finish (``demo_prob`` > 0 replays them)."""
        return self._state.demos

    @property
    def history(self) -> list[EpisodeRecord]:
        return self._state.history
