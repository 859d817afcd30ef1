"""Samplers: which of a search's candidate configurations go to the hardware.

- :class:`GreedySampler` (AutoTVM): the ``batch_size`` best candidates by the cost
  model, each slot replaced by a random configuration with probability ``epsilon``. The
  default batch, 64, is AutoTVM's plan: its tuner measures the search's 64 best (the last
  5 % random) before it refits the cost model and searches again; a smaller batch refits
  more often (8: a stronger baseline than AutoTVM, docs/release.md).
- :class:`AdaptiveSampler` (RELEASE, Algorithm 1): k-means over the candidates for
  k = ``k_min``, ``k_min + 1``, ...; the loop stops at the knee of the loss curve (when
  ``knee * loss(k) > loss(k - 1)``, i.e. one more cluster no longer cuts the loss by the
  factor ``knee``) and the last k's centroids are measured. A centroid is snapped to a
  candidate of its cluster (centroids of index vectors are not configurations): with
  ``representative="centroid"`` (the paper) the one nearest to it, with ``"best"`` the
  one the cost model scores highest (the cluster's most promising member). One already
  visited is replaced by the per-knob mode of the candidates (the paper's ``mode(s_Θ)``),
  or, when that is visited too, by the best unvisited candidate by the cost model.
  ``epsilon > 0`` (not in the paper; default 0) replaces each slot with a random
  unvisited configuration with that probability, as greedy sampling does, so that a run
  whose cost model ranks the best basin low still lands there by chance.

Both return unvisited configurations only, at most ``limit`` of them. Against plateaus of
equivalent candidates (:mod:`.diversity`): ``dedup_ties=True`` keeps one candidate per
predicted score before either sampler chooses; greedy's ``knob_weight > 0`` takes its top
k in AutoTVM-style diversity-aware order instead of the plain score order.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence, Set
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from timerl.envs.release.diversity import dedup_ties, diverse_order
from timerl.envs.release.space import Config, KnobSpace
from timerl.errors import TimeRLError

log = logging.getLogger("timerl.envs.release")


class Sampler(Protocol):
    name: str

    def select(
        self,
        space: KnobSpace,
        candidates: Sequence[Config],
        scores: np.ndarray,
        visited: Set[Config],
        limit: int,
        rng: np.random.Generator,
    ) -> list[Config]: ...


def _random_unvisited(space: KnobSpace, taken: Set[Config], rng: np.random.Generator) -> Config | None:
    for _ in range(1000):
        c = space.random(rng)
        if c not in taken:
            return c
    return None


@dataclass(frozen=True)
class GreedySampler:
    """AutoTVM's top-k + epsilon-random (see the module doc)."""

    batch_size: int = 64
    epsilon: float = 0.05
    dedup_ties: bool = False
    knob_weight: float = 0.0
    name: str = "greedy"

    def __post_init__(self) -> None:
        if not 0.0 <= self.epsilon <= 1.0:
            raise TimeRLError(f"greedy sampling: epsilon must be in [0, 1], got {self.epsilon}")
        if self.knob_weight < 0:
            raise TimeRLError(f"greedy sampling: knob_weight must be >= 0, got {self.knob_weight}")

    def select(
        self,
        space: KnobSpace,
        candidates: Sequence[Config],
        scores: np.ndarray,
        visited: Set[Config],
        limit: int,
        rng: np.random.Generator,
    ) -> list[Config]:
        n = min(self.batch_size, limit)
        scores = np.asarray(scores, np.float64)
        order = np.argsort(-scores, kind="stable")
        fresh = [int(j) for j in order if candidates[int(j)] not in visited]
        ranked, scores = [candidates[j] for j in fresh], scores[fresh]
        if self.dedup_ties:
            n_before = len(ranked)
            ranked, scores = dedup_ties(ranked, scores)
            log.debug("greedy sampling: %d of %d candidates have distinct predictions", len(ranked), n_before)
        if self.knob_weight > 0:
            ranked = diverse_order(ranked, scores, self.knob_weight)
        out: list[Config] = []
        taken = set(visited)
        pos = 0
        while len(out) < n:
            pick: Config | None = None
            if rng.random() >= self.epsilon:
                while pos < len(ranked) and ranked[pos] in taken:
                    pos += 1
                if pos < len(ranked):
                    pick = ranked[pos]
            if pick is None:
                pick = _random_unvisited(space, taken, rng)
                if pick is None:
                    break
            out.append(pick)
            taken.add(pick)
        return out


