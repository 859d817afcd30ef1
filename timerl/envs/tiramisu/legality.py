"""Exact dependence analysis (isl dataflow) and the legality of a transformed schedule.

:func:`dependences` computes the memory-based dependences of a program under its
original schedule with ``isl.UnionAccessInfo.compute_flow``: flow (read after write),
anti (write after read) and output (write after write), each exact (the last
conflicting access, kills included). A new schedule ``theta`` is legal when, for every
dependence ``s -> t``, ``theta(t) - theta(s)`` is lexicographically positive; loop
level ``l`` of a branch may run in parallel when no dependence between statements
sharing that loop is carried at its schedule dimension.
"""

from __future__ import annotations

import functools
import logging

import islpy as isl

from timerl.envs.tiramisu.program import Program
from timerl.envs.tiramisu.schedule import Schedule

__all__ = ["dependences", "is_legal", "carried_at", "LegalityChecker"]

log = logging.getLogger("timerl.envs.tiramisu")


def dependences(p: Program) -> isl.UnionMap:
    """All dependences ``S[i] -> T[j]`` (instance ``j`` of T must follow ``i`` of S)."""
    from timerl.envs.tiramisu.schedule import initial_schedule

    sched = initial_schedule(p).isl_map()
    reads, writes = p.reads(), p.writes()

    def flow(sink: isl.UnionMap, must: isl.UnionMap | None, may: isl.UnionMap | None) -> isl.UnionMap:
        ai = isl.UnionAccessInfo.from_sink(sink)
        if must is not None:
            ai = ai.set_must_source(must)
        if may is not None:
            ai = ai.set_may_source(may)
        res = ai.set_schedule_map(sched).compute_flow()
        return res.get_may_dependence()

    raw = flow(reads, writes, None)
    war = flow(writes, writes, reads)  # reads since the last write (kills by writes); drops WAW-only
    waw = flow(writes, writes, None)
    return raw.union(war).union(waw).coalesce()


def _lex_pos(ctx: isl.Context, n: int) -> isl.Set:
    names = [f"d{k}" for k in range(n)]
    disj = []
    for k in range(n):
        eqs = [f"{names[j]} = 0" for j in range(k)] + [f"{names[k]} > 0"]
        disj.append("(" + " and ".join(eqs) + ")")
    return isl.Set.read_from_str(ctx, f"{{ [{', '.join(names)}] : {' or '.join(disj)} }}")


def _deltas(deps: isl.UnionMap, theta: isl.UnionMap) -> isl.Set | None:
    d = deps.apply_domain(theta).apply_range(theta)
    if d.is_empty():
        return None
    return isl.Set.from_union_set(d.deltas())


def is_legal(deps: isl.UnionMap, sched: Schedule) -> bool:
    """Every dependence goes forward in time under ``sched`` (its parallel tags aside)."""
    dl = _deltas(deps, sched.isl_map())
    if dl is None:
        return True
    return dl.is_subset(_lex_pos(sched.program.ctx, sched.width))


def carried_at(deps: isl.UnionMap, sched: Schedule, dim: int) -> bool:
    """Some dependence between instances equal on schedule dims ``< dim`` differs at ``dim``."""
    dl = _deltas(deps, sched.isl_map())
    if dl is None:
        return False
    n = sched.width
    names = [f"d{k}" for k in range(n)]
    cond = " and ".join([f"{names[j]} = 0" for j in range(dim)] + [f"{names[dim]} != 0"])
    probe = isl.Set.read_from_str(sched.program.ctx, f"{{ [{', '.join(names)}] : {cond} }}")
    return not dl.intersect(probe).is_empty()


class LegalityChecker:
    """Legality of schedules of one program, with the dependences computed once and a
    cache by schedule key. A schedule is legal when :func:`is_legal` holds and every
    branch's parallel level carries no dependence."""

    def __init__(self, program: Program) -> None:
        self.program = program
        self._cache: dict[str, bool] = {}

    @functools.cached_property
    def deps(self) -> isl.UnionMap:
        return dependences(self.program)

    def __call__(self, sched: Schedule) -> bool:
        hit = self._cache.get(sched.key)
        if hit is not None:
            return hit
        ok = is_legal(self.deps, sched)
        if ok:
            for lvl in sched.parallel:
                if lvl >= 0 and carried_at(self.deps, sched, 2 * lvl + 1):
                    ok = False
                    break
        self._cache[sched.key] = ok
        return ok
