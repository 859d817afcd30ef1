"""Session 11's entry levers (no hardware): the initial design (random, Latin hypercube,
max-min distance), the upper-confidence weight's schedule, and a prior (another layer's
measurements) for the cost model."""

from __future__ import annotations

import numpy as np
import pytest

from timerl.envs.release.cost_model import CostModel
from timerl.envs.release.measure import Measurement, MeasurementTable
from timerl.envs.release.sampling import GreedySampler
from timerl.envs.release.search import SimulatedAnnealing
from timerl.envs.release.space import Layer, template_space
from timerl.envs.release.tuner import initial_design, tune
from timerl.errors import TimeRLError

SPACE = template_space(Layer.matmul("mm", 64, 64, 64))  # 10976 points, as in test_search_sampling
TARGET = (4, 5, 2, 2, 1, 1, 0)


def fitness(cfgs) -> np.ndarray:
    d = ((np.asarray(cfgs) - np.asarray(TARGET)) ** 2).sum(-1)
    return 100.0 / (1.0 + d)


class SyntheticMeasurer:
    def measure(self, space, cfg) -> Measurement:
        return Measurement(tuple(cfg), float(fitness([cfg])[0]), True, 0.01)


def _min_dist(cfgs) -> float:
    p = SPACE.normalised(cfgs)
    d = np.sqrt(((p[:, None] - p[None]) ** 2).sum(-1))
    d[np.diag_indices(len(p))] = np.inf
    return float(d.min())


def test_random_design_is_the_old_initial_draw() -> None:
    """``random`` draws exactly what the tuner drew before session 11 (so defaults repeat)."""
    for seed in range(5):
        rng = np.random.default_rng([seed, 1])
        old: list = []
        while len(old) < 8:
            c = SPACE.random(rng)
            if c not in old:
                old.append(c)
        assert initial_design(SPACE, 8, np.random.default_rng([seed, 1])) == old


