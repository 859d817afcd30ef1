"""Simulated annealing, the samplers and the tuning loop on synthetic cost functions with a
known optimum (no hardware: a measurer object that evaluates the function)."""

from __future__ import annotations

import numpy as np
import pytest

from timerl.envs.release.measure import Measurement
from timerl.envs.release.sampling import AdaptiveSampler, GreedySampler, knee_kmeans
from timerl.envs.release.search import SimulatedAnnealing
from timerl.envs.release.space import Layer, template_space
from timerl.envs.release.tuner import local_picks, tune, walk_picks
from timerl.errors import TimeRLError

SPACE = template_space(Layer.matmul("mm", 64, 64, 64))  # 7 x 7 x 7 x 4 x 2 x 2 x 2 = 10976 points
TARGET = (4, 5, 2, 2, 1, 1, 0)  # tiles 16 x 32 (512 elements), k 4, unroll 32, explicit, vectorised


def fitness(cfgs) -> np.ndarray:
    """Peak 100 at TARGET, falling with the squared index distance."""
    d = ((np.asarray(cfgs) - np.asarray(TARGET)) ** 2).sum(-1)
    return 100.0 / (1.0 + d)


class Oracle:
    """A perfect cost model: the fitness itself."""

    def predict(self, cfgs) -> np.ndarray:
        return fitness(cfgs) / 100.0 if len(cfgs) else np.zeros(0)


class SyntheticMeasurer:
    def __init__(self, invalid_all: bool = False) -> None:
        self.invalid_all = invalid_all
        self.calls = 0

    def measure(self, space, cfg) -> Measurement:
        self.calls += 1
        if self.invalid_all:
            return Measurement(tuple(cfg), 0.0, False, 0.01, "fails to build")
        return Measurement(tuple(cfg), float(fitness([cfg])[0]), True, 0.01)


def test_sa_finds_the_optimum_of_the_model() -> None:
    """With a perfect model, AutoTVM's annealing puts the optimum first among its candidates,
    and never proposes a visited configuration."""
    assert SPACE.is_valid(TARGET)
    sa = SimulatedAnnealing(plan_size=16, parallel_size=32, n_iter=300)
    cands = sa.propose(SPACE, Oracle(), set(), [], np.random.default_rng(0))
    assert cands.configs[0] == TARGET
    assert list(cands.scores) == sorted(cands.scores, reverse=True)
    again = sa.propose(SPACE, Oracle(), {TARGET}, [], np.random.default_rng(1))
    assert TARGET not in again.configs and len(again.configs) == 16


def test_greedy_takes_top_k_unvisited() -> None:
    """epsilon = 0: exactly the best unvisited candidates by score, best first."""
    rng = np.random.default_rng(0)
    cands = [SPACE.random(rng) for _ in range(20)]
    scores = fitness(cands)
    visited = {cands[int(np.argmax(scores))]}
    got = GreedySampler(batch_size=4, epsilon=0.0).select(SPACE, cands, scores, visited, 10, rng)
    want = [c for c in sorted(set(cands), key=lambda c: -fitness([c])[0]) if c not in visited][:4]
    assert got == want
    assert len(GreedySampler(batch_size=4, epsilon=0.0).select(SPACE, cands, scores, visited, 2, rng)) == 2
    # epsilon = 1: all random, none visited
    rnd = GreedySampler(batch_size=6, epsilon=1.0).select(SPACE, cands, scores, set(cands), 10, rng)
    assert len(rnd) == 6 and not set(rnd) & set(cands)


def test_adaptive_sampling_one_sample_per_cluster() -> None:
    """Three tight clusters of configurations: the knee picks k = 3, one representative per
    cluster is measured, and a visited representative is replaced by an unvisited one."""
    rng = np.random.default_rng(0)
    centres = [(0, 0, 0, 0, 0, 0, 0), (6, 0, 6, 3, 1, 1, 1), (0, 6, 3, 0, 1, 0, 1)]
    cands = []
    for c in centres:
        for k in range(6):
            d = [0] * 7
            d[k % 3 + 2] = 1 if c[k % 3 + 2] == 0 else -1
            cands.append(tuple(int(x) + y for x, y in zip(c, d, strict=True)))
    cands = [c for c in cands if SPACE.is_valid(c)]
    labels, _ = knee_kmeans(SPACE.normalised(cands), 2, 8, 1.5, seed=0)
    assert len(set(labels.tolist())) == 3
    sampler = AdaptiveSampler(k_min=2, k_max=8, knee=1.5)
    scores = np.arange(len(cands), dtype=float)
    got = sampler.select(SPACE, cands, scores, set(), 10, rng)
    assert len(got) == 3
    groups = [
        min(range(3), key=lambda j: sum(abs(a - b) for a, b in zip(g, centres[j], strict=True))) for g in got
    ]
    assert sorted(groups) == [0, 1, 2]
    again = sampler.select(SPACE, cands, scores, set(got), 10, rng)
    assert len(again) == 3 and not set(again) & set(got)


