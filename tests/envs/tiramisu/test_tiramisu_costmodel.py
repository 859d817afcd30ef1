"""The cost model (fit / predict on synthetic data and on cached measurements, keys back
to schedules) and the training surrogate: rewards keep their definition with predicted
times, penalties stay, and greedy evaluation episodes are always measured."""

from __future__ import annotations

import math
import sys

import numpy as np
import pytest

from timerl.envs.tiramisu import benchmarks as bm
from timerl.envs.tiramisu.actions import ACTIONS, NEXT, NUM_ACTIONS
from timerl.envs.tiramisu.costmodel import (
    NUM_COST_FEATURES,
    CostModel,
    CostModelError,
    schedule_features,
    schedule_from_key,
    spearman,
)
from timerl.envs.tiramisu.env import PENALTY, EpisodeRecord, TiramisuTask, _TiramisuState
from timerl.envs.tiramisu.measure import Measurer
from timerl.envs.tiramisu.search import apply_sequence
from timerl.envs.tiramisu.surrogate import Surrogate
from timerl.errors import TimeRLError

A = {a.name: k for k, a in enumerate(ACTIONS)}


def test_fit_predict_synthetic() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((300, 12)).astype(np.float32)
    y = 0.8 * x[:, 0] - 0.5 * np.abs(x[:, 3]) + 0.05 * rng.standard_normal(300)
    cm = CostModel(members=3, seed=1).fit(x[:240], y[:240])
    mu, sd = cm.predict(x[240:])
    assert mu.shape == sd.shape == (60,) and np.all(sd >= 0)
    assert spearman(mu, y[240:]) > 0.85
    # shuffled targets: nothing to learn, no ranking on held-out points
    cm_shuf = CostModel(members=3, seed=1).fit(x[:240], rng.permutation(y[:240]))
    assert spearman(cm_shuf.predict(x[240:])[0], y[240:]) < 0.5


def test_bad_input_raises() -> None:
    cm = CostModel(members=2)
    with pytest.raises(CostModelError, match="before fit"):
        cm.predict(np.zeros((1, 4)))
    with pytest.raises(CostModelError, match="at least"):
        cm.fit(np.zeros((3, 4)), np.zeros(3))
    with pytest.raises(CostModelError, match="finite"):
        cm.fit(np.zeros((20, 4)), np.full(20, np.inf))
    with pytest.raises(CostModelError, match="members"):
        CostModel(members=1)
    cm.fit(np.random.default_rng(0).standard_normal((20, 4)), np.arange(20.0))
    with pytest.raises(CostModelError, match="shape"):
        cm.predict(np.zeros((1, 5)))
    with pytest.raises(CostModelError, match="not a schedule key"):
        schedule_from_key(bm.mvt(40), "heat2d-0123456789:[1 0|0 0]:p(-1,):u(0,)")


@pytest.mark.parametrize(
    "program, spec",
    [
        (lambda: bm.mvt(40), "0:U(4) 1:I(0,1) 1:F(1) 1:T(0,1,32,32)"),
        (lambda: bm.jacobi2d(3, 24), "0:S(0,1,2) 1:S(0,1,2) 1:Sh(1) 1:F(2) 1:T(0,1,32,32)"),
        (lambda: bm.seidel2d(3, 24), "0:W(1,2,2) 0:T(1,2,64,64)"),
        (lambda: bm.doitgen(4, 5, 6), "0:P(0) 1:I(2,3) 1:R(3) 1:U(8)"),
    ],
)
def test_keys_round_trip_and_features(program, spec) -> None:
    p = program()
    task = TiramisuTask(p, Measurer(disk_cache=False, threads=1))
    s = apply_sequence(task, spec)
    back = schedule_from_key(p, s.key + "@1")
    assert back == s
    f = schedule_features(s)
    assert f.shape == (NUM_COST_FEATURES,) and np.all(np.isfinite(f))
    assert not np.array_equal(f, schedule_features(task.initial))


def _walk(task: TiramisuTask, n: int) -> list:
    """Up to ``n`` distinct legal schedules, breadth first from the untransformed one."""
    out, seen, frontier = [], {task.initial.key}, [(task.initial, 0)]
    while frontier and len(out) < n:
        s, br = frontier.pop(0)
        for a in range(NUM_ACTIONS):
            if a == NEXT:
                continue
            new = task.try_action(s, br, a)
            if new is not None and new.key not in seen:
                seen.add(new.key)
                out.append(new)
                frontier.append((new, br))
                if len(out) == n:
                    break
    return out


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A disk cache with 24 real measurements of a small jacobi2d."""
    d = tmp_path_factory.mktemp("tiramisu-cache")
    p = bm.jacobi2d(3, 64)
    m = Measurer(cache_dir=d, threads=1)
    scheds = _walk(TiramisuTask(p, m), 24)
    secs = {s.key: m.seconds(s) for s in scheds}
    return d, p, secs


def test_surrogate_trains_on_the_disk_cache(cache) -> None:
    d, p, secs = cache
    m = Measurer(cache_dir=d, threads=1)  # a new process's measurer: reads the records
    sur = Surrogate(m, [p])
    x, y, keys = sur.dataset()
    measured = {k for k, t in secs.items() if math.isfinite(t)}
    assert {k.split("@")[0] for k in keys} >= measured and x.shape == (len(keys), NUM_COST_FEATURES)
    recs = m.records()
    for k, yk in zip(keys, y, strict=True):
        assert yk == pytest.approx(math.log(recs[k].base / recs[k].seconds))
    assert sur.model.fitted and sur.stats.refits == 1
    mu, sd = sur.model.predict(x)
    tol = 0.05 * (y.max() - y.min())
    assert np.all(np.isfinite(mu)) and y.min() - tol <= mu.min() and mu.max() <= y.max() + tol


def _uncached(task: TiramisuTask, m: Measurer, sched) -> int:
    """An action whose legal result is not in ``m``'s cache."""
    for a in range(NUM_ACTIONS):
        new = task.try_action(sched, 0, a) if a != NEXT else None
        if new is not None and m.cached(new) is None:
            return a
    raise AssertionError("every legal child is cached")


