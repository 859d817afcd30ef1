"""Demonstrations for the agent from a cheap search: rank schedules with the analytic cost
model of this CPU (:meth:`.AnalyticCostModel.for_host`), measure the few best for real.

The paying schedules of a matmul are register tiles (``m/4, k, n/16, m4, n16``: 7
actions from the untuned nest); random episodes almost never find them, and an agent
that imitates its own first gain locks into whatever move paid first (k-blocking,
1.2-1.5x). :func:`search_demos` runs a beam search on the model (no compile, ~0.1 s per
problem), keeps the ``top`` best distinct schedules it saw, measures them with the env's
measurer and returns, per problem, the actions to the fastest one with its measured
speedup over the untuned nest. The env seeds its :class:`~timerl.envs.demos.Demonstrations`
with them (``LoopTuneEnv.seed_demonstrations``): they are what buffer imitation replays
until the agent's own episodes measure something faster. The model only picks what gets
measured; no reward and no kept schedule ever comes from it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from timerl.envs.looptune.analytic import AnalyticCostModel
from timerl.envs.looptune.ir import (
    ACTIONS,
    MAX_LOOPS,
    LoopState,
    Problem,
    apply_action,
    canonical,
    initial_state,
)
from timerl.envs.looptune.measure import Measurer

log = logging.getLogger("timerl.envs.looptune")


@dataclass(frozen=True)
class SeedDemo:
    """The fastest measured candidate of one problem."""

    problem: str
    speedup: float  # measured GFLOPS over the untuned nest's
    gflops: float
    actions: tuple[int, ...]


TILE_FACTORS = ((2, 4, 8), (8, 16, 32, 64))
"""Register tiles tried besides the beam search's states: ``out/a, vec/b, red, out_a, vec_b``."""


def tile_actions(outer: int, inner: int) -> tuple[int, ...]:
    """The 7 actions from an untuned 3-loop nest ``out, red, vec`` (matmul's ``m, k, n``) to
    the register tile ``out/outer, vec/inner, red, out_outer, vec_inner``."""
    names = (f"split_{outer}", "down", "swap_down", "down", f"split_{inner}", "swap_up", "swap_up")
    return tuple(ACTIONS.index(a) for a in names)


def _tiles(problem: Problem, max_loops: int) -> list[tuple[tuple[int, ...], LoopState]]:
    """The register tiles of :data:`TILE_FACTORS` that apply to ``problem`` (every action
    changes the nest), with their actions."""
    kern = problem.kernel
    if len(kern.order) != 3 or kern.order[-1] != kern.vector_dim or kern.order[1] not in kern.reduction_dims:
        return []
    out = []
    for a in TILE_FACTORS[0]:
        for b in TILE_FACTORS[1]:
            s, ok = initial_state(problem), True
            for act in tile_actions(a, b):
                nxt = apply_action(s, act, max_loops)
                ok, s = ok and nxt is not s, nxt
            if ok:
                out.append((tile_actions(a, b), s))
    return out


def model_candidates(
    problem: Problem,
    model: AnalyticCostModel,
    top: int = 2,
    width: int = 16,
    max_steps: int = 10,
    max_loops: int = MAX_LOOPS,
    tiles_top: int = 2,
) -> list[tuple[tuple[int, ...], LoopState]]:
    """Distinct schedules (canonical form) to measure, each with the shortest action sequence
    found to it: the ``tiles_top`` register tiles (:func:`tile_actions`) that ``model`` ranks
    best, then the ``top`` best other schedules that a beam search on ``model`` (``width``
    states per depth, ``max_steps`` actions) reached. The beam rarely reaches a register
    tile: the states on the way rank low. The untuned nest is never a candidate."""
    root = initial_state(problem)
    untuned = canonical(root).schedule_key  # splits that merge back change nothing: not candidates
    best: dict[str, tuple[float, tuple[int, ...], LoopState]] = {}
    beam: list[tuple[tuple[int, ...], LoopState]] = [((), root)]
    seen = {root.key}
    for _ in range(max_steps):
        children = []
        for path, s in beam:
            for a in range(len(ACTIONS)):
                nxt = apply_action(s, a, max_loops)
                if nxt is s or nxt.key in seen:
                    continue
                seen.add(nxt.key)
                g = model.gflops(nxt)
                children.append((g, (*path, a), nxt))
                key = canonical(nxt).schedule_key
                if key not in best or (g, -len(path) - 1) > (best[key][0], -len(best[key][1])):
                    best[key] = (g, (*path, a), nxt)
        if not children:
            break
        children.sort(key=lambda c: -c[0])
        beam = [(path, s) for _, path, s in children[:width]]
    best.pop(untuned, None)
    ranked = sorted(best.values(), key=lambda c: (-c[0], len(c[1])))
    tiles = sorted(
        ((model.gflops(s), path, s) for path, s in (_tiles(problem, max_loops) if max_steps >= 7 else [])),
        key=lambda c: -c[0],
    )
    out: dict[str, tuple[tuple[int, ...], LoopState]] = {}
    for _, path, s in tiles[:tiles_top] + ranked:
        out.setdefault(canonical(s).schedule_key, (path, s))
        if len(out) >= top + min(tiles_top, len(tiles)):
            break
    return list(out.values())


def search_demos(
    problems: Sequence[Problem],
    measurer: Measurer,
    top: int = 2,
    width: int = 16,
    max_steps: int = 10,
    max_loops: int = MAX_LOOPS,
    model: AnalyticCostModel | None = None,
    tiles_top: int = 2,
) -> list[SeedDemo]:
    """Per problem, the fastest of :func:`model_candidates` measured by ``measurer`` (about
    ``top + tiles_top + 1`` measurements with the untuned nest); problems where none beats
    the untuned nest, or the untuned nest fails, get no demonstration."""
    model = model or AnalyticCostModel.for_host()
    cands = {p: model_candidates(p, model, top, width, max_steps, max_loops, tiles_top) for p in problems}
    many = getattr(measurer, "gflops_many", None)
    if many is not None:  # a farm's measurer: every problem's candidates at once
        many([initial_state(p) for p in problems] + [s for c in cands.values() for _, s in c])
    out = []
    for p in problems:
        base = measurer.gflops(initial_state(p))
        if base <= 0:
            continue
        measured = [(measurer.gflops(s), path) for path, s in cands[p]]
        if not measured:
            continue
        g, path = max(measured, key=lambda m: m[0])
        log.info(
            "LoopTune demonstration for %s: %.1f GFLOPS, %.2fx untuned (%s)",
            p.name,
            g,
            g / base,
            ", ".join(ACTIONS[a] for a in path),
        )
        if g > base:
            out.append(SeedDemo(p.name, g / base, g, path))
    return out