def test_adaptive_sampling_epsilon() -> None:
    """epsilon = 1 sends every slot to a random unvisited configuration (distinct, valid);
    epsilon = 0 leaves the sampler's choice (and random stream) as before."""
    rng = np.random.default_rng(0)
    cands = list(dict.fromkeys(SPACE.random(rng) for _ in range(40)))
    scores = np.arange(len(cands), dtype=float)
    plain = AdaptiveSampler(2, 8, 1.15).select(SPACE, cands, scores, set(), 8, np.random.default_rng(1))
    zero = AdaptiveSampler(2, 8, 1.15, epsilon=0.0).select(
        SPACE, cands, scores, set(), 8, np.random.default_rng(1)
    )
    assert zero == plain
    visited = set(cands[:5])
    rand = AdaptiveSampler(2, 8, 1.15, epsilon=1.0).select(
        SPACE, cands, scores, visited, 8, np.random.default_rng(1)
    )
    assert len(rand) == len(plain) and len(set(rand)) == len(rand)
    assert not set(rand) & visited and all(SPACE.is_valid(c) for c in rand)
    assert set(rand) != set(plain)
    with pytest.raises(TimeRLError, match="epsilon"):
        AdaptiveSampler(epsilon=1.5)


@pytest.mark.parametrize(
    "sampler", [GreedySampler(8, 0.05), AdaptiveSampler(4, 16, 1.15)], ids=["greedy", "adaptive"]
)
def test_tune_climbs_to_the_known_optimum(sampler) -> None:
    """SA + either sampler with the LightGBM model, refit on the synthetic measurements,
    gets within one index step of the optimum of a 10976-point space (fitness >= 50; the
    best of the 8 random initial configurations is far below) within 48 measurements."""
    meas = SyntheticMeasurer()
    res = tune(SPACE, SimulatedAnnealing(n_iter=60), sampler, meas, budget=48, seed=1)
    assert len(res.measurements) == meas.calls <= 48
    assert max(m.gflops for m in res.measurements[:8]) < 30.0
    assert res.best.gflops >= 50.0
    assert len({m.config for m in res.measurements}) == len(res.measurements)  # never measured twice
    n, s = res.to_reach(50.0)
    assert n <= 48 and s == pytest.approx(res.elapsed[n - 1])
    assert res.curve[-1] == res.best.gflops and all(np.diff(res.curve) >= 0)


def test_no_valid_measurement_is_an_error() -> None:
    with pytest.raises(TimeRLError, match="none of the 12 configurations measured is valid"):
        tune(SPACE, SimulatedAnnealing(n_iter=20), GreedySampler(4), SyntheticMeasurer(True), budget=12)


def _changed(a, b) -> int:
    return sum(x != y for x, y in zip(a, b, strict=True))


def test_neighbourhood_is_every_valid_config_one_or_two_knobs_away() -> None:
    """Against brute force over the whole 10976-point space: no duplicates, nothing invalid,
    nothing missing."""
    import itertools

    cfg = (1, 2, 3, 0, 1, 0, 1)
    near = SPACE.neighbourhood(cfg)
    assert len(near) == len(set(near)) and cfg not in near
    every = [c for c in itertools.product(*(range(n) for n in SPACE.sizes)) if SPACE.is_valid(c)]
    assert set(near) == {c for c in every if 1 <= _changed(c, cfg) <= 2}
    assert set(SPACE.neighbourhood(cfg, 1)) == {c for c in every if _changed(c, cfg) == 1}


