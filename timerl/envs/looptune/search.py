"""Search baselines of LoopTune (paper §V): greedy, beam BFS / DFS and random search.

Every search explores action sequences of the agent's action space (``ACTIONS``) from a
start state, at most ``max_steps`` actions long (10, the agent's episode length), and
returns the best state it measured. Three limits bound a search, checked before every
measurement (a single measurement is never interrupted, so a search can overrun its
``time_limit`` by one measurement):

- ``time_limit``: wall-clock seconds (60 in the paper);
- ``max_measurements``: distinct states measured (``None``: no bound);
- ``max_steps``: the depth of the search tree.

Each search memoises measurements by ``state.schedule_key`` (the paper: "we implemented
each search with caching to avoid repeating evaluations of the same states"); states that
differ only by the cursor run the same code, so they are one measurement, and
``num_measured`` counts the distinct schedules a search measured. Choices that are ours
where the paper is silent: invalid actions (no-ops) are never children; beam searches
do not expand a state (cursor included) twice, and take the next-best child instead;
greedy and beam searches break GFLOPS ties by ``ACTIONS`` order.

Registry: :data:`SEARCHES` maps ``greedy1, greedy2, beam2_bfs, beam4_bfs, beam2_dfs,
beam4_dfs, random`` to callables ``search(state, measurer, *, time_limit=60.0,
max_steps=10, max_measurements=None, seed=0) -> SearchResult``.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Protocol

from timerl.envs.looptune.ir import ACTIONS, LoopState, apply_action, is_valid
from timerl.errors import TimeRLError

__all__ = [
    "SEARCHES",
    "Search",
    "SearchResult",
    "beam_bfs",
    "beam_dfs",
    "greedy",
    "random_search",
]

log = logging.getLogger(__name__)

DEFAULT_TIME_LIMIT = 60.0
"""Seconds per search, as in the paper's evaluation (§VI-B)."""
DEFAULT_MAX_STEPS = 10
"""Actions per sequence: the agent's episode length."""


class _Gflops(Protocol):
    """What a search needs from a measurer (``Measurer``, ``TVMMeasurer``, ...)."""

    def gflops(self, state: LoopState) -> float: ...


@dataclass(frozen=True)
class SearchResult:
    """The best state a search measured and how it got there.

    **Fields:**

    - ``state``: the best measured state (the start state if nothing beat it);
    - ``gflops``: its measured GFLOPS;
    - ``seconds``: wall-clock seconds the search ran;
    - ``num_measured``: distinct schedules (``state.schedule_key``) the search measured;
    - ``actions``: the action sequence from the start state to ``state``;
    - ``complete``: ``True`` if the search ended on its own, ``False`` if a time or
      measurement limit stopped it.
    """

    state: LoopState
    gflops: float
    seconds: float
    num_measured: int
    actions: tuple[str, ...]
    complete: bool


class Search(Protocol):
    """The signature every entry of :data:`SEARCHES` has."""

    def __call__(
        self,
        state: LoopState,
        measurer: _Gflops,
        *,
        time_limit: float = DEFAULT_TIME_LIMIT,
        max_steps: int = DEFAULT_MAX_STEPS,
        max_measurements: int | None = None,
        seed: int = 0,
    ) -> SearchResult: ...


class _OutOfBudget(Exception):
    """Raised inside a search when its time or measurement limit is reached."""


