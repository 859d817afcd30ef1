"""A learned cost model of measured schedules: gradient-boosted trees (lightgbm) on
fixed-length features of ``(program, schedule)``, predicting the log speedup over the
untransformed program, with an uncertainty from a small bagged ensemble.

Features (:func:`schedule_features`):

- the program: statement and branch counts, ``log2`` of its statement instances, and the
  mean and max over its statements of the access-matrix features of the state
  (:func:`.features._comp_features`), so trees can tell programs apart;
- the schedule, per branch (the first ``MAX_BRANCHES``) and loop level: the iterator-node
  features of the state (log extent, tile, parallel / unroll tags, shift, shared loop,
  schedule row) at fixed positions; per branch the number of levels, the innermost
  loop's log extent, the unroll factor and whether it is parallel;
- locality: per branch, the memory strides of its accesses along the innermost point
  loop (the direction that loop walks in the original iteration space, from the inverse
  of the point levels' matrix): the fraction of accesses with stride 0, 1 and larger, and
  the mean ``log2(1 + |stride|)``.

:func:`schedule_from_key` rebuilds a schedule from its cache key, so the measurements on
disk (:class:`.measure.Measurer`) are training data.
"""

from __future__ import annotations

import functools
import logging
import math
import re
from collections.abc import Sequence
from types import ModuleType

import numpy as np

from timerl.envs.tiramisu.features import COMP_FEATURES, ITER_FEATURES, _comp_features, _extent
from timerl.envs.tiramisu.program import Program, affine_row
from timerl.envs.tiramisu.schedule import MAX_LEVELS, Level, Schedule, StmtSchedule
from timerl.errors import TimeRLError

__all__ = [
    "MAX_BRANCHES",
    "NUM_COST_FEATURES",
    "CostModel",
    "CostModelError",
    "require_lightgbm",
    "schedule_features",
    "schedule_from_key",
    "spearman",
]

log = logging.getLogger("timerl.envs.tiramisu")

MAX_BRANCHES = 4  # branches with their own feature slots (later ones are pooled into none)
_PROG = 3 + 2 * COMP_FEATURES
_BRANCH = MAX_LEVELS * ITER_FEATURES + 4 + 4
NUM_COST_FEATURES = _PROG + MAX_BRANCHES * _BRANCH


class CostModelError(TimeRLError):
    """Bad input to the cost model (unfitted, too few points, a key of another program)."""


# -- features --------------------------------------------------------------------------
@functools.lru_cache(maxsize=256)
def _program_features(p: Program) -> np.ndarray:
    comps = np.stack([_comp_features(p, k) for k in range(len(p.statements))])
    head = [len(p.statements), len(p.branches), math.log2(max(p.flops_points, 1))]
    return np.concatenate([np.asarray(head, np.float32), comps.mean(0), comps.max(0)]).astype(np.float32)


def _direction(levels: Sequence[Level], depth: int) -> np.ndarray | None:
    """The step in the original iterators of the innermost point loop (None if the point
    levels are not a square invertible matrix)."""
    rows = [lvl.coeffs for lvl in levels if not lvl.tile]
    if len(rows) != depth:
        return None
    m = np.asarray(rows, np.float64)
    try:
        return np.linalg.solve(m, np.eye(depth)[-1])
    except np.linalg.LinAlgError:
        return None


@functools.lru_cache(maxsize=4096)
def _strides(p: Program, stmt: int, levels: tuple[Level, ...]) -> tuple[float, float, float, float]:
    st = p.statements[stmt]
    v = _direction(levels, st.depth)
    if v is None:
        return (0.0, 0.0, 0.0, 0.0)
    arrays = p.array_map
    out = []
    for acc in (st.write, *st.reads):
        shape = arrays[acc.array].shape
        elem = [int(np.prod(shape[k + 1 :])) for k in range(len(shape))]
        s = 0.0
        for r, e in enumerate(acc.index):
            row = affine_row(e, st.iterators)[:-1]
            s += float(np.dot(row, v)) * elem[r]
        out.append(abs(s))
    a = np.asarray(out)
    return (
        float(np.mean(a < 0.5)),
        float(np.mean((a >= 0.5) & (a < 1.5))),
        float(np.mean(a >= 1.5)),
        float(np.mean(np.log2(1.0 + a))),
    )