def test_local_picks_climb_with_a_perfect_model() -> None:
    """The picks are the model's best unvisited neighbours of the best measured configuration;
    measuring one pick per step from a far configuration reaches the optimum in a few steps
    (two knobs per step: 6 knobs off need 3)."""
    start = (0, 0, 6, 0, 0, 0, 0)
    assert _changed(start, TARGET) == 6
    done = {start: SyntheticMeasurer().measure(SPACE, start)}
    picks = local_picks(SPACE, Oracle(), done, 3)
    near = SPACE.neighbourhood(start)
    top = sorted(fitness(near), reverse=True)[:3]
    assert len(picks) == 3 and sorted(fitness(picks), reverse=True) == top
    assert all(p in near for p in picks)
    for _ in range(3):
        p = local_picks(SPACE, Oracle(), done, 1)[0]
        assert p not in done
        done[p] = SyntheticMeasurer().measure(SPACE, p)
    assert max(done, key=lambda c: done[c].gflops) == TARGET


def test_tune_local_slot_leads_every_round() -> None:
    """``local=1``: each round's batch starts with a neighbour (1-2 knobs changed) of the best
    configuration measured before it, whatever the sampler (here: random configurations
    only), and the batch keeps the sampler's size; ``local=0`` does not."""
    for local in (0, 1):
        meas = SyntheticMeasurer()
        res = tune(
            SPACE, SimulatedAnnealing(n_iter=20), GreedySampler(4, 1.0), meas, budget=40, seed=3, local=local
        )
        ms = res.measurements
        assert len(ms) == 40 and res.rounds == 8  # 8 initial, then 8 rounds of 4
        firsts = []
        for r in range(8):
            before = ms[: 8 + 4 * r]
            best = max(before, key=lambda m: m.gflops).config
            firsts.append(1 <= _changed(ms[8 + 4 * r].config, best) <= 2)
        assert all(firsts) if local else not all(firsts)
    with pytest.raises(TimeRLError, match="local"):
        tune(SPACE, SimulatedAnnealing(n_iter=20), GreedySampler(4), SyntheticMeasurer(), budget=12, local=-1)


def test_tile_steps_are_the_one_index_moves_of_tile_knobs() -> None:
    """Against brute force: exactly ``changes`` tile knobs (``tile_*``) moved by one index, the
    other knobs kept, nothing invalid, no duplicates."""
    import itertools

    tiles = [k for k, knob in enumerate(SPACE.knobs) if knob.name.startswith("tile_")]
    assert tiles == [0, 1, 2]
    for cfg in [(1, 2, 3, 0, 1, 0, 1), (0, 6, 0, 3, 0, 1, 1), TARGET]:
        every = [c for c in itertools.product(*(range(n) for n in SPACE.sizes)) if SPACE.is_valid(c)]
        for changes in (1, 2):
            steps = SPACE.tile_steps(cfg, changes)
            want = {
                c
                for c in every
                if all(c[k] == cfg[k] for k in range(len(cfg)) if k not in tiles)
                and sorted(abs(c[k] - cfg[k]) for k in tiles) == [0] * (3 - changes) + [1] * changes
            }
            assert len(steps) == len(set(steps)) and set(steps) == want