class _Scorer:
    """Measures the states of one search: memo by key, limits, best state so far."""

    def __init__(
        self, root: LoopState, measurer: _Gflops, time_limit: float, max_measurements: int | None
    ) -> None:
        if not time_limit > 0:
            raise TimeRLError(f"time_limit must be > 0 seconds, got {time_limit}; pass e.g. time_limit=60.0")
        if max_measurements is not None and max_measurements < 1:
            raise TimeRLError(f"max_measurements must be >= 1 or None, got {max_measurements}")
        self._measurer = measurer
        self._start = time.perf_counter()
        self._deadline = self._start + time_limit
        self._max_measurements = max_measurements
        self._memo: dict[str, float] = {}
        self.best_state = root
        self.best_actions: tuple[str, ...] = ()
        self.best_gflops = -math.inf

    def out_of_budget(self) -> bool:
        if time.perf_counter() >= self._deadline:
            return True
        return self._max_measurements is not None and len(self._memo) >= self._max_measurements

    def score(self, state: LoopState, actions: tuple[str, ...]) -> float:
        """GFLOPS of ``state`` (reached by ``actions``), measured at most once per search."""
        key = state.schedule_key
        cached = self._memo.get(key)
        if cached is not None:
            return cached
        if self.out_of_budget():
            raise _OutOfBudget
        value = float(self._measurer.gflops(state))
        self._memo[key] = value
        if value > self.best_gflops:
            self.best_state, self.best_actions, self.best_gflops = state, actions, value
        return value

    def result(self, complete: bool) -> SearchResult:
        return SearchResult(
            state=self.best_state,
            gflops=max(self.best_gflops, 0.0),
            seconds=time.perf_counter() - self._start,
            num_measured=len(self._memo),
            actions=self.best_actions,
            complete=complete,
        )


def _children(state: LoopState) -> Iterator[tuple[str, LoopState]]:
    """``(action name, next state)`` for every valid action, in ``ACTIONS`` order."""
    for index, action in enumerate(ACTIONS):
        if is_valid(state, index):
            yield action, apply_action(state, index)


def _ranked_children(
    scorer: _Scorer, state: LoopState, path: tuple[str, ...]
) -> list[tuple[float, str, LoopState]]:
    """Children measured and sorted best first (ties keep ``ACTIONS`` order)."""
    scored = [(scorer.score(child, (*path, a)), a, child) for a, child in _children(state)]
    scored.sort(key=lambda item: -item[0])
    return scored


def _run(
    body: Callable[[_Scorer], None],
    state: LoopState,
    measurer: _Gflops,
    time_limit: float,
    max_measurements: int | None,
    name: str,
) -> SearchResult:
    scorer = _Scorer(state, measurer, time_limit, max_measurements)
    try:
        scorer.score(state, ())
        body(scorer)
        complete = True
    except _OutOfBudget:
        complete = False
    result = scorer.result(complete)
    log.info(
        "%s: %.2f GFLOPS after %d states in %.1f s (%s)",
        name,
        result.gflops,
        result.num_measured,
        result.seconds,
        "complete" if complete else "stopped at a limit",
    )
    return result


def greedy(
    state: LoopState,
    measurer: _Gflops,
    *,
    lookahead: int = 1,
    time_limit: float = DEFAULT_TIME_LIMIT,
    max_steps: int = DEFAULT_MAX_STEPS,
    max_measurements: int | None = None,
    seed: int = 0,
) -> SearchResult:
    """Greedy search with ``lookahead`` (paper §V).

    At each step, measure every state within ``lookahead`` actions of the current one and
    take the first action toward the best of them; stop when none beats the current
    state (with lookahead 1: when no single action improves), or after ``max_steps``
    actions. Lookahead never reaches past ``max_steps`` actions from the start.
    ``seed`` is unused (the search is deterministic).
    """
    del seed
    if lookahead < 1:
        raise TimeRLError(f"lookahead must be >= 1, got {lookahead}")

    def best_within(scorer: _Scorer, node: LoopState, path: tuple[str, ...], depth: int) -> float:
        best = scorer.score(node, path)
        if depth > 0:
            for a, child in _children(node):
                best = max(best, best_within(scorer, child, (*path, a), depth - 1))
        return best

    def body(scorer: _Scorer) -> None:
        current, path = state, ()
        for step in range(max_steps):
            depth = min(lookahead, max_steps - step) - 1
            target = scorer.score(current, path)
            move: tuple[str, LoopState] | None = None
            for a, child in _children(current):
                value = best_within(scorer, child, (*path, a), depth)
                if value > target:
                    target, move = value, (a, child)
            if move is None:
                return
            current, path = move[1], (*path, move[0])

    return _run(body, state, measurer, time_limit, max_measurements, f"greedy{lookahead}")


