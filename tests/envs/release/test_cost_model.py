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


@pytest.mark.parametrize(
    "model_kw", [dict(objective="rank"), dict(ensemble=3, ucb=1.0)], ids=["ranker", "ucb-ensemble"]
)
def test_tune_with_other_cost_models_climbs(model_kw: dict) -> None:
    """SA + greedy with the rank objective, or over a UCB ensemble (tune's ``ensemble`` /
    ``ucb``, session 10), gets within one index step of the optimum (fitness >= 50) in 48
    measurements, as with regression (test_search_sampling)."""
    res = tune(
        SPACE, SimulatedAnnealing(n_iter=60), GreedySampler(8, 0.05), SyntheticMeasurer(), 48, 1, **model_kw
    )
    assert res.best.gflops >= 50.0


def test_ensemble_predicts_mean_plus_ucb_std() -> None:
    """A bootstrap ensemble (session 10): its mean still orders unseen configurations like the
    fitness; its members disagree (std > 0) on some of them; the prediction is the mean plus
    ``ucb`` standard deviations, so ucb=0 gives the mean and ucb=2 adds twice the spread; a
    refit with the same data and seed gives the same predictions."""
    cfgs = _configs(280, 0)
    train, test = cfgs[:80], cfgs[80:]
    plain = CostModel(SPACE, ensemble=5)
    ucb = CostModel(SPACE, ensemble=5, ucb=2.0)
    assert not ucb.predict(test).any()  # before the first fit: all 0
    for m in (plain, ucb):
        m.fit(train, fitness(train))
    mean, std = ucb.mean_std(test)
    assert len(ucb.members) == 5
    assert (std >= 0).all() and std.max() > 0.01
    assert _spearman(mean, fitness(test)) > 0.6
    np.testing.assert_allclose(plain.predict(test), mean)
    np.testing.assert_allclose(ucb.predict(test), mean + 2.0 * std)
    again = CostModel(SPACE, ensemble=5, ucb=2.0)
    again.fit(train, fitness(train))
    np.testing.assert_array_equal(again.predict(test), ucb.predict(test))


def test_ucb_ranks_an_uncertain_configuration_higher() -> None:
    """Where the members disagree, the upper bound lifts a configuration above the mean's
    order: among unseen configurations, the one with the largest std gains rank against the
    mean's ranking (and the single model has no spread at all)."""
    cfgs = _configs(120, 3)
    train, test = cfgs[:30], cfgs[30:]
    model = CostModel(SPACE, ensemble=8, ucb=3.0)
    model.fit(train, fitness(train))
    mean, std = model.mean_std(test)
    j = int(np.argmax(std))
    rank_mean = int((mean > mean[j]).sum())
    rank_ucb = int((model.predict(test) > model.predict(test)[j]).sum())
    assert rank_ucb < rank_mean
    single = CostModel(SPACE)
    single.fit(train, fitness(train))
    assert not single.mean_std(test)[1].any()


def test_bad_ensemble_settings_raise() -> None:
    with pytest.raises(TimeRLError, match="ensemble"):
        CostModel(SPACE, ensemble=1)
    with pytest.raises(TimeRLError, match="regression"):
        CostModel(SPACE, ensemble=3, objective="rank")
    with pytest.raises(TimeRLError, match="ucb"):
        CostModel(SPACE, ucb=1.0)
    with pytest.raises(TimeRLError, match="ucb"):
        CostModel(SPACE, ensemble=3, ucb=-1.0)
