"""LoopTune search baselines on the deterministic analytic cost model.

No timing is asserted except that a search under a tiny time limit returns (within a
generous multiple of the limit); every other check uses ``max_measurements`` budgets.
"""

from __future__ import annotations

import time

import pytest

from timerl.envs.looptune.ir import ACTIONS, LoopState, Problem, apply_action, initial_state, is_valid
from timerl.envs.looptune.measure import AnalyticCostModel
from timerl.envs.looptune.search import SEARCHES, SearchResult, beam_bfs, beam_dfs, greedy, random_search
from timerl.errors import TimeRLError

P = Problem(64, 80, 96)


class CountingModel:
    """The analytic model, counting the calls that reach it."""

    def __init__(self, delay: float = 0.0) -> None:
        self.model = AnalyticCostModel()
        self.calls = 0
        self.delay = delay

    def gflops(self, state: LoopState) -> float:
        self.calls += 1
        if self.delay:
            time.sleep(self.delay)
        return self.model.gflops(state)


def replay(actions: tuple[str, ...]) -> LoopState:
    s = initial_state(P)
    for a in actions:
        s = apply_action(s, ACTIONS.index(a))
    return s


def children(s: LoopState) -> list[LoopState]:
    return [apply_action(s, i) for i in range(len(ACTIONS)) if is_valid(s, i)]


@pytest.mark.parametrize("name", list(SEARCHES))
def test_search_result_is_consistent_and_not_worse(name: str) -> None:
    """Every search returns a state at least as good as the start, reachable by its
    actions within the episode length, with its measured GFLOPS."""
    model = AnalyticCostModel()
    start = initial_state(P)
    r = SEARCHES[name](start, model, time_limit=30.0, max_measurements=150, seed=1)
    assert isinstance(r, SearchResult)
    assert r.gflops >= model.gflops(start)
    assert len(r.actions) <= 10
    assert replay(r.actions).key == r.state.key
    assert r.gflops == model.gflops(r.state)
    assert 1 <= r.num_measured <= 150


def test_greedy1_takes_the_best_single_action() -> None:
    model = AnalyticCostModel()
    start = initial_state(P)
    values = [(model.gflops(c), i) for i, c in enumerate(children(start))]
    best_value = max(v for v, _ in values)
    assert best_value > model.gflops(start)  # so greedy1 moves at all on this problem
    r = greedy(start, model, lookahead=1, max_measurements=500)
    first = apply_action(start, ACTIONS.index(r.actions[0]))
    assert model.gflops(first) == best_value
    assert r.gflops >= best_value


def test_greedy1_stops_when_no_action_improves() -> None:
    """From its own result, greedy1 finds nothing better one action away and stops."""
    model = AnalyticCostModel()
    r = greedy(initial_state(P), model, lookahead=1)
    assert r.complete
    assert all(model.gflops(c) <= r.gflops for c in children(r.state))


def test_depth2_searches_find_the_exhaustive_optimum() -> None:
    """With depth 2 and full width, beam BFS/DFS and greedy2 see every state within two
    actions, so they all return the best of them."""
    model = AnalyticCostModel()
    start = initial_state(P)
    depth2 = [c2 for c1 in children(start) for c2 in [c1, *children(c1)]]
    best = max(model.gflops(s) for s in depth2)
    width = len(ACTIONS)
    for r in (
        beam_bfs(start, model, width=width, max_steps=2),
        beam_dfs(start, model, width=width, max_steps=2),
        greedy(start, model, lookahead=2, max_steps=2),
    ):
        assert r.complete
        assert r.gflops == best


def test_cursor_only_states_are_one_measurement() -> None:
    """``up``/``down`` change the key but not the schedule: no new measurement."""
    m = CountingModel()
    r = beam_bfs(initial_state(P), m, width=2, max_steps=3)
    assert m.calls == r.num_measured


def test_budget_is_respected_and_stops_the_search() -> None:
    m = CountingModel()
    r = beam_bfs(initial_state(P), m, width=4, max_measurements=40)
    assert not r.complete
    assert r.num_measured == m.calls == 40


@pytest.mark.parametrize("name", ["beam4_bfs", "beam4_dfs", "random"])
def test_time_limit_stops_the_search(name: str) -> None:
    """A tiny limit with a slow measurer (10 ms per state): the search returns, stopped."""
    m = CountingModel(delay=0.01)
    t0 = time.perf_counter()
    r = SEARCHES[name](initial_state(P), m, time_limit=0.2)
    assert not r.complete
    assert time.perf_counter() - t0 < 2.0  # 10x the limit: no tight timing bound
    assert r.gflops >= m.model.gflops(initial_state(P))


def test_random_search_is_reproducible() -> None:
    a = random_search(initial_state(P), AnalyticCostModel(), max_measurements=60, seed=3)
    b = random_search(initial_state(P), AnalyticCostModel(), max_measurements=60, seed=3)
    assert (a.state, a.actions, a.num_measured) == (b.state, b.actions, b.num_measured)
    c = random_search(initial_state(P), AnalyticCostModel(), max_episodes=2, seed=3)
    assert c.complete and c.num_measured <= 21


def test_bad_arguments_raise_with_a_fix() -> None:
    with pytest.raises(TimeRLError, match="time_limit must be > 0"):
        greedy(initial_state(P), AnalyticCostModel(), time_limit=0)
    with pytest.raises(TimeRLError, match="beam width"):
        beam_dfs(initial_state(P), AnalyticCostModel(), width=0)