def beam_bfs(
    state: LoopState,
    measurer: _Gflops,
    *,
    width: int = 2,
    time_limit: float = DEFAULT_TIME_LIMIT,
    max_steps: int = DEFAULT_MAX_STEPS,
    max_measurements: int | None = None,
    seed: int = 0,
) -> SearchResult:
    """Beam search, breadth first (paper §V "BeamBFS").

    Level by level: measure every child of every frontier state and keep each parent's
    ``width`` best not-yet-expanded children as the next frontier, for ``max_steps``
    levels (up to ``width ** max_steps`` states). ``seed`` is unused.
    """
    del seed
    _check_width(width)

    def body(scorer: _Scorer) -> None:
        frontier: list[tuple[LoopState, tuple[str, ...]]] = [(state, ())]
        expanded = {state.key}
        for _ in range(max_steps):
            next_frontier: list[tuple[LoopState, tuple[str, ...]]] = []
            for node, path in frontier:
                kept = 0
                for _value, a, child in _ranked_children(scorer, node, path):
                    if kept == width:
                        break
                    if child.key not in expanded:
                        expanded.add(child.key)
                        next_frontier.append((child, (*path, a)))
                        kept += 1
            if not next_frontier:
                return
            frontier = next_frontier

    return _run(body, state, measurer, time_limit, max_measurements, f"beam{width}_bfs")


def beam_dfs(
    state: LoopState,
    measurer: _Gflops,
    *,
    width: int = 2,
    time_limit: float = DEFAULT_TIME_LIMIT,
    max_steps: int = DEFAULT_MAX_STEPS,
    max_measurements: int | None = None,
    seed: int = 0,
) -> SearchResult:
    """Beam search, depth first (paper §V "BeamDFS").

    From each state, measure all children and recurse into the ``width`` best ones, best
    first, down to ``max_steps`` actions. A state already expanded at the same or a
    smaller depth is skipped (the next-best child takes its place). Unlike greedy it
    goes on when no child improves. ``seed`` is unused.
    """
    del seed
    _check_width(width)
    expanded_at: dict[str, int] = {state.key: 0}

    def visit(scorer: _Scorer, node: LoopState, path: tuple[str, ...]) -> None:
        depth = len(path) + 1
        if depth > max_steps:
            return
        kept = 0
        for _value, a, child in _ranked_children(scorer, node, path):
            if kept == width:
                break
            if expanded_at.get(child.key, max_steps + 1) <= depth:
                continue
            expanded_at[child.key] = depth
            visit(scorer, child, (*path, a))
            kept += 1

    return _run(
        lambda scorer: visit(scorer, state, ()),
        state,
        measurer,
        time_limit,
        max_measurements,
        f"beam{width}_dfs",
    )


def random_search(
    state: LoopState,
    measurer: _Gflops,
    *,
    time_limit: float = DEFAULT_TIME_LIMIT,
    max_steps: int = DEFAULT_MAX_STEPS,
    max_measurements: int | None = None,
    max_episodes: int | None = None,
    seed: int = 0,
) -> SearchResult:
    """Random search (paper §V): random walks of ``max_steps`` valid actions from ``state``.

    Every state on every walk is measured (cached ones are free). Walks go on until the
    time limit, ``max_measurements`` or ``max_episodes`` walks; with none of the last two
    it always runs for the whole ``time_limit``.
    """
    rng = random.Random(seed)

    def body(scorer: _Scorer) -> None:
        episode = 0
        while max_episodes is None or episode < max_episodes:
            if scorer.out_of_budget():
                raise _OutOfBudget
            node, path = state, ()
            for _ in range(max_steps):
                options = list(_children(node))
                if not options:
                    break
                a, node = rng.choice(options)
                path = (*path, a)
                scorer.score(node, path)
            episode += 1

    return _run(body, state, measurer, time_limit, max_measurements, "random")


def _check_width(width: int) -> None:
    if width < 1:
        raise TimeRLError(f"beam width must be >= 1, got {width}")


SEARCHES: dict[str, Search] = {
    "greedy1": partial(greedy, lookahead=1),
    "greedy2": partial(greedy, lookahead=2),
    "beam2_bfs": partial(beam_bfs, width=2),
    "beam4_bfs": partial(beam_bfs, width=4),
    "beam2_dfs": partial(beam_dfs, width=2),
    "beam4_dfs": partial(beam_dfs, width=4),
    "random": random_search,
}
"""The paper's seven search baselines by name (Fig. 8/9 legend order)."""
