"""The cost model's two objectives on a synthetic fitness with a known order (no hardware):
regression and the rank objective (LightGBM lambdarank, predictions mapped onto [0, 1] over
the measured configurations), and the tuning loop with the ranker."""

from __future__ import annotations

import numpy as np
import pytest

from timerl.envs.release.cost_model import CostModel
from timerl.envs.release.measure import Measurement
from timerl.envs.release.sampling import GreedySampler
from timerl.envs.release.search import SimulatedAnnealing
from timerl.envs.release.space import Config, KnobSpace, Layer, template_space
from timerl.envs.release.tuner import tune
from timerl.errors import TimeRLError

SPACE = template_space(Layer.matmul("mm", 64, 64, 64))  # 10976 points
TARGET = (4, 5, 2, 2, 1, 1, 0)  # as in test_search_sampling


def fitness(cfgs) -> np.ndarray:
    """Peak 100 at TARGET, falling with the squared index distance."""
    d = ((np.asarray(cfgs) - np.asarray(TARGET)) ** 2).sum(-1)
    return 100.0 / (1.0 + d)


class SyntheticMeasurer:
    def measure(self, space: KnobSpace, cfg: Config) -> Measurement:
        return Measurement(tuple(cfg), float(fitness([cfg])[0]), True, 0.01)


def _configs(n: int, seed: int) -> list[Config]:
    rng = np.random.default_rng(seed)
    out: dict[Config, None] = {}
    while len(out) < n:
        out[SPACE.random(rng)] = None
    return list(out)


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


@pytest.mark.parametrize("objective", ["regression", "rank"])
def test_objectives_order_unseen_configurations(objective: str) -> None:
    """Fitted on 80 configurations, either objective orders 200 unseen ones like the fitness
    (Spearman > 0.6); the ranker's scores span [0, 1] over the measured configurations."""
    cfgs = _configs(280, 0)
    train, test = cfgs[:80], cfgs[80:]
    model = CostModel(SPACE, objective=objective)
    assert not model.predict(test).any()  # before the first fit: all 0
    model.fit(train, fitness(train))
    assert model.fits == 1
    assert _spearman(model.predict(test), fitness(test)) > 0.6
    seen = model.predict(train)
    if objective == "rank":
        assert seen.min() == pytest.approx(0.0) and seen.max() == pytest.approx(1.0)
    assert int(np.argmax(seen)) == int(np.argmax(fitness(train)))  # the best measured ranks first


def test_rank_ignores_the_scale_of_the_target() -> None:
    """A rank objective sees only the order: GFLOPS and any increasing map of them (here
    squared) give the same ranking of unseen configurations."""
    cfgs = _configs(120, 1)
    train, test = cfgs[:60], cfgs[60:]
    a, b = CostModel(SPACE, objective="rank"), CostModel(SPACE, objective="rank")
    a.fit(train, fitness(train))
    b.fit(train, fitness(train) ** 2)
    assert _spearman(a.predict(test), b.predict(test)) > 0.8


def test_bad_objective_raises() -> None:
    with pytest.raises(TimeRLError, match="objective"):
        CostModel(SPACE, objective="pairwise")
    with pytest.raises(TimeRLError, match="features"):
        CostModel(SPACE, features="curve")


def test_itervar_features_order_unseen_configurations() -> None:
    """The cost model on the loop-nest features learns the synthetic fitness too."""
    cfgs = _configs(280, 0)
    train, test = cfgs[:80], cfgs[80:]
    model = CostModel(SPACE, features="itervar")
    model.fit(train, fitness(train))
    assert _spearman(model.predict(test), fitness(test)) > 0.6


def test_tune_with_the_ranker_climbs() -> None:
    """SA + greedy with the rank objective gets within one index step of the optimum
    (fitness >= 50) in 48 measurements, as with regression (test_search_sampling)."""
    res = tune(
        SPACE,
        SimulatedAnnealing(n_iter=60),
        GreedySampler(8, 0.05),
        SyntheticMeasurer(),
        48,
        1,
        objective="rank",
    )
    assert res.best.gflops >= 50.0