def test_walk_picks_escape_a_trap_the_model_hides() -> None:
    """A trap: the best measured configuration is a local optimum of every one-knob move, the
    optimum is a two-knob step away, and the cost model (``local_picks``' guide) ranks that
    step last. Model-free walk picks measure every one-knob step first, then two-knob steps,
    and reach the optimum within the 6 + 12 steps there are; the model's picks do not."""
    trap = (3, 3, 3, 2, 1, 1, 0)
    peak = (4, 2, 3, 2, 1, 1, 0)

    def score(cfgs) -> np.ndarray:
        c = np.asarray(cfgs).reshape(-1, len(trap))
        d = np.abs(c - np.asarray(trap)).sum(-1)
        return np.where((c == np.asarray(peak)).all(-1), 200.0, 100.0 - 10.0 * d)

    class Liar:
        """Trusts the trap: predicts the peak worst of all."""

        def predict(self, cfgs) -> np.ndarray:
            s = score(cfgs) if len(cfgs) else np.zeros(0)
            return np.where(s > 150, -1.0, s)

    def measure(c) -> Measurement:
        return Measurement(c, float(score([c])[0]), True, 0.01)

    assert SPACE.is_valid(trap) and SPACE.is_valid(peak)
    singles = SPACE.tile_steps(trap, 1)
    done = {trap: measure(trap)}
    rng = np.random.default_rng(0)
    order = []
    for _ in range(len(singles) + len(SPACE.tile_steps(trap, 2))):
        (p,) = walk_picks(SPACE, done, 1, rng)
        assert p not in done
        order.append(p)
        done[p] = measure(p)
        if p == peak:
            break
    assert peak in done and set(order[: len(singles)]) == set(singles)
    # picks already taken this round are skipped: with every single excluded, pairs come
    fresh = walk_picks(SPACE, {trap: measure(trap)}, 3, rng, exclude=singles)
    assert len(fresh) == 3 and not set(fresh) & set(singles)
    assert all(p in SPACE.tile_steps(trap, 2) for p in fresh)
    # the model's local picks, one per step for as many steps, never measure the peak
    done = {trap: measure(trap)}
    for _ in range(len(order) + 10):
        (p,) = local_picks(SPACE, Liar(), done, 1)
        done[p] = measure(p)
    assert peak not in done


def _is_tile_step(c, best) -> bool:
    """``c`` moves one or two of the tile knobs (the first three) of ``best`` by one index, nothing else."""
    moved = [abs(x - y) for x, y in zip(c, best, strict=True)]
    return all(m == 0 for m in moved[3:]) and sorted(moved[:3])[-1] == 1 and sum(moved[:3]) in (1, 2)


def test_tune_walk_slot_leads_every_round() -> None:
    """``walk=1``: each round's batch starts with a one-index step of one or two tile knobs of
    the best configuration measured before it (the other knobs kept), whatever the sampler,
    and keeps the sampler's size; ``walk=0`` does not; with ``local=1`` too, the local pick
    comes first and the walk's second; a negative ``walk`` raises."""

    for local, walk in ((0, 0), (0, 1), (1, 1)):
        res = tune(
            SPACE,
            SimulatedAnnealing(n_iter=20),
            GreedySampler(4, 1.0),
            SyntheticMeasurer(),
            budget=40,
            seed=3,
            local=local,
            walk=walk,
        )
        ms = res.measurements
        assert len(ms) == 40 and res.rounds == 8
        steps = []
        for r in range(8):
            before = ms[: 8 + 4 * r]
            best = max(before, key=lambda m: m.gflops).config
            steps.append(_is_tile_step(ms[8 + 4 * r + local].config, best))
            if local:
                assert 1 <= _changed(ms[8 + 4 * r].config, best) <= 2
        assert all(steps) if walk else not all(steps)
    with pytest.raises(TimeRLError, match="walk"):
        tune(SPACE, SimulatedAnnealing(n_iter=20), GreedySampler(4), SyntheticMeasurer(), budget=12, walk=-1)


def test_tune_walk_stall_waits_for_a_stall() -> None:
    """``walk=1, walk_stall=2``: a round's batch starts with a walk step exactly when the two
    rounds before it found no new best (with a sampler drawing only random configurations, a
    random configuration is a step by chance almost never); such rounds and climbing rounds both
    occur here; a negative ``walk_stall`` raises."""

    res = tune(
        SPACE,
        SimulatedAnnealing(n_iter=20),
        GreedySampler(4, 1.0),
        SyntheticMeasurer(),
        budget=88,
        seed=3,
        walk=1,
        walk_stall=2,
    )
    ms = res.measurements
    assert len(ms) == 88 and res.rounds == 20
    flat, fired = 0, []
    for r in range(20):
        before = ms[: 8 + 4 * r]
        best = max(before, key=lambda m: m.gflops)
        stalled = flat >= 2
        assert _is_tile_step(ms[8 + 4 * r].config, best.config) == stalled, r
        fired.append(stalled)
        flat = 0 if max(m.gflops for m in ms[: 12 + 4 * r]) > best.gflops else flat + 1
    assert any(fired) and not all(fired)
    with pytest.raises(TimeRLError, match="walk_stall"):
        tune(
            SPACE,
            SimulatedAnnealing(n_iter=20),
            GreedySampler(4),
            SyntheticMeasurer(),
            budget=12,
            walk_stall=-1,
        )
