"""The plateau filters (:mod:`timerl.envs.release.diversity`) and the samplers with them: a
plateau of candidates with tied predictions collapses to one, the diversity-aware order
prefers new knob values, and with no ties nothing changes."""

from __future__ import annotations

import numpy as np
import pytest

from timerl.envs.release.diversity import check_mode, dedup_ties, diverse_order
from timerl.envs.release.sampling import AdaptiveSampler, GreedySampler
from timerl.envs.release.space import Layer, template_space
from timerl.errors import TimeRLError

N_TIED = 10  # the plateau: the first N_TIED candidates of plateau()
# knobs: tile_i, tile_j, tile_k, unroll, explicit, vectorize, parallel
SPACE = template_space(Layer.matmul("mm", 64, 64, 64))


def plateau() -> tuple[list, np.ndarray]:
    """Ten configurations that differ only in the unroll and parallel knobs (score 0.9, tied), then six
    distinct ones with distinct lower scores."""
    tied = [(2, 2, 1, u, e, 0, 0) for u in range(4) for e in range(2)]
    tied += [(2, 2, 1, 0, 0, 0, 1), (2, 2, 1, 1, 0, 0, 1)]
    distinct = [(4, 5, 2, 2, 1, 1, 0), (3, 3, 3, 1, 1, 1, 0), (5, 4, 1, 0, 0, 1, 0), (1, 6, 2, 3, 1, 1, 1)]
    distinct += [(6, 1, 0, 2, 0, 1, 0), (0, 0, 4, 1, 1, 0, 1)]
    cands = tied + distinct
    scores = np.array([0.9] * len(tied) + [0.8, 0.7, 0.6, 0.5, 0.4, 0.3])
    assert all(SPACE.is_valid(c) for c in cands) and len(set(cands)) == len(cands)
    return cands, scores


def distinct_scores(n: int = 40, seed: int = 0) -> tuple[list, np.ndarray]:
    rng = np.random.default_rng(seed)
    cands = list(dict.fromkeys(SPACE.random(rng) for _ in range(n)))
    scores = rng.permutation(len(cands)) / len(cands)  # all different
    return cands, scores


def test_dedup_ties_keeps_one_per_score() -> None:
    cands, scores = plateau()
    kept, ks = dedup_ties(cands, scores)
    assert kept[0] == cands[0] and kept[1:] == cands[N_TIED:]  # the first of the plateau, then the rest
    assert list(ks) == [0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3]


def test_dedup_ties_without_ties_is_the_identity() -> None:
    cands, scores = distinct_scores()
    kept, ks = dedup_ties(cands, scores)
    assert kept == cands and np.array_equal(ks, scores)
    with pytest.raises(TimeRLError, match="2 configurations but 1 scores"):
        dedup_ties(cands[:2], scores[:1])


def test_diverse_order() -> None:
    """Weight 0: the score order. On the plateau with weight 1: after its first member, the
    best distinct candidate (all knob values but one new) comes before the other members
    (one or two new values each); a larger weight moves the distinct ones further up."""
    cands, scores = plateau()
    assert diverse_order(cands, scores, 0.0) == cands
    order = diverse_order(cands, scores, 1.0)
    assert sorted(order) == sorted(cands)  # a permutation
    assert order[0] == cands[0]
    assert order[1] == cands[N_TIED]
    plateau_in_batch = [
        len(set(diverse_order(cands, scores, w)[:8]) & set(cands[:N_TIED])) for w in (0, 1, 2)
    ]
    assert plateau_in_batch[0] == 8 and plateau_in_batch[0] > plateau_in_batch[1] > plateau_in_batch[2]
    with pytest.raises(TimeRLError, match="knob_weight"):
        diverse_order(cands, scores, -1.0)


@pytest.mark.parametrize("knob_weight", [0.0, 1.0])
def test_greedy_on_a_plateau_measures_distinct_predictions(knob_weight: float) -> None:
    """Plain greedy measures 8 members of the plateau; with ties removed it measures one of
    them and the 6 distinct candidates, then random configurations (the pool ran out)."""
    cands, scores = plateau()
    plain = GreedySampler(8, 0.0).select(SPACE, cands, scores, set(), 100, np.random.default_rng(0))
    assert plain == cands[:8]
    sampler = GreedySampler(8, 0.0, dedup_ties=True, knob_weight=knob_weight)
    got = sampler.select(SPACE, cands, scores, set(), 100, np.random.default_rng(0))
    again = sampler.select(SPACE, cands, scores, set(), 100, np.random.default_rng(0))
    assert got == again and len(got) == 8 and len(set(got)) == 8
    assert len(set(got) & set(cands[:N_TIED])) == 1
    assert set(cands[N_TIED:]) <= set(got)


def test_samplers_unchanged_without_ties() -> None:
    """With distinct scores, de-duplication changes no greedy (epsilon 0.05) or adaptive
    batch for the same random stream."""
    cands, scores = distinct_scores()
    visited = {cands[3]}
    for seed in range(3):
        a = GreedySampler(8, 0.05).select(SPACE, cands, scores, visited, 20, np.random.default_rng(seed))
        b = GreedySampler(8, 0.05, dedup_ties=True).select(
            SPACE, cands, scores, visited, 20, np.random.default_rng(seed)
        )
        assert a == b
        a = AdaptiveSampler().select(SPACE, cands, scores, visited, 20, np.random.default_rng(seed))
        b = AdaptiveSampler(dedup_ties=True).select(
            SPACE, cands, scores, visited, 20, np.random.default_rng(seed)
        )
        assert a == b


def test_adaptive_on_a_plateau_clusters_distinct_predictions() -> None:
    """Adaptive sampling with ties removed measures at most one plateau member."""
    cands, scores = plateau()
    got = AdaptiveSampler(k_min=2, k_max=6, dedup_ties=True).select(
        SPACE, cands, scores, set(), 100, np.random.default_rng(0)
    )
    assert len(got) == len(set(got)) >= 2
    assert len(set(got) & set(cands[:N_TIED])) <= 1


def test_bad_settings() -> None:
    assert check_mode("ties") == "ties"
    with pytest.raises(TimeRLError, match="diversity must be one of none, ties, knobs"):
        check_mode("spread")
    with pytest.raises(TimeRLError, match="knob_weight"):
        GreedySampler(knob_weight=-0.5)
    with pytest.raises(TimeRLError, match="epsilon"):
        GreedySampler(epsilon=2.0)
