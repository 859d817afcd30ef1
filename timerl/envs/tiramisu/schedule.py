"""The schedule of a program: per statement, its loop levels as affine rows over the
original iterators (possibly tiled), plus per-branch parallel / unroll tags; and the
Tiramisu transformations as pure functions ``Schedule -> Schedule | None`` (None: the
transformation does not apply structurally, e.g. a level that does not exist).

Level ``Level(coeffs, tile)`` is the loop ``floor((coeffs . iterators) / tile)`` (tile
0: no floor). Interchange swaps two levels, reversal negates one, skewing adds level
``l`` to level ``l + 1``, tiling inserts two tile loops in front of levels ``l, l+1``:
every transformation keeps the point loops, so each statement's schedule stays
injective. Legality (dependences) is decided elsewhere (:mod:`.legality`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import islpy as isl

from timerl.envs.tiramisu.program import Program

__all__ = [
    "MAX_LEVELS",
    "Level",
    "Schedule",
    "StmtSchedule",
    "initial_schedule",
    "interchange",
    "parallelize",
    "reverse",
    "skew",
    "tile",
    "unroll",
]

MAX_LEVELS = 7  # loop levels per statement after tiling


@dataclass(frozen=True)
class Level:
    """The loop ``floor((coeffs . iterators) / tile)`` (``tile == 0``: no floor)."""

    coeffs: tuple[int, ...]
    tile: int = 0

    def isl_expr(self, iterators: tuple[str, ...]) -> str:
        terms = [f"{c}*{it}" for c, it in zip(self.coeffs, iterators, strict=True) if c != 0]
        e = " + ".join(terms) if terms else "0"
        return f"floor(({e})/{self.tile})" if self.tile else f"({e})"


@dataclass(frozen=True)
class StmtSchedule:
    levels: tuple[Level, ...]
    betas: tuple[int, ...]  # len(levels) + 1


@dataclass(frozen=True)
class Schedule:
    """A program's schedule; ``key`` names it (equal keys run the same code)."""

    program: Program
    stmts: tuple[StmtSchedule, ...]  # aligned with program.statements
    parallel: tuple[int, ...]  # per branch: parallel level or -1
    unroll: tuple[int, ...]  # per branch: unroll factor of the innermost loop (0: none)

    @functools.cached_property
    def key(self) -> str:
        parts = []
        for s in self.stmts:
            lv = ",".join(
                ("t" + str(lvl.tile) + ":" if lvl.tile else "") + " ".join(map(str, lvl.coeffs))
                for lvl in s.levels
            )
            parts.append(f"[{lv}|{' '.join(map(str, s.betas))}]")
        return f"{self.program.uid}:{';'.join(parts)}:p{self.parallel}:u{self.unroll}"

    @property
    def width(self) -> int:
        return 2 * max(len(s.levels) for s in self.stmts) + 1

    def time_exprs(self, k: int) -> list[str]:
        """Statement ``k``'s schedule time as isl expressions, padded with zeros to ``width``."""
        st = self.program.statements[k]
        s = self.stmts[k]
        out: list[str] = [str(s.betas[0])]
        for lvl, b in zip(s.levels, s.betas[1:], strict=True):
            out += [lvl.isl_expr(st.iterators), str(b)]
        return out + ["0"] * (self.width - len(out))

    def isl_map(self) -> isl.UnionMap:
        """The schedule as a union map ``S[i..] -> [t0, ..., t_{width-1}]`` on the domain."""
        p = self.program
        parts = [
            f"{st.name}[{', '.join(st.iterators)}] -> [{', '.join(self.time_exprs(k))}]"
            for k, st in enumerate(p.statements)
        ]
        return isl.UnionMap.read_from_str(p.ctx, "{ " + "; ".join(parts) + " }").intersect_domain(p.domain())

    def branch_of(self, stmt_index: int) -> int:
        name = self.program.statements[stmt_index].name
        for b, names in enumerate(self.program.branches):
            if name in names:
                return b
        raise AssertionError(name)

    def branch_stmts(self, branch: int) -> list[int]:
        names = self.program.branches[branch]
        return [k for k, s in enumerate(self.program.statements) if s.name in names]

    def branch_levels(self, branch: int) -> tuple[Level, ...]:
        return self.stmts[self.branch_stmts(branch)[0]].levels