def schedule_features(sched: Schedule) -> np.ndarray:
    """The cost model's features of ``sched`` (``NUM_COST_FEATURES`` float32; module doc)."""
    p = sched.program
    x = np.zeros(NUM_COST_FEATURES, np.float32)
    x[:_PROG] = _program_features(p)
    for b in range(min(len(p.branches), MAX_BRANCHES)):
        stmts = sched.branch_stmts(b)
        levels = sched.stmts[stmts[0]].levels
        base = _PROG + b * _BRANCH
        for li, lvl in enumerate(levels[:MAX_LEVELS]):
            v = x[base + li * ITER_FEATURES : base + (li + 1) * ITER_FEATURES]
            v[0] = math.log2(_extent(p, stmts[0], lvl) + 1.0)
            v[1] = lvl.tile
            v[2] = float(lvl.tile > 0)
            v[3] = float(sched.parallel[b] == li)
            v[4] = sched.unroll[b] if li == len(levels) - 1 else 0.0
            v[5] = 0.0  # (the state's focus flag: not part of the schedule)
            v[6] = lvl.shift
            v[7] = float(
                any(
                    k not in stmts
                    and len(s.levels) > li
                    and s.betas[: li + 1] == sched.stmts[stmts[0]].betas[: li + 1]
                    for k, s in enumerate(sched.stmts)
                )
            )
            v[8 : 8 + len(lvl.coeffs)] = lvl.coeffs
        tail = base + MAX_LEVELS * ITER_FEATURES
        x[tail] = len(levels)
        x[tail + 1] = math.log2(_extent(p, stmts[0], levels[-1]) + 1.0)
        x[tail + 2] = sched.unroll[b]
        x[tail + 3] = float(sched.parallel[b] >= 0)
        st = np.mean([_strides(p, k, sched.stmts[k].levels) for k in stmts], axis=0)
        x[tail + 4 : tail + 8] = st
    return x


# -- schedules from cache keys -------------------------------------------------------------
_KEY = re.compile(r"^(?P<uid>[^:]+):(?P<stmts>.*):p\((?P<par>[^)]*)\):u\((?P<unr>[^)]*)\)(@\d+)?$")


def _ints(s: str) -> tuple[int, ...]:
    return tuple(int(v) for v in s.replace(",", " ").split())


def schedule_from_key(program: Program, key: str) -> Schedule:
    """The schedule of ``program`` whose :attr:`Schedule.key` (optionally with the
    measurer's ``@threads`` suffix) is ``key``; CostModelError if it is not one."""
    m = _KEY.match(key)
    if m is None or m["uid"] != program.uid:
        raise CostModelError(f"{key[:80]!r} is not a schedule key of program {program.uid}")
    parts = re.findall(r"\[([^\]]*)\]", m["stmts"])
    if len(parts) != len(program.statements):
        raise CostModelError(
            f"{key[:80]!r}: {len(parts)} statements, program {program.name} has {len(program.statements)}"
        )
    stmts = []
    for part in parts:
        lv, betas = part.split("|")
        levels = []
        for item in lv.split(","):
            tile = 0
            if item.startswith("t"):
                t, item = item[1:].split(":", 1)
                tile = int(t)
            shift = 0
            if "+" in item:
                item, sh = item.split("+")
                shift = int(sh)
            levels.append(Level(_ints(item), tile, shift))
        stmts.append(StmtSchedule(tuple(levels), _ints(betas)))
    par, unr = _ints(m["par"]), _ints(m["unr"])
    if len(par) != len(program.branches) or len(unr) != len(program.branches):
        raise CostModelError(f"{key[:80]!r}: parallel/unroll tags do not match {program.name}'s branches")
    sched = Schedule(program, tuple(stmts), par, unr)
    if sched.key != key.split("@")[0]:
        raise CostModelError(f"{key[:80]!r} does not round-trip (parsed {sched.key[:80]!r})")
    return sched


