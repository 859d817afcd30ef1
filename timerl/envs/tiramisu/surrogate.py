"""Measure only some schedules during training: a :class:`.costmodel.CostModel` stands in
for the rest.

:meth:`Surrogate.seconds` gives the env the seconds of a new legal schedule and whether
they were measured. A schedule is measured for real (compiled, checked, timed by the
:class:`.measure.Measurer`) when

1. it is already in the measurer's cache (free);
2. the model is not fitted yet, or its program has fewer than ``warmup`` real
   measurements (a new program);
3. it is the ``measure_every``-th schedule not in the cache (a steady share of fresh
   data, also of schedules the model thinks are bad);
4. the ensemble's spread of its predicted log speedup exceeds ``max_std`` (uncertain);
5. its predicted time is below the episode's best time (times ``exp(best_margin)``): it
   may be the episode's best, and the rewards that matter should be real;

otherwise the prediction is used: ``seconds = base * exp(-predicted log speedup)``, with
``base`` the measurer's untransformed time of the program, the scale of real
measurements. Every ``refit_every`` new real measurements the model is refitted on all
real measurements of the env's programs (the disk cache included). A predicted schedule
is never compiled, so a schedule that would fail to compile or compute a wrong result is
not penalised when predicted (legal schedules do neither in the tests).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from timerl.envs.tiramisu.costmodel import (
    CostModel,
    CostModelError,
    require_lightgbm,
    schedule_features,
    schedule_from_key,
)
from timerl.envs.tiramisu.measure import Measurer
from timerl.envs.tiramisu.program import Program
from timerl.envs.tiramisu.schedule import Schedule, initial_schedule

__all__ = ["Surrogate", "SurrogateStats"]

log = logging.getLogger("timerl.envs.tiramisu")


@dataclass
class SurrogateStats:
    """How the surrogate answered: from the cache, measured, predicted; refits."""

    cached: int = 0
    measured: int = 0
    predicted: int = 0
    refits: int = 0
    fit_seconds: float = 0.0

    @property
    def measured_fraction(self) -> float:
        """Real measurements among the schedules not in the cache."""
        n = self.measured + self.predicted
        return self.measured / n if n else 1.0


class Surrogate:
    """The measure-or-predict policy of the module doc, over ``measurer`` and ``programs``."""

    def __init__(
        self,
        measurer: Measurer,
        programs: Sequence[Program],
        measure_every: int = 4,
        max_std: float = 0.15,
        best_margin: float = 0.0,
        refit_every: int = 48,
        warmup: int = 16,
        seed: int = 0,
    ) -> None:
        if measure_every < 1 or refit_every < 1 or warmup < 0:
            raise CostModelError(
                f"Surrogate: measure_every ({measure_every}) and refit_every ({refit_every}) must be >= 1, "
                f"warmup ({warmup}) >= 0"
            )
        require_lightgbm()  # at construction, not at the first refit minutes into a training run
        self.measurer = measurer
        self.programs = {p.uid: p for p in programs}
        self.measure_every = measure_every
        self.max_std = max_std
        self.best_margin = best_margin
        self.refit_every = refit_every
        self.warmup = warmup
        self.model = CostModel(seed=seed)
        self.stats = SurrogateStats()
        self._data: dict[str, tuple[np.ndarray, float]] = {}  # key@threads -> (features, log speedup)
        self._per_program: dict[str, int] = dict.fromkeys(self.programs, 0)
        self._new_since_fit = 0
        self._fresh = 0
        self._pred: dict[str, tuple[float, float]] = {}
        # (predicted, measured log speedup) of the every-measure_every-th schedules, predicted
        # just before they were measured: the model's accuracy on what training visits
        self.online: list[tuple[float, float]] = []
        self._load()
        self._refit()

    # -- data ----------------------------------------------------------------------------
    def _add(self, key: str, sched: Schedule, seconds: float, base: float) -> bool:
        if key in self._data or not (math.isfinite(seconds) and math.isfinite(base) and seconds > 0):
            return False
        self._data[key] = (schedule_features(sched), math.log(base / seconds))
        self._per_program[sched.program.uid] += 1
        return True

    def _load(self) -> None:
        """The measurer's cached real measurements of the programs (records without their
        base are scaled by the cached untransformed time)."""
        recs = self.measurer.records()
        threads = self.measurer.threads
        for key, m in recs.items():
            uid = key.split(":", 1)[0]
            p = self.programs.get(uid)
            if p is None or not m.ok:
                continue
            base = m.base
            if math.isnan(base):
                init = recs.get(f"{initial_schedule(p).key}@{threads}")
                if init is None or not init.ok:
                    continue
                base = init.seconds
            try:
                sched = schedule_from_key(p, key)
            except CostModelError as e:
                log.debug("surrogate: skipping cached record %s: %s", key[:60], e)
                continue
            self._add(key, sched, m.seconds, base)
        log.info("surrogate: %d cached measurements of %d programs", len(self._data), len(self.programs))

    def dataset(self) -> tuple[np.ndarray, np.ndarray, list[str]]:
        """``(features, log speedups, keys)`` of the real measurements it trains on."""
        keys = list(self._data)
        if not keys:
            return np.zeros((0, 0), np.float32), np.zeros(0), []
        x = np.stack([self._data[k][0] for k in keys])
        return x, np.asarray([self._data[k][1] for k in keys]), keys

    def _refit(self) -> None:
        import time

        x, y, _ = self.dataset()
        if len(y) < self.model.min_points:
            return
        t0 = time.perf_counter()
        self.model.fit(x, y)
        self.stats.refits += 1
        self.stats.fit_seconds += time.perf_counter() - t0
        self._new_since_fit = 0
        self._pred.clear()
        log.info("surrogate: fitted on %d measurements (%.1f s)", len(y), time.perf_counter() - t0)

    # -- the policy ----------------------------------------------------------------------
    def _measure(self, sched: Schedule) -> float:
        m = self.measurer.measure(sched)
        self.stats.measured += 1
        base = m.base if not math.isnan(m.base) else self.measurer.base_seconds(sched.program)
        if self._add(f"{sched.key}@{self.measurer.threads}", sched, m.seconds, base):
            self._new_since_fit += 1
            if self._new_since_fit >= self.refit_every:
                self._refit()
        return m.seconds

    def predict(self, sched: Schedule) -> tuple[float, float]:
        """The model's ``(log speedup, spread)`` of ``sched`` (memoised until the next refit)."""
        k = sched.key
        if k not in self._pred:
            mu, sd = self.model.predict(schedule_features(sched)[None])
            self._pred[k] = (float(mu[0]), float(sd[0]))
        return self._pred[k]

    def seconds(self, sched: Schedule, best_seconds: float) -> tuple[float, bool]:
        """``(seconds, measured)`` of ``sched`` in an episode whose best time so far is
        ``best_seconds`` (module doc)."""
        if sched.program.uid not in self.programs:
            raise CostModelError(f"surrogate: program {sched.program.name} is not one of its programs")
        hit = self.measurer.cached(sched)
        if hit is not None:
            self.stats.cached += 1
            return hit.seconds, True
        self._fresh += 1
        if not self.model.fitted or self._per_program[sched.program.uid] < self.warmup:
            return self._measure(sched), True
        if self._fresh % self.measure_every == 0:  # the unbiased sample: check the prediction
            mu, _ = self.predict(sched)
            t = self._measure(sched)
            if math.isfinite(t):
                self.online.append((mu, math.log(self.measurer.base_seconds(sched.program) / t)))
            return t, True
        mu, sd = self.predict(sched)
        t = self.measurer.base_seconds(sched.program) * math.exp(-mu)
        if sd > self.max_std or t < best_seconds * math.exp(self.best_margin):
            return self._measure(sched), True
        self.stats.predicted += 1
        return t, False
