"""Searches over the cost model: each proposes candidate configurations with their
predicted fitness, and a sampler (:mod:`.sampling`) picks which to measure.

- :class:`SimulatedAnnealing`: AutoTVM's ``SimulatedAnnealingOptimizer``: ``parallel_size``
  walkers (persistent across calls), each step moves every walker to a random neighbour
  (one knob changed) and accepts with probability ``exp(min((s' - s) / temp, 1))`` while the
  temperature falls linearly from ``temp[0]`` to ``temp[1]``; a heap keeps the
  ``plan_size`` best unvisited configurations seen; stops after ``n_iter`` steps or
  ``early_stop`` steps without a heap change. The heap is the candidate set.
- RELEASE's PPO agent is a timerl RT program (:mod:`.study`, the env is
  :mod:`.env`); it implements the same :class:`Search` protocol.
"""

from __future__ import annotations

import heapq
from collections.abc import Set
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from timerl.envs.release.cost_model import CostModel
from timerl.envs.release.space import Config, KnobSpace


@dataclass(frozen=True)
class Candidates:
    """Configurations proposed by a search and the cost model's score of each."""

    configs: tuple[Config, ...]
    scores: np.ndarray


class Search(Protocol):
    name: str

    def propose(
        self,
        space: KnobSpace,
        model: CostModel,
        visited: Set[Config],
        best: list[Config],
        rng: np.random.Generator,
    ) -> Candidates:
        """Candidates for the next batch; ``best``: the measured configurations, best first."""
        ...


def top_unvisited(configs: list[Config], scores: np.ndarray, visited: Set[Config], n: int) -> Candidates:
    """The ``n`` best-scored distinct unvisited configurations of ``configs``."""
    best: dict[Config, float] = {}
    for c, s in zip(configs, scores, strict=True):
        if c not in visited and (c not in best or s > best[c]):
            best[c] = float(s)
    top = heapq.nlargest(n, best.items(), key=lambda kv: kv[1])
    return Candidates(tuple(c for c, _ in top), np.array([s for _, s in top]))


@dataclass
class SimulatedAnnealing:
    """AutoTVM's simulated annealing over the cost model (see the module doc). Not frozen:
    the walkers (``points``) persist from one call to the next, as in AutoTVM."""

    plan_size: int = 64
    parallel_size: int = 128
    n_iter: int = 500
    early_stop: int = 50
    temp: tuple[float, float] = (1.0, 0.0)
    name: str = "sa"
    points: list[Config] = field(default_factory=list)

    def propose(
        self,
        space: KnobSpace,
        model: CostModel,
        visited: Set[Config],
        best: list[Config],
        rng: np.random.Generator,
    ) -> Candidates:
        if len(self.points) != self.parallel_size:
            self.points = [space.random(rng) for _ in range(self.parallel_size)]
        points = list(self.points)
        scores = model.predict(points)
        heap: list[tuple[float, int, Config]] = []  # min-heap of the plan_size best unvisited
        in_heap: set[Config] = set()
        tie = 0

        def offer(cfgs: list[Config], sc: np.ndarray) -> bool:
            nonlocal tie
            changed = False
            for c, s in zip(cfgs, sc, strict=True):
                if c in visited or c in in_heap:
                    continue
                if len(heap) < self.plan_size:
                    heapq.heappush(heap, (float(s), tie, c))
                elif s > heap[0][0]:
                    _, _, old = heapq.heapreplace(heap, (float(s), tie, c))
                    in_heap.discard(old)
                else:
                    continue
                in_heap.add(c)
                tie += 1
                changed = True
            return changed

        offer(points, scores)
        t, t_end = self.temp
        cool = (t - t_end) / max(self.n_iter, 1)
        last_change = 0
        for k in range(self.n_iter):
            new = [space.neighbour(p, rng) for p in points]
            new_scores = model.predict(new)
            accept = rng.random(len(points)) < np.exp(np.minimum((new_scores - scores) / (t + 1e-5), 1.0))
            points = [n if a else p for p, n, a in zip(points, new, accept, strict=True)]
            scores = np.where(accept, new_scores, scores)
            if offer(new, new_scores):
                last_change = k
            if k - last_change > self.early_stop:
                break
            t -= cool
        self.points = points
        top = sorted(heap, reverse=True)
        return Candidates(tuple(c for _, _, c in top), np.array([s for s, _, _ in top]))