def knee_kmeans(
    points: np.ndarray, k_min: int, k_max: int, knee: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Algorithm 1's loop: k-means for k = k_min.. until ``knee * loss(k) > loss(k - 1)``;
    returns the cluster labels and centroids of the last k kept."""
    from sklearn.cluster import KMeans

    n_distinct = len(np.unique(points, axis=0))
    hi = min(k_max, n_distinct)
    lo = min(k_min, hi)
    best: tuple[np.ndarray, np.ndarray] | None = None
    prev = np.inf
    for k in range(max(lo, 1), hi + 1):
        km = KMeans(n_clusters=k, n_init=3, random_state=seed).fit(points)
        loss = float(km.inertia_)
        if best is not None and knee * loss > prev:
            break
        best, prev = (km.labels_, km.cluster_centers_), loss
    if best is None:
        raise TimeRLError("adaptive sampling: no candidate to cluster")
    return best


@dataclass(frozen=True)
class AdaptiveSampler:
    """RELEASE's adaptive sampling (see the module doc)."""

    k_min: int = 4
    k_max: int = 16
    knee: float = 1.15
    representative: str = "centroid"
    epsilon: float = 0.0
    dedup_ties: bool = False
    name: str = "adaptive"

    def __post_init__(self) -> None:
        if self.representative not in ("centroid", "best"):
            raise TimeRLError(
                f"adaptive sampling: representative must be 'centroid' or 'best', got {self.representative!r}"
            )
        if not 1 <= self.k_min <= self.k_max:
            raise TimeRLError(f"adaptive sampling: need 1 <= k_min <= k_max, got {self.k_min}, {self.k_max}")
        if not 0.0 <= self.epsilon <= 1.0:
            raise TimeRLError(f"adaptive sampling: epsilon must be in [0, 1], got {self.epsilon}")

    def select(
        self,
        space: KnobSpace,
        candidates: Sequence[Config],
        scores: np.ndarray,
        visited: Set[Config],
        limit: int,
        rng: np.random.Generator,
    ) -> list[Config]:
        if self.dedup_ties:  # (the searches hand unvisited candidates, best first)
            n_before = len(candidates)
            candidates, scores = dedup_ties(candidates, scores)
            log.debug(
                "adaptive sampling: %d of %d candidates have distinct predictions", len(candidates), n_before
            )
        cands = list(dict.fromkeys(candidates))
        sc = dict(zip(candidates, np.asarray(scores, np.float64), strict=True))
        if not cands:
            c = _random_unvisited(space, visited, rng)
            return [c] if c is not None and limit > 0 else []
        pts = space.normalised(cands)
        labels, centres = knee_kmeans(pts, self.k_min, self.k_max, self.knee, int(rng.integers(2**31)))
        log.debug("adaptive sampling: k = %d over %d candidates", len(centres), len(cands))
        arr = np.asarray(cands)
        mode = tuple(int(np.bincount(arr[:, d]).argmax()) for d in range(arr.shape[1]))
        if not space.is_valid(mode):
            mode = cands[int(np.argmax([sc[c] for c in cands]))]
        ranked = sorted(cands, key=lambda c: -sc[c])
        out: list[Config] = []
        taken = set(visited)
        for j, centre in enumerate(centres):
            members = [k for k in range(len(cands)) if labels[k] == j]
            if not members:
                continue
            if self.representative == "best":
                near = members[int(np.argmax([sc[cands[k]] for k in members]))]
            else:
                near = members[int(np.argmin(((pts[members] - centre) ** 2).sum(1)))]
            pick: Config | None = cands[near]
            if pick in taken:
                pick = mode if mode not in taken else next((c for c in ranked if c not in taken), None)
            if pick is None:
                pick = _random_unvisited(space, taken, rng)
            if pick is None:
                continue
            out.append(pick)
            taken.add(pick)
        # the most promising clusters first, so a budget cut keeps them
        out.sort(key=lambda c: -sc.get(c, 0.0))
        out = out[:limit]
        if self.epsilon > 0.0:  # (no draw at 0: the paper's sampler keeps its random stream)
            for j in range(len(out)):
                if rng.random() < self.epsilon:
                    r = _random_unvisited(space, taken, rng)
                    if r is not None:
                        taken.add(r)
                        out[j] = r
        return out
