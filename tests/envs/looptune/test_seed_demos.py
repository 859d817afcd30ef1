"""Demonstrations from a search on this CPU's analytic cost model (``seed_demos``): the
candidates it measures, the demonstrations it makes and the env keeping them."""

from __future__ import annotations

import timerl as trl
from timerl.envs.looptune.analytic import AnalyticCostModel, host_vector_isa
from timerl.envs.looptune.ir import ACTIONS, Problem, apply_action, canonical, initial_state
from timerl.envs.looptune.seed_demos import model_candidates, search_demos, tile_actions

PROBLEMS = [Problem(64, 96, 80), Problem(128, 64, 112), Problem(96, 128, 64)]


def test_host_model_reads_the_vector_extension() -> None:
    lanes, registers = host_vector_isa()
    assert (lanes, registers) in ((8, 16), (16, 32))
    m = AnalyticCostModel.for_host()
    assert m.lanes == lanes and 0 < m.register_floats < registers * lanes
    # the defaults of the CI model are unchanged
    assert AnalyticCostModel().register_floats == 256 and AnalyticCostModel().unroll_vectors == 0


def test_tile_actions_build_the_register_tile() -> None:
    s = initial_state(Problem(128, 128, 128))
    for a in tile_actions(4, 16):
        s = apply_action(s, a)
    assert s.schedule_key == "mm_128x128x128|c:m32,n8,k128,m4,n16|w:m128,n128"


def test_candidates_are_distinct_new_schedules_with_a_register_tile() -> None:
    model = AnalyticCostModel.for_host()
    p = Problem(128, 112, 96)
    cands = model_candidates(p, model, top=2, tiles_top=2)
    keys = [canonical(s).schedule_key for _, s in cands]
    assert len(cands) == 4 and len(set(keys)) == 4
    assert canonical(initial_state(p)).schedule_key not in keys
    assert any(path in {tile_actions(a, b) for a in (2, 4, 8) for b in (8, 16, 32, 64)} for path, _ in cands)
    for path, s in cands:  # each path leads to its state within an episode
        t = initial_state(p)
        for a in path:
            t = apply_action(t, a)
        assert t == s and len(path) <= 10


def test_search_demos_seed_the_env_and_never_keep_a_loss() -> None:
    model = AnalyticCostModel()
    demos = search_demos(PROBLEMS, model, model=AnalyticCostModel.for_host())
    assert demos and all(d.speedup > 1.0 for d in demos)
    for d in demos:
        s = initial_state(Problem.from_name(d.problem))
        for a in d.actions:
            s = apply_action(s, a)
        ratio = model.gflops(s) / model.gflops(initial_state(Problem.from_name(d.problem)))
        assert abs(ratio - d.speedup) < 1e-9 and all(0 <= a < len(ACTIONS) for a in d.actions)
    with trl.Context(dims=("b",)) as ((_, B),):
        env = trl.env.make("looptune.mm", num_envs=B, problems=PROBLEMS, measurer="analytic", reward="log")
    assert env.seed_demonstrations(demos) == len(demos)
    assert env.seed_demonstrations(demos) == 0  # not faster than the kept ones
    assert {name for name in env.demonstrations} == {d.problem for d in demos}
