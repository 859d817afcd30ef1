"""Search baselines over the same actions and legality: beam search and random
schedules, each limited to a number of measurements (distinct schedules compiled and
timed, the untransformed one included), so they can be compared with the agent at an
equal measurement budget.

A search state is ``(schedule, focused branch)``; ``next`` moves the focus (no
measurement). Both return the fastest schedule found, every schedule they measured and
the measurements used.

:func:`pick_best` is the last step of every method the evaluation compares (the agent's
episodes and these searches alike): the in-search measurements are single (a median of a
few runs in one process), so the fastest of many schedules is often a lucky one; it
re-measures the few fastest candidates and the untransformed program in fresh processes
and keeps the fastest by the median.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from timerl.envs.tiramisu.actions import ACTIONS, NEXT, NUM_ACTIONS, apply_action
from timerl.envs.tiramisu.env import TiramisuTask
from timerl.envs.tiramisu.measure import Measurer
from timerl.envs.tiramisu.schedule import Schedule
from timerl.errors import TimeRLError

log = logging.getLogger(__name__)

__all__ = [
    "ClimbResult",
    "Pick",
    "SearchResult",
    "apply_sequence",
    "beam_search",
    "hill_climb",
    "pick_best",
    "random_search",
]


@dataclass(frozen=True)
class SearchResult:
    """The fastest schedule as measured in the search, the untransformed program's
    seconds, the measurements used and every schedule measured with a finite time
    (``measured``, the untransformed one included: :func:`pick_best`'s candidates)."""

    best: Schedule
    best_seconds: float
    initial_seconds: float
    measurements: int
    measured: tuple[Schedule, ...] = ()

    @property
    def speedup(self) -> float:
        return self.initial_seconds / self.best_seconds


def apply_sequence(task: TiramisuTask, spec: str) -> Schedule:
    """The schedule after ``spec``, whitespace-separated ``branch:action`` tokens (action
    names as :attr:`.actions.Action.name`, e.g. ``"1:I(2,3) 1:U(8)"``), each checked for
    legality; raises TimeRLError naming the first token that is unknown, does not apply
    or is illegal. Nothing is measured."""
    by_name = {a.name: k for k, a in enumerate(ACTIONS)}
    s = task.initial
    for tok in spec.split():
        br, _, name = tok.partition(":")
        if name not in by_name or not br.isdigit() or int(br) >= len(task.program.branches):
            raise TimeRLError(f"{task.program.name}: bad schedule token {tok!r} in {spec!r}")
        new = task.try_action(s, int(br), by_name[name])
        if new is None:
            raise TimeRLError(f"{task.program.name}: {tok} does not apply or is illegal in {spec!r}")
        s = new
    return s


class _Budget:
    def __init__(self, task: TiramisuTask, budget: int) -> None:
        self.task, self.budget = task, budget
        self.seen: dict[str, float] = {}
        self.schedules: dict[str, Schedule] = {}

    @property
    def left(self) -> int:
        return self.budget - len(self.seen)

    def seconds(self, s: Schedule) -> float:
        if s.key not in self.seen:
            self.seen[s.key] = self.task.seconds(s)
            self.schedules[s.key] = s
        return self.seen[s.key]

    def measured(self) -> tuple[Schedule, ...]:
        return tuple(s for k, s in self.schedules.items() if math.isfinite(self.seen[k]))


def beam_search(task: TiramisuTask, budget: int, width: int = 4, depth: int = 16) -> SearchResult:
    """Beam search: expand every state of the beam by every legal action on its focused
    branch (and by ``next``), measure the children, keep the ``width`` fastest."""
    b = _Budget(task, max(1, budget))
    t0 = b.seconds(task.initial)
    beam: list[tuple[float, Schedule, int]] = [(t0, task.initial, 0)]
    best, best_t = task.initial, t0
    nbr = len(task.program.branches)
    for _ in range(depth):
        children: dict[tuple[str, int], tuple[float, Schedule, int]] = {}
        for t, s, br in beam:
            if br + 1 < nbr:
                children.setdefault((s.key, br + 1), (t, s, br + 1))
            for a in range(NUM_ACTIONS - 1):
                if b.left <= 0:
                    break
                new = task.try_action(s, br, a)
                if new is None or (new.key, br) in children:
                    continue
                tn = b.seconds(new)
                if math.isfinite(tn):
                    children[(new.key, br)] = (tn, new, br)
                    if tn < best_t:
                        best, best_t = new, tn
        if not children or b.left <= 0:
            break
        beam = sorted(children.values(), key=lambda c: c[0])[:width]
    return SearchResult(best, best_t, t0, len(b.seen), b.measured())


def random_search(task: TiramisuTask, budget: int, episode_len: int = 16, seed: int = 0) -> SearchResult:
    """Random episodes (uniform over the actions that apply; illegal ones are no-ops),
    measuring every new legal schedule, until ``budget`` measurements; the best schedule."""
    rng = np.random.default_rng(seed)
    b = _Budget(task, max(1, budget))
    t0 = b.seconds(task.initial)
    best, best_t = task.initial, t0
    nbr = len(task.program.branches)
    stale = 0
    while b.left > 0 and stale < 50:
        s, br = task.initial, 0
        before = len(b.seen)
        for _ in range(episode_len):
            valid = [a for a in range(NUM_ACTIONS - 1) if apply_action(s, br, a) is not None] + [NEXT]
            a = int(rng.choice(valid))
            if a == NEXT:
                br += 1
                if br >= nbr:
                    break
                continue
            new = task.try_action(s, br, a)
            if new is None:
                continue
            if new.key not in b.seen and b.left <= 0:
                break
            tn = b.seconds(new)
            if not math.isfinite(tn):
                continue
            s = new
            if tn < best_t:
                best, best_t = new, tn
        stale = stale + 1 if len(b.seen) == before else 0
    return SearchResult(best, best_t, t0, len(b.seen), b.measured())


@dataclass(frozen=True)
class Pick:
    """:func:`pick_best`'s answer: the kept schedule and its re-measured median speedup,
    every candidate as ``(schedule key, median speedup)`` (the untransformed program
    first, at 1.0) and the fresh measurements it cost (candidates x repeats, the
    untransformed program's reference runs included, whether or not a shared cache
    already held them: the count a method is charged, equal for every method)."""

    best: Schedule
    speedup: float
    candidates: tuple[tuple[str, float], ...]
    measurements: int


def pick_best(
    task: TiramisuTask,
    measured: Iterable[Schedule],
    top: int = 3,
    repeats: int = 3,
    cache: dict[str, float] | None = None,
    new_measurer: Callable[[], Measurer] | None = None,
) -> Pick:
    """Keep the fastest of a method's ``measured`` schedules by re-measurement: the
    ``top`` fastest by the task's (cached) in-search times and the untransformed program
    are measured by ``repeats`` fresh measurers each (``new_measurer``; default: no disk
    cache, the task measurer's threads), and the candidate with the highest median
    speedup is kept (a tie keeps the untransformed program, then the faster in search).
    In the paired timing the untransformed binary runs beside every candidate, so its
    speedup is 1.0 by construction: a candidate is kept only if its median beats it.
    ``cache`` (schedule key -> median speedup), shared by the methods evaluated on one
    program, re-measures a schedule once for all of them."""
    if new_measurer is None:
        threads = task.measurer.threads

        def new_measurer() -> Measurer:
            return Measurer(disk_cache=False, threads=threads)

    cache = {} if cache is None else cache
    by_key = {s.key: s for s in measured if s.key != task.initial.key}
    ranked = sorted((s for s in by_key.values() if math.isfinite(task.seconds(s))), key=task.seconds)
    cands = [task.initial, *ranked[: max(0, top)]]
    todo = [s for s in cands if s.key not in cache]
    if todo:
        runs: dict[str, list[float]] = {s.key: [] for s in todo}
        for _ in range(max(1, repeats)):
            m = new_measurer()
            base = m.base_seconds(task.program)
            for s in todo:
                t = m.seconds(s)
                runs[s.key].append(base / t if math.isfinite(t) else 0.0)
        cache.update({k: float(np.median(v)) for k, v in runs.items()})
    best = max(cands, key=lambda s: cache[s.key])  # the first maximum: initial, then in-search order
    log.info(
        "pick_best %s: %s",
        task.program.name,
        ", ".join(f"{cache[s.key]:.3f}x{' (kept)' if s is best else ''}" for s in cands),
    )
    return Pick(
        best,
        cache[best.key],
        tuple((s.key, cache[s.key]) for s in cands),
        len(cands) * max(1, repeats),
    )


@dataclass(frozen=True)
class ClimbResult:
    """``hill_climb``'s answer: every measured schedule as ``(seconds, spec, schedule)``,
    fastest first (``spec`` the ``branch:action`` tokens that reach it, for
    :func:`apply_sequence`), and the measurements used."""

    ranked: list[tuple[float, str, Schedule]]
    initial_seconds: float
    measurements: int

    @property
    def best(self) -> tuple[float, str, Schedule]:
        return self.ranked[0]


def hill_climb(
    task: TiramisuTask,
    starts: list[str],
    budget: int,
    min_gain: float = 1.02,
    seed: int = 0,
    skip: tuple[str, ...] = (),
) -> ClimbResult:
    """First-improvement hill climbing over the whole action space (every action on every
    branch, legality-checked; no episode length, no branch order): measure the ``starts``
    (``branch:action`` specs, ``""`` the untransformed program; illegal ones are logged
    and skipped), then from the fastest one measure its neighbours in a random order and
    move to the first that is ``min_gain`` times faster (the margin keeps measurement noise
    from moving it), until a local optimum or ``budget`` measurements. Actions whose kind
    is in ``skip`` (e.g. ``("P",)`` for serial runs) are left out. A tool to find the best
    schedules the action space holds (the ceiling), not a baseline at equal budget."""
    rng = np.random.default_rng(seed)
    b = _Budget(task, max(1, budget))
    t0 = b.seconds(task.initial)
    specs: dict[str, tuple[float, str, Schedule]] = {task.initial.key: (t0, "", task.initial)}
    for spec in starts:
        if b.left <= 0:
            break
        try:
            s = apply_sequence(task, spec)
        except TimeRLError as e:
            log.info("hill_climb: start skipped: %s", e)
            continue
        t = b.seconds(s)
        if math.isfinite(t) and (s.key not in specs or t < specs[s.key][0]):
            specs[s.key] = (t, spec, s)
    cur_t, cur_spec, cur = min(specs.values(), key=lambda x: x[0])
    nbr = len(task.program.branches)
    moves = [(br, a) for br in range(nbr) for a in range(NUM_ACTIONS - 1) if ACTIONS[a].kind not in skip]
    while b.left > 0:
        moved = False
        for j in rng.permutation(len(moves)):
            if b.left <= 0:
                break
            br, a = moves[j]
            new = task.try_action(cur, br, a)
            if new is None or new.key in b.seen:
                continue
            t = b.seconds(new)
            if not math.isfinite(t):
                continue
            spec = f"{cur_spec} {br}:{ACTIONS[a].name}".strip()
            specs.setdefault(new.key, (t, spec, new))
            if t * min_gain < cur_t:
                log.info("hill_climb %s: %.3fx %s", task.program.name, t0 / t, spec)
                cur_t, cur_spec, cur = t, spec, new
                moved = True
                break
        if not moved:
            break
    ranked = sorted(specs.values(), key=lambda x: x[0])
    return ClimbResult(ranked, t0, len(b.seen))
