"""RELEASE's cost model: gradient-boosted trees on configuration features, refit after
every batch of measurements (AutoTVM's XGBoost model; here LightGBM's CPU wheel).

The target is each measured configuration's GFLOPS over the best measured so far (an
invalid configuration counts 0), so predictions are on the same [0, ~1] scale whatever the
layer: the searches use them as fitness (simulated annealing) and as reward (PPO). Before
the first fit (or with fewer than ``min_samples`` valid measurements) every prediction is 0.

``objective="rank"`` fits a ranker instead (AutoTVM ranks with a rank loss: only the order
of the configurations matters to a search that keeps the best ones): LightGBM's
``lambdarank`` over all measurements as one query, the relevance of a configuration its
GFLOPS over the best measured quantised to ``0..RANK_LEVELS``, with a linear gain (relevance
``r`` gains ``r``; lambdarank's default ``2^r - 1`` looks almost only at the top few) and
every pair of positions weighted (no truncation), which is closer to a pairwise rank loss. A ranker's raw scores have no
scale, so its predictions are mapped affinely onto the regression's: the lowest score over
the measured configurations goes to 0, the highest to 1 (SA's temperature and the PPO
reward keep their meaning).

``ensemble=n >= 2`` (regression only; off by default) fits ``n`` models, each on a
bootstrap resample of the measurements (drawn with replacement, seeded per fit and member), and
predicts their mean plus ``ucb`` times their standard deviation: an upper confidence bound, so
that the searches (the PPO reward, SA's fitness) and the samplers favour configurations the
model is unsure about as well as those it rates high. :meth:`CostModel.mean_std` gives the two
parts. ``ucb=0`` with an ensemble is the bagged mean.

``prior=(x, y)`` (regression only; off by default): rows of features (of this
model's kind) and targets (GFLOPS over their own best, e.g. another layer's measurements) fitted
beside the measurements, each with weight ``1 - n / prior_until`` where ``n`` is the number of
this run's measurements (so the prior decides the first model, fades, and is dropped at
``prior_until`` measurements); with a prior the model is fitted from the first measurement on.
With an ensemble only the run's own measurements are resampled; every member sees the prior.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

from timerl.envs.release.space import FEATURE_KINDS, Config, KnobSpace
from timerl.errors import TimeRLError

log = logging.getLogger("timerl.envs.release")

OBJECTIVES = ("regression", "rank")
RANK_LEVELS = 30  # lambdarank's default label_gain covers relevance 0..30


def _lightgbm():
    try:
        import lightgbm
    except ImportError as exc:
        raise TimeRLError(
            f"the RELEASE cost model needs lightgbm: pip install 'timerl[release]' (import failed: {exc})"
        ) from exc
    return lightgbm


class CostModel:
    """LightGBM regression (or ranking) trees over :meth:`.KnobSpace.features` of kind
    ``features`` (``"knob"``, or ``"itervar"``: the knob features plus the loop nest's; see
    the module doc)."""

    def __init__(
        self,
        space: KnobSpace,
        n_estimators: int = 100,
        num_leaves: int = 15,
        learning_rate: float = 0.1,
        min_samples: int = 4,
        seed: int = 0,
        objective: str = "regression",
        features: str = "knob",
        ensemble: int = 0,
        ucb: float = 0.0,
        prior: tuple[np.ndarray, np.ndarray] | None = None,
        prior_until: int = 64,
    ) -> None:
        if objective not in OBJECTIVES:
            raise TimeRLError(f"cost model: objective must be one of {OBJECTIVES}, got {objective!r}")
        if features not in FEATURE_KINDS:
            raise TimeRLError(f"cost model: features must be one of {FEATURE_KINDS}, got {features!r}")
        if ensemble < 0 or ensemble == 1:
            raise TimeRLError(f"cost model: ensemble must be 0 (off) or >= 2 members, got {ensemble}")
        if ensemble and objective != "regression":
            raise TimeRLError(
                "cost model: an ensemble (upper confidence bound) needs the regression objective"
            )
        if ucb < 0 or (ucb and not ensemble):
            raise TimeRLError(
                f"cost model: ucb must be >= 0 and needs an ensemble, got ucb={ucb}, ensemble={ensemble}"
            )
        if prior is not None:
            if objective != "regression":
                raise TimeRLError("cost model: a prior needs the regression objective")
            px, py = (np.asarray(prior[0], np.float32), np.asarray(prior[1], np.float64))
            if px.ndim != 2 or len(px) != len(py) or not len(py):
                raise TimeRLError(
                    f"cost model: prior must be (features (n, d), targets (n,)) with n >= 1, got shapes "
                    f"{px.shape} and {py.shape}"
                )
            prior = (px, py)
        if prior_until < 1:
            raise TimeRLError(f"cost model: prior_until must be >= 1 measurement, got {prior_until}")
        self.prior = prior
        self.prior_until = prior_until
        self.space = space
        self.features = features
        self.ensemble = ensemble
        self.ucb = ucb
        self.seed = seed
        self.objective = objective
        self.params = dict(
            n_estimators=n_estimators,
            num_leaves=num_leaves,
            learning_rate=learning_rate,
            min_child_samples=2,
            subsample=1.0,
            n_jobs=1,
            verbose=-1,
            random_state=seed,
        )
        self.min_samples = min_samples
        self.model = None
        self.members: list = []  # the ensemble's models (ensemble >= 2)
        self.fits = 0
        self._scale = (0.0, 1.0)  # rank: (offset, span) mapping raw scores onto [0, 1]

    def fit(self, configs: Sequence[Config], gflops: Sequence[float]) -> None:
        """Refit on every measurement so far (``gflops``: 0 for invalid configurations)."""
        y = np.asarray(gflops, np.float64)
        if len(configs) != len(y):
            raise TimeRLError(f"cost model: {len(configs)} configurations but {len(y)} measurements")
        wp = self.prior_weight(len(y))
        if wp <= 0 and ((y > 0).sum() < self.min_samples or y.max() <= 0):
            return
        lgb = _lightgbm()
        x = self.space.features(configs, self.features)
        if wp > 0:
            y = y / y.max() if len(y) and y.max() > 0 else y
            model = self._fit_members(lgb, x, y, wp)
        elif self.objective == "rank":
            rel = np.rint(y / y.max() * RANK_LEVELS).astype(np.int64)
            model = lgb.LGBMRanker(
                objective="lambdarank",
                lambdarank_truncation_level=len(y),
                label_gain=list(range(RANK_LEVELS + 1)),
                **self.params,
            )
            model.fit(x, rel, group=[len(y)])
            raw = np.asarray(model.predict(x), np.float64)
            lo, hi = float(raw.min()), float(raw.max())
            self._scale = (lo, hi - lo if hi > lo else 1.0)
        elif self.ensemble:
            model = self._fit_members(lgb, x, y / y.max())
        else:
            model = lgb.LGBMRegressor(**self.params)
            model.fit(x, y / y.max())
        self.model = model
        self.fits += 1

    def prior_weight(self, n: int) -> float:
        """The weight of each prior row when the run has ``n`` measurements (0 without a prior)."""
        if self.prior is None:
            return 0.0
        return max(0.0, 1.0 - n / self.prior_until)

    def _fit_members(self, lgb, x: np.ndarray, y: np.ndarray, wp: float = 0.0):
        """One regressor per ensemble member on a bootstrap resample of (x, y) (without an
        ensemble: one regressor on all rows), with the prior's rows at weight ``wp`` beside
        them when ``wp > 0``; keeps the members (with an ensemble) and returns the first."""
        rng = np.random.default_rng([self.seed, self.fits, 7])
        members = []
        for j in range(max(self.ensemble, 1)):
            idx = rng.integers(len(y), size=len(y)) if self.ensemble else np.arange(len(y))
            m = lgb.LGBMRegressor(**{**self.params, "random_state": self.seed + j})
            if wp > 0:
                px, py = self.prior
                xs = np.concatenate([x[idx].reshape(len(idx), px.shape[1]), px])
                w = np.concatenate([np.ones(len(idx)), np.full(len(py), wp)])
                m.fit(xs, np.concatenate([y[idx], py]), sample_weight=w)
            else:
                m.fit(x[idx], y[idx])
            members.append(m)
        if self.ensemble:
            self.members = members
        return members[0]

    def mean_std(self, configs: Sequence[Config]) -> tuple[np.ndarray, np.ndarray]:
        """The ensemble's mean prediction and its standard deviation over the members, per
        configuration (without an ensemble: the prediction and zeros)."""
        if not self.ensemble or self.model is None or not len(configs):
            return self._predict_one(configs), np.zeros(len(configs))
        x = self.space.features(configs, self.features)
        preds = np.stack([np.asarray(m.predict(x), np.float64) for m in self.members])
        return preds.mean(0), preds.std(0)

    def predict(self, configs: Sequence[Config]) -> np.ndarray:
        """Predicted GFLOPS over the best measured, per configuration (float64); with an
        ensemble, the mean plus ``ucb`` standard deviations."""
        if self.ensemble:
            mean, std = self.mean_std(configs)
            return mean + self.ucb * std
        return self._predict_one(configs)

    def _predict_one(self, configs: Sequence[Config]) -> np.ndarray:
        if self.model is None or not len(configs):
            return np.zeros(len(configs))
        raw = np.asarray(self.model.predict(self.space.features(configs, self.features)), np.float64)
        if self.objective == "rank":
            lo, span = self._scale
            return (raw - lo) / span
        return raw