def test_lhs_uses_every_stratum_of_every_knob_once() -> None:
    """A Latin hypercube of 8 rows: distinct valid configurations; a knob with at least 8 values
    has one row in each eighth of its range, a smaller knob's values are used evenly (each
    value ``8 // size`` or ``8 // size + 1`` times); its rows lie farther apart than random
    designs' (median smallest distance over 20 seeds)."""
    lhs_d, rnd_d = [], []
    for seed in range(20):
        rows = initial_design(SPACE, 8, np.random.default_rng(seed), "lhs")
        assert len(set(rows)) == 8 and all(SPACE.is_valid(r) for r in rows)
        for k, size in enumerate(SPACE.sizes):
            idx = sorted(r[k] for r in rows)
            for j, v in enumerate(idx):  # the j-th smallest index lies in the j-th stratum
                lo = j * size // 8
                assert lo <= v < max(lo + 1, (j + 1) * size // 8), (k, idx)
            counts = np.bincount(idx, minlength=size)
            if size >= 8:
                assert counts.max() == 1
            else:
                assert counts.min() >= 8 // size and counts.max() <= 8 // size + 1
        lhs_d.append(_min_dist(rows))
        rnd_d.append(_min_dist(initial_design(SPACE, 8, np.random.default_rng(seed))))
    assert np.median(lhs_d) > np.median(rnd_d)


def test_maximin_spreads_the_initial_configurations() -> None:
    """Max-min distance: 8 distinct valid configurations whose smallest pairwise distance
    exceeds a random design's in every one of 20 seeds; a bad design name raises."""
    for seed in range(20):
        rows = initial_design(SPACE, 8, np.random.default_rng(seed), "maximin")
        assert len(set(rows)) == 8 and all(SPACE.is_valid(r) for r in rows)
        assert _min_dist(rows) > _min_dist(initial_design(SPACE, 8, np.random.default_rng(seed)))
    with pytest.raises(TimeRLError, match="init_design"):
        initial_design(SPACE, 8, np.random.default_rng(0), "sobol")


@pytest.mark.parametrize("design", ["lhs", "maximin"])
def test_tune_measures_the_design_first(design: str) -> None:
    """``tune(init_design=...)``: the first ``n_init`` measurements are that design (drawn from
    the initial configurations' own stream), and differ from the random ones."""
    res = tune(
        SPACE,
        SimulatedAnnealing(n_iter=20),
        GreedySampler(4),
        SyntheticMeasurer(),
        16,
        seed=2,
        init_design=design,
    )
    first = [m.config for m in res.measurements[:8]]
    assert first == initial_design(SPACE, 8, np.random.default_rng([2, 1]), design)
    assert first != initial_design(SPACE, 8, np.random.default_rng([2, 1]))


class RecordingSA(SimulatedAnnealing):
    """Simulated annealing that records the cost model's UCB weight at every round."""

    def __init__(self) -> None:
        super().__init__(n_iter=20)
        self.weights: list[tuple[int, float]] = []

    def propose(self, space, model, visited, ranked, rng):
        self.weights.append((len(visited), model.ucb))
        return super().propose(space, model, visited, ranked, rng)


def test_ucb_decay_falls_linearly_to_zero() -> None:
    """``ucb_decay=24``: the weight is ``ucb`` in the first round (after 8 initial measurements),
    falls linearly with the measurements, and is 0 from 24 on; without it the weight stays;
    a decay without a UCB, or a negative one, raises."""
    sa = RecordingSA()
    tune(SPACE, sa, GreedySampler(4), SyntheticMeasurer(), 40, seed=0, ensemble=3, ucb=1.0, ucb_decay=24)
    for n, w in sa.weights:
        assert w == pytest.approx(max(0.0, 1.0 - (n - 8) / 16)), n
    assert sa.weights[0] == (8, 1.0) and sa.weights[-1][1] == 0.0
    const = RecordingSA()
    tune(SPACE, const, GreedySampler(4), SyntheticMeasurer(), 24, seed=0, ensemble=3, ucb=1.0)
    assert all(w == 1.0 for _, w in const.weights)
    for bad in (dict(ucb_decay=24), dict(ensemble=3, ucb=1.0, ucb_decay=-1)):
        with pytest.raises(TimeRLError, match="ucb_decay"):
            tune(SPACE, SimulatedAnnealing(n_iter=20), GreedySampler(4), SyntheticMeasurer(), 12, **bad)


def _prior(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    cfgs = list(dict.fromkeys(SPACE.random(rng) for _ in range(n)))
    return SPACE.features(cfgs), fitness(cfgs) / 100.0


def _spearman(a, b) -> float:
    return float(np.corrcoef(np.argsort(np.argsort(a)), np.argsort(np.argsort(b)))[0, 1])


@pytest.mark.parametrize("ensemble", [0, 3])
def test_prior_decides_the_first_model_then_fades(ensemble: int) -> None:
    """With a prior (measurements of the same fitness elsewhere) the model is fitted from 2
    measurements on and orders unseen configurations like the fitness (Spearman > 0.6), where
    the model without one is not fitted (all 0); at ``prior_until`` measurements the prior is
    dropped: the predictions equal the model's without it."""
    rng = np.random.default_rng(5)
    own = list(dict.fromkeys(SPACE.random(rng) for _ in range(40)))[:32]
    test = list(dict.fromkeys(SPACE.random(rng) for _ in range(200)))
    ucb = 0.5 if ensemble else 0.0
    plain = CostModel(SPACE, ensemble=ensemble, ucb=ucb)
    prior = CostModel(SPACE, ensemble=ensemble, ucb=ucb, prior=_prior(300, 1), prior_until=32)
    plain.fit(own[:2], fitness(own[:2]))
    prior.fit(own[:2], fitness(own[:2]))
    assert not plain.predict(test).any() and prior.fits == 1
    assert _spearman(prior.predict(test), fitness(test)) > 0.6
    assert prior.prior_weight(2) == pytest.approx(1 - 2 / 32) and prior.prior_weight(32) == 0.0
    plain.fits = prior.fits  # (an ensemble's resamples are seeded by the fit's number)
    plain.fit(own, fitness(own))
    prior.fit(own, fitness(own))
    np.testing.assert_array_equal(prior.predict(test), plain.predict(test))


def test_prior_bad_settings_raise() -> None:
    x, y = _prior(20, 0)
    with pytest.raises(TimeRLError, match="regression"):
        CostModel(SPACE, objective="rank", prior=(x, y))
    with pytest.raises(TimeRLError, match="prior must be"):
        CostModel(SPACE, prior=(x, y[:-1]))
    with pytest.raises(TimeRLError, match="prior_until"):
        CostModel(SPACE, prior=(x, y), prior_until=0)


def test_table_records_of_one_layer(tmp_path) -> None:
    """``MeasurementTable.records(layer)``: that layer's records under the table's settings only."""
    a, b = Layer.matmul("A", 8, 8, 8), Layer.matmul("B", 8, 8, 8)
    t = MeasurementTable(tmp_path / "t.jsonl", "s1")
    t.add(a, Measurement((0, 1), 5.0, True, 0.1))
    t.add(b, Measurement((1, 1), 7.0, True, 0.1))
    t.add(a, Measurement((1, 0), 0.0, False, 0.1, "fails"))
    MeasurementTable(tmp_path / "t.jsonl", "s2").add(a, Measurement((2, 2), 9.0, True, 0.1))
    again = MeasurementTable(tmp_path / "t.jsonl", "s1")
    assert [m.config for m in again.records(a)] == [(0, 1), (1, 0)]
    assert [m.gflops for m in again.records(b)] == [7.0]
