"""RELEASE's cost model: gradient-boosted trees on configuration features, refit after
every batch of measurements (AutoTVM's XGBoost model; here LightGBM's CPU wheel).

The target is each measured configuration's GFLOPS over the best measured so far (an
invalid configuration counts 0), so predictions are on the same [0, ~1] scale whatever the
layer: the searches use them as fitness (simulated annealing) and as reward (PPO). Before
the first fit (or with fewer than ``min_samples`` valid measurements) every prediction is 0.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

from timerl.envs.release.space import Config, KnobSpace
from timerl.errors import TimeRLError

log = logging.getLogger("timerl.envs.release")


def _lightgbm():
    try:
        import lightgbm
    except ImportError as exc:
        raise TimeRLError(
            f"the RELEASE cost model needs lightgbm: pip install 'timerl[release]' (import failed: {exc})"
        ) from exc
    return lightgbm


class CostModel:
    """LightGBM regression trees over :meth:`.KnobSpace.features` (see the module doc)."""

    def __init__(
        self,
        space: KnobSpace,
        n_estimators: int = 100,
        num_leaves: int = 15,
        learning_rate: float = 0.1,
        min_samples: int = 4,
        seed: int = 0,
    ) -> None:
        self.space = space
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
        self.fits = 0

    def fit(self, configs: Sequence[Config], gflops: Sequence[float]) -> None:
        """Refit on every measurement so far (``gflops``: 0 for invalid configurations)."""
        y = np.asarray(gflops, np.float64)
        if len(configs) != len(y):
            raise TimeRLError(f"cost model: {len(configs)} configurations but {len(y)} measurements")
        if (y > 0).sum() < self.min_samples or y.max() <= 0:
            return
        lgb = _lightgbm()
        model = lgb.LGBMRegressor(**self.params)
        model.fit(self.space.features(configs), y / y.max())
        self.model = model
        self.fits += 1

    def predict(self, configs: Sequence[Config]) -> np.ndarray:
        """Predicted GFLOPS over the best measured, per configuration (float64)."""
        if self.model is None or not len(configs):
            return np.zeros(len(configs))
        return np.asarray(self.model.predict(self.space.features(configs)), np.float64)
