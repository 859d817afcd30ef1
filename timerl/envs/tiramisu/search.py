"""Search baselines over the same actions and legality: beam search and random
schedules, each limited to a number of measurements (distinct schedules compiled and
timed, the untransformed one included), so they can be compared with the agent at an
equal measurement budget.

A search state is ``(schedule, focused branch)``; ``next`` moves the focus (no
measurement). Both return the fastest schedule found and the measurements used.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from timerl.envs.tiramisu.actions import ACTIONS, NEXT, NUM_ACTIONS, apply_action
from timerl.envs.tiramisu.env import TiramisuTask
from timerl.envs.tiramisu.schedule import Schedule
from timerl.errors import TimeRLError

__all__ = ["SearchResult", "apply_sequence", "beam_search", "random_search"]


@dataclass(frozen=True)
class SearchResult:
    best: Schedule
    best_seconds: float
    initial_seconds: float
    measurements: int

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

    @property
    def left(self) -> int:
        return self.budget - len(self.seen)

    def seconds(self, s: Schedule) -> float:
        if s.key not in self.seen:
            self.seen[s.key] = self.task.seconds(s)
        return self.seen[s.key]


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
    return SearchResult(best, best_t, t0, len(b.seen))


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
    return SearchResult(best, best_t, t0, len(b.seen))