# -- the model -----------------------------------------------------------------------------
def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's rank correlation of two equal-length sequences (average ranks for ties)."""
    if len(a) != len(b) or len(a) < 3:
        raise CostModelError(
            f"spearman: need two equal-length sequences of >= 3 values, got {len(a)}, {len(b)}"
        )
    ra, rb = _ranks(a), _ranks(b)
    if ra.std() == 0 or rb.std() == 0:
        raise CostModelError("spearman: a constant sequence has no ranking")
    return float(np.corrcoef(ra, rb)[0, 1])


def _ranks(a: Sequence[float]) -> np.ndarray:
    v = np.asarray(a, np.float64)
    r = np.empty(len(v))
    r[np.argsort(v, kind="mergesort")] = np.arange(len(v))
    _, inv = np.unique(v, return_inverse=True)
    return (np.bincount(inv, r) / np.bincount(inv))[inv]


def require_lightgbm() -> ModuleType:
    """The ``lightgbm`` module, checked with the scikit-learn it needs for ``LGBMRegressor``
    (lightgbm imports without it and fails only when a model is made); raises
    :class:`CostModelError` naming the extra to install."""
    try:
        import lightgbm
        import sklearn  # noqa: F401  (lightgbm.LGBMRegressor needs it)
    except ImportError as e:
        raise CostModelError(
            f"the Tiramisu cost model needs lightgbm and scikit-learn ({e}): pip install 'timerl[tiramisu]', "
            "or train with --surrogate off"
        ) from e
    return lightgbm


class CostModel:
    """Bagged gradient-boosted trees predicting ``log(speedup)`` of schedules.

    ``members`` lightgbm regressors, each on a bootstrap sample of the points (seeds
    ``seed .. seed + members - 1``); :meth:`predict` returns the members' mean and their
    standard deviation (the uncertainty the surrogate measures by)."""

    def __init__(
        self, members: int = 5, seed: int = 0, n_estimators: int = 200, min_points: int = 16
    ) -> None:
        if members < 2:
            raise CostModelError(
                f"CostModel: members must be >= 2 (the spread is the uncertainty), got {members}"
            )
        self.members = members
        self.seed = seed
        self.n_estimators = n_estimators
        self.min_points = min_points
        self._models: list = []
        self.num_points = 0

    @property
    def fitted(self) -> bool:
        return bool(self._models)

    def fit(self, x: np.ndarray, y: np.ndarray) -> CostModel:
        """Fit on features ``x`` ``(n, NUM_COST_FEATURES)`` and targets ``y`` (log speedups)."""
        lgb = require_lightgbm()
        x = np.asarray(x, np.float32)
        y = np.asarray(y, np.float64)
        if x.ndim != 2 or y.shape != (x.shape[0],):
            raise CostModelError(f"CostModel.fit: x {x.shape} and y {y.shape} do not match")
        if x.shape[0] < self.min_points:
            raise CostModelError(f"CostModel.fit: {x.shape[0]} points, need at least {self.min_points}")
        if not np.all(np.isfinite(y)):
            raise CostModelError("CostModel.fit: targets must be finite (leave failed schedules out)")
        rng = np.random.default_rng(self.seed)
        models = []
        for k in range(self.members):
            idx = rng.integers(0, x.shape[0], x.shape[0])
            m = lgb.LGBMRegressor(
                n_estimators=self.n_estimators,
                learning_rate=0.05,
                num_leaves=15,
                min_child_samples=3,
                colsample_bytree=0.5,
                random_state=self.seed + k,
                n_jobs=1,
                verbose=-1,
            )
            m.fit(x[idx], y[idx])
            models.append(m)
        self._models = models
        self.num_points = int(x.shape[0])
        return self

    def predict(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(mean, std)`` of the members' predicted log speedups for ``x`` ``(n, F)``."""
        if not self._models:
            raise CostModelError("CostModel.predict before fit")
        x = np.asarray(x, np.float32)
        if x.ndim != 2 or x.shape[1] != self._models[0].n_features_in_:
            raise CostModelError(
                f"CostModel.predict: x has shape {x.shape}, the model takes (n, "
                f"{self._models[0].n_features_in_})"
            )
        preds = np.stack([m.predict(x) for m in self._models])
        return preds.mean(0), preds.std(0)