def _state(task: TiramisuTask, sur: Surrogate | None) -> _TiramisuState:
    st = _TiramisuState("tiramisu.test", 1, 0, [task], True, 8, sur)
    st.bind({})
    st.reset({"i": 0})
    return st


def test_env_with_predictions_keeps_the_reward(cache) -> None:
    d, p, _ = cache
    m = Measurer(cache_dir=d, threads=1)
    # predict everything not cached: no warm-up, no periodic or uncertainty-driven measurements
    sur = Surrogate(m, [p], warmup=0, measure_every=10**9, max_std=math.inf, best_margin=-math.inf)
    task = TiramisuTask(p, m)
    st = _state(task, sur)
    ep = st.episodes[0]
    runs = m.runs
    # a schedule not in the cache: predicted, never compiled or run
    a = _uncached(task, m, ep.sched)
    new = task.try_action(ep.sched, 0, a)
    t_prev = ep.t
    _, r, _ = st.step(np.array([a]))
    mu, _ = sur.predict(new)
    t_pred = m.base_seconds(p) * math.exp(-mu)
    assert ep.sched == new and ep.t == pytest.approx(t_pred)
    assert r == pytest.approx(math.log(t_prev / t_pred, 4), rel=1e-5)
    assert m.runs == runs and m.cached(new) is None and sur.stats.predicted == 1
    # penalties: an action that does not apply, an illegal one, next
    _, r, _ = st.step(np.array([A["R(4)"]]))  # 3 loops only
    assert r == pytest.approx(PENALTY) and ep.sched == new
    _, r, _ = st.step(np.array([A["I(0,1)"]]))  # t <-> i: illegal on jacobi2d
    assert r == pytest.approx(PENALTY) and ep.sched == new
    _, r, _ = st.step(np.array([NEXT]))
    assert r == pytest.approx(PENALTY)
    _, _, done = st.step(np.array([NEXT]))
    assert done
    rec = st.history[0]
    assert rec.predicted_steps == 1 and rec.final_predicted


def test_env_measures_what_may_be_the_best(cache) -> None:
    d, p, _ = cache
    m = Measurer(cache_dir=d, threads=1)
    # best_margin = inf: every schedule may be the episode's best, so every one is measured
    sur = Surrogate(m, [p], warmup=0, measure_every=10**9, max_std=math.inf, best_margin=math.inf)
    task = TiramisuTask(p, m)
    st = _state(task, sur)
    ep = st.episodes[0]
    t_prev = ep.t
    _, r, _ = st.step(np.array([_uncached(task, m, ep.sched)]))
    assert ep.sched != task.initial and m.cached(ep.sched) is not None and ep.t == m.cached(ep.sched).seconds
    assert r == pytest.approx(math.log(t_prev / ep.t, 4), rel=1e-5)
    assert sur.stats.predicted == 0 and sur.stats.measured == 1


def test_evaluation_refuses_predicted_episodes() -> None:
    from timerl.envs.tiramisu import evaluate as tiramisu_eval

    ok = EpisodeRecord(0, 0, "mvt", 1.0, 0.5, 0.5, "a", "a", (1, 2))
    tiramisu_eval.check_measured([ok])
    bad = EpisodeRecord(0, 0, "mvt", 1.0, 0.5, 0.5, "a", "a", (1, 2), 1, True, True)
    with pytest.raises(TimeRLError, match="predicted"):
        tiramisu_eval.check_measured([ok, bad])


def test_spearman() -> None:
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # ties get their average rank: ranks (1.5, 1.5, 3) vs (1, 2, 3)
    assert spearman([5, 5, 7], [1, 2, 3]) == pytest.approx(np.corrcoef([1.5, 1.5, 3], [1, 2, 3])[0, 1])
    with pytest.raises(CostModelError):
        spearman([1, 2], [1, 2])


def test_periodic_measurements_check_the_prediction(cache) -> None:
    d, p, _ = cache
    m = Measurer(cache_dir=d, threads=1)
    sur = Surrogate(m, [p], warmup=0, measure_every=1)  # every schedule not cached: measured
    task = TiramisuTask(p, m)
    st = _state(task, sur)
    ep = st.episodes[0]
    a = _uncached(task, m, ep.sched)
    new = task.try_action(ep.sched, 0, a)
    mu, _ = sur.predict(new)
    st.step(np.array([a]))
    assert sur.stats.measured == 1 and sur.stats.predicted == 0
    assert sur.online == [(mu, pytest.approx(math.log(m.base_seconds(p) / m.cached(new).seconds)))]


@pytest.mark.parametrize("missing", ["lightgbm", "sklearn"])
def test_surrogate_without_its_libraries_fails_at_construction(tmp_path, monkeypatch, missing) -> None:
    # lightgbm imports without scikit-learn and fails only when a model is made, which in
    # training is minutes in, after compiling; the surrogate checks both when it is made
    monkeypatch.setitem(sys.modules, missing, None)  # `import missing` raises ImportError
    m = Measurer(cache_dir=tmp_path, disk_cache=False)
    with pytest.raises(CostModelError, match=r"timerl\[tiramisu\].*--surrogate off"):
        Surrogate(m, [bm.mvt(6)])