def initial_schedule(p: Program) -> Schedule:
    stmts = []
    for s in p.statements:
        d = s.depth
        levels = tuple(Level(tuple(int(k == j) for k in range(d))) for j in range(d))
        stmts.append(StmtSchedule(levels, tuple(s.betas)))
    nb = len(p.branches)
    return Schedule(p, tuple(stmts), (-1,) * nb, (0,) * nb)


def _map_branch(sched: Schedule, branch: int, fn) -> Schedule | None:
    stmts = list(sched.stmts)
    for k in sched.branch_stmts(branch):
        new = fn(stmts[k])
        if new is None:
            return None
        stmts[k] = new
    return replace(sched, stmts=tuple(stmts))


def interchange(sched: Schedule, branch: int, level: int) -> Schedule | None:
    """I(l, l+1): swap loop levels ``l`` and ``l + 1`` of the branch."""

    def fn(s: StmtSchedule) -> StmtSchedule | None:
        if level + 1 >= len(s.levels):
            return None
        lv = list(s.levels)
        lv[level], lv[level + 1] = lv[level + 1], lv[level]
        return replace(s, levels=tuple(lv))

    return _map_branch(sched, branch, fn)


def reverse(sched: Schedule, branch: int, level: int) -> Schedule | None:
    """R(l): run loop level ``l`` backwards."""

    def fn(s: StmtSchedule) -> StmtSchedule | None:
        if level >= len(s.levels):
            return None
        lv = list(s.levels)
        lv[level] = Level(tuple(-c for c in lv[level].coeffs), lv[level].tile)
        return replace(s, levels=tuple(lv))

    return _map_branch(sched, branch, fn)


def skew(sched: Schedule, branch: int, level: int) -> Schedule | None:
    """S(l, l+1): level ``l + 1`` becomes ``level(l + 1) + level(l)`` (factor 1; apply
    twice for 2). Only on point loops (not tile loops)."""

    def fn(s: StmtSchedule) -> StmtSchedule | None:
        if level + 1 >= len(s.levels):
            return None
        a, b = s.levels[level], s.levels[level + 1]
        if a.tile or b.tile:
            return None
        new = tuple(x + y for x, y in zip(a.coeffs, b.coeffs, strict=True))
        if max(abs(c) for c in new) > 4:
            return None  # keep coefficients small
        lv = list(s.levels)
        lv[level + 1] = Level(new)
        return replace(s, levels=tuple(lv))

    return _map_branch(sched, branch, fn)


def tile(sched: Schedule, branch: int, level: int, x: int, y: int) -> Schedule | None:
    """T(l, l+1, x, y): tile loops ``l, l+1`` by ``x`` by ``y`` (tile loops go in front)."""

    def fn(s: StmtSchedule) -> StmtSchedule | None:
        if level + 1 >= len(s.levels) or len(s.levels) + 2 > MAX_LEVELS:
            return None
        a, b = s.levels[level], s.levels[level + 1]
        if a.tile or b.tile:
            return None
        lv = list(s.levels)
        lv[level:level] = [Level(a.coeffs, x), Level(b.coeffs, y)]
        betas = s.betas[: level + 1] + (0, 0) + s.betas[level + 1 :]
        return StmtSchedule(tuple(lv), betas)

    out = _map_branch(sched, branch, fn)
    if out is None:
        return None
    par = list(out.parallel)
    if par[branch] > level + 1:  # the parallel tag follows its loop, now two levels deeper
        par[branch] += 2
    return replace(out, parallel=tuple(par))


def parallelize(sched: Schedule, branch: int, level: int) -> Schedule | None:
    """P(l): run loop level ``l`` of the branch in parallel (OpenMP); once per branch."""
    if sched.parallel[branch] >= 0 or level >= len(sched.branch_levels(branch)):
        return None
    par = list(sched.parallel)
    par[branch] = level
    return replace(sched, parallel=tuple(par))


def unroll(sched: Schedule, branch: int, factor: int) -> Schedule | None:
    """U(f): unroll the branch's innermost loop by ``f``."""
    if sched.unroll[branch] == factor:
        return None
    un = list(sched.unroll)
    un[branch] = factor
    return replace(sched, unroll=tuple(un))
