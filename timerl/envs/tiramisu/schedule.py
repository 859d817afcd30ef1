"""The schedule of a program: per statement, its loop levels as affine rows over the
original iterators (possibly tiled), plus per-branch parallel / unroll tags; and the
Tiramisu transformations as pure functions ``Schedule -> Schedule | None`` (None: the
transformation does not apply structurally, e.g. a level that does not exist).

Level ``Level(coeffs, tile, shift)`` is the loop ``floor((coeffs . iterators + shift) /
tile)`` (tile 0: no floor). Interchange swaps two levels, reversal negates one, skewing
adds ``f`` times level ``l`` to level ``l + 1``, the wavefront skew makes levels
``(l, l+1)`` into ``(f * l + (l+1), l)`` (skew then interchange, one step), shifting adds a
constant to one level of one branch, fusion moves the focused branch's statements into
the previous branch's outer loops (their betas), tiling inserts two tile loops in front of
levels ``l, l+1``: every transformation keeps the point loops, so each statement's
schedule stays injective. Legality (dependences) is decided elsewhere (:mod:`.legality`).
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass, replace

import islpy as isl

from timerl.envs.tiramisu.program import Program, affine_row

__all__ = [
    "MAX_LEVELS",
    "MAX_SHIFT",
    "Level",
    "Schedule",
    "StmtSchedule",
    "align_fuse",
    "fuse",
    "initial_schedule",
    "interchange",
    "parallelize",
    "reverse",
    "shift",
    "skew",
    "tile",
    "time_tile",
    "unroll",
    "wavefront",
]

MAX_LEVELS = 7  # loop levels per statement after tiling
MAX_SHIFT = 4  # |shift| of one level
MAX_COEFF = 4  # |coefficient| of a skewed level


@dataclass(frozen=True)
class Level:
    """The loop ``floor((coeffs . iterators + shift) / tile)`` (``tile == 0``: no floor)."""

    coeffs: tuple[int, ...]
    tile: int = 0
    shift: int = 0

    def isl_expr(self, iterators: tuple[str, ...]) -> str:
        terms = [f"{c}*{it}" for c, it in zip(self.coeffs, iterators, strict=True) if c != 0]
        if self.shift:
            terms.append(str(self.shift))
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
                ("t" + str(lvl.tile) + ":" if lvl.tile else "")
                + " ".join(map(str, lvl.coeffs))
                + (f"+{lvl.shift}" if lvl.shift else "")
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
        old = lv[level]
        lv[level] = Level(tuple(-c for c in old.coeffs), old.tile, -old.shift)
        return replace(s, levels=tuple(lv))

    return _map_branch(sched, branch, fn)


def _skewed(a: Level, b: Level, factor: int) -> Level | None:
    """``b + factor * a`` (point loops only), None when a coefficient would exceed MAX_COEFF."""
    if a.tile or b.tile:
        return None
    new = tuple(factor * x + y for x, y in zip(a.coeffs, b.coeffs, strict=True))
    if max(abs(c) for c in new) > MAX_COEFF:
        return None  # keep coefficients small
    return Level(new, 0, factor * a.shift + b.shift)


def skew(sched: Schedule, branch: int, level: int, factor: int = 1) -> Schedule | None:
    """S(l, l+1, f): level ``l + 1`` becomes ``level(l + 1) + f * level(l)``. Only on
    point loops (not tile loops)."""

    def fn(s: StmtSchedule) -> StmtSchedule | None:
        if level + 1 >= len(s.levels):
            return None
        new = _skewed(s.levels[level], s.levels[level + 1], factor)
        if new is None:
            return None
        lv = list(s.levels)
        lv[level + 1] = new
        return replace(s, levels=tuple(lv))

    return _map_branch(sched, branch, fn)


def wavefront(sched: Schedule, branch: int, level: int, factor: int) -> Schedule | None:
    """W(l, l+1, f): levels ``(a, b)`` become ``(f * a + b, a)``: a skew by ``f`` and an
    interchange in one step, so that the inner loop ``a`` runs along a wavefront (e.g.
    seidel2d's ``(t, 2i + j, i)``: the inner loop then carries no dependence)."""

    def fn(s: StmtSchedule) -> StmtSchedule | None:
        if level + 1 >= len(s.levels):
            return None
        a = s.levels[level]
        new = _skewed(a, s.levels[level + 1], factor)
        if new is None:
            return None
        lv = list(s.levels)
        lv[level], lv[level + 1] = new, a
        return replace(s, levels=tuple(lv))

    return _map_branch(sched, branch, fn)


def shift(sched: Schedule, branch: int, level: int, amount: int = 1) -> Schedule | None:
    """Sh(l): loop level ``l`` of the branch's statements runs ``amount`` iterations later
    relative to the other branches' statements that share the loop (the loop-alignment
    step that makes a two-statement time loop tileable). Point loops only; ``|shift| <=
    MAX_SHIFT``. None for a program with one branch (a shift of every statement is a
    translation of the whole schedule: the same code with offset bounds)."""
    if len(sched.program.branches) < 2:
        return None

    def fn(s: StmtSchedule) -> StmtSchedule | None:
        if level >= len(s.levels):
            return None
        old = s.levels[level]
        if old.tile or abs(old.shift + amount) > MAX_SHIFT:
            return None
        lv = list(s.levels)
        lv[level] = replace(old, shift=old.shift + amount)
        return replace(s, levels=tuple(lv))

    return _map_branch(sched, branch, fn)


def fuse(sched: Schedule, branch: int, level: int) -> Schedule | None:
    """F(l): the statements of ``branch`` move into the loops ``0..l`` of the previous
    branch (``branch - 1``): their betas up to level ``l`` become that branch's, and inside
    loop ``l`` they run after every statement already there. Both then run on the same
    schedule dimensions, so isl emits one loop nest where their level expressions agree
    (e.g. after interchanging mvt's second nest, both read ``A[i][j]`` in one pass).
    Fusing into the *previous* branch keeps the env's order (transform a branch, ``next``,
    shift or interchange the next one, fuse it back). None when ``branch`` is the first,
    either branch has no loop ``l``, or nothing changes."""
    if branch < 1:
        return None
    host, mine = sched.branch_stmts(branch - 1), sched.branch_stmts(branch)
    if any(level >= len(sched.stmts[k].levels) for k in host + mine):
        return None
    prefix = sched.stmts[host[0]].betas[: level + 1]
    inside = [
        s.betas[level + 1]
        for k, s in enumerate(sched.stmts)
        if k not in mine and len(s.levels) > level and s.betas[: level + 1] == prefix
    ]
    low = min(sched.stmts[k].betas[level + 1] for k in mine)
    start = max(inside) + 1
    stmts = list(sched.stmts)
    for k in mine:
        b = stmts[k].betas
        stmts[k] = replace(stmts[k], betas=prefix + (start + b[level + 1] - low,) + b[level + 2 :])
    out = replace(sched, stmts=tuple(stmts))
    return None if out.key == sched.key else out


def tile(sched: Schedule, branch: int, level: int, x: int, y: int) -> Schedule | None:
    """T(l, l+1, x, y): tile loops ``l, l+1`` by ``x`` by ``y`` (tile loops go in front).

    Every statement that shares loop ``l`` with the branch (same betas up to it, e.g.
    jacobi2d's two statements under the time loop, or a branch fused with ``F``) is
    tiled with it: tile loops of one branch alone would split a loop the others still
    run as a point loop (illegal as soon as a dependence crosses them)."""

    def fn(s: StmtSchedule) -> StmtSchedule | None:
        if level + 1 >= len(s.levels) or len(s.levels) + 2 > MAX_LEVELS:
            return None
        a, b = s.levels[level], s.levels[level + 1]
        if a.tile or b.tile:
            return None
        lv = list(s.levels)
        lv[level:level] = [Level(a.coeffs, x, a.shift), Level(b.coeffs, y, b.shift)]
        betas = s.betas[: level + 1] + (0, 0) + s.betas[level + 1 :]
        return StmtSchedule(tuple(lv), betas)

    mine = sched.branch_stmts(branch)
    if level + 1 >= len(sched.stmts[mine[0]].levels):
        return None
    prefix = sched.stmts[mine[0]].betas[: level + 1]
    group = [
        k
        for k, s in enumerate(sched.stmts)
        if k in mine or (len(s.levels) > level + 1 and s.betas[: level + 1] == prefix)
    ]
    stmts = list(sched.stmts)
    for k in group:
        new = fn(stmts[k])
        if new is None:
            return None
        stmts[k] = new
    par = list(sched.parallel)
    for b in {sched.branch_of(k) for k in group}:
        if par[b] > level + 1:  # the parallel tag follows its loop, now two levels deeper
            par[b] += 2
    return replace(sched, stmts=tuple(stmts), parallel=tuple(par))


def time_tile(sched: Schedule, branch: int, factor: int, x: int, y: int) -> Schedule | None:
    """TT(f, x, y): time tiling in one step, composed of the single-level transformations
    above. The group is every branch whose statements share loop 0 (the time loop of a
    stencil) with ``branch``, in branch order ``b_0 < b_1 < ...`` (consecutive, all of
    one depth ``d >= 2``). Each branch's level 1 is skewed by ``f`` times level 0
    (:func:`skew`), branch ``b_k`` is shifted by ``k`` at level 1 (:func:`shift`) and fused
    into ``b_{k-1}``'s loops ``0..min(2, d-1)`` (:func:`fuse`: the tiled pair and one more
    loop; a 3-d stencil's innermost loops stay one per statement, which measured 1.9x
    on heat3d against 1.2x fully fused), then levels ``(0, 1)`` of the fused nest are
    tiled by ``x`` by ``y`` (:func:`tile`). jacobi2d's
    ``0:S(0,1,2) 1:S(0,1,2) 1:Sh(1) 1:F(2) 1:T(0,1,32,32)`` is ``TT(2,32,32)`` on branch 0,
    heat3d's ``0:S(0,1,2) 1:S(0,1,2) 1:Sh(1) 1:F(2) 1:T(0,1,32,32)`` too.
    None for a one-branch group (seidel2d, mvt's nests): there is nothing
    to shift or fuse, and the skew + tile it would be is ``S(0,1)`` / ``S(0,1,2)`` then
    ``T(0,1,x,y)`` (on seidel2d it measured 1.01x against the wavefront ``W(1,2,2)``'s 6x). The result is exactly the schedule
    the five-action sequence reaches, so legality is decided by the same dependence test
    (the composite is illegal whenever that schedule is: e.g. jacobi2d with ``f = 1``).
    None when a step does not apply (levels tiled already, depths differ, ...)."""
    mine = sched.branch_stmts(branch)
    prefix = sched.stmts[mine[0]].betas[:1]
    group = sorted({sched.branch_of(k) for k, s in enumerate(sched.stmts) if s.betas[:1] == prefix})
    if len(group) < 2 or group != list(range(group[0], group[0] + len(group))) or len(group) > MAX_SHIFT + 1:
        return None
    depths = {len(sched.stmts[k].levels) for b in group for k in sched.branch_stmts(b)}
    if len(depths) != 1 or min(depths) < 2:
        return None
    depth = depths.pop()
    out: Schedule | None = sched
    for k, b in enumerate(group):
        out = skew(out, b, 0, factor)
        if out is not None and k:
            out = shift(out, b, 1, k)
            out = None if out is None else fuse(out, b, min(2, depth - 1))
        if out is None:
            return None
    return tile(out, group[0], 0, x, y)


def _level_perm(levels: tuple[Level, ...]) -> tuple[int, ...] | None:
    """The iterator each level runs (``levels[j]`` is iterator ``perm[j]``) when every
    level is a plain, untiled, unshifted iterator; else None."""
    perm = []
    for lvl in levels:
        if lvl.tile or lvl.shift or sorted(map(abs, lvl.coeffs)) != [0] * (len(lvl.coeffs) - 1) + [1]:
            return None
        if 1 not in lvl.coeffs:
            return None
        perm.append(lvl.coeffs.index(1))
    return tuple(perm)


def _tile_pairs(levels: tuple[Level, ...]) -> list[tuple[int, int, int]] | None:
    """The tile pairs ``(position, x, y)`` in ``levels``, left to right (each two adjacent
    tiled levels, as :func:`tile` inserts them); None when a tiled level has no partner."""
    pairs, j = [], 0
    while j < len(levels):
        if levels[j].tile:
            if j + 1 >= len(levels) or not levels[j + 1].tile:
                return None
            pairs.append((j, levels[j].tile, levels[j + 1].tile))
            j += 2
        else:
            j += 1
    return pairs


def _level_accesses(p: Program, k: int, perm: tuple[int, ...], arrays: set[str]) -> list[tuple]:
    """Statement ``k``'s accesses to ``arrays`` as ``(array, rows)``, each row its
    coefficients over the *loop levels* (``perm``, zero-padded) and its constant."""
    st = p.statements[k]
    out = []
    for acc in (st.write, *st.reads):
        if acc.array in arrays:
            rows = []
            for e in acc.index:
                r = affine_row(e, st.iterators)
                rows.append((*(r[i] for i in perm), *(0,) * (MAX_LEVELS - len(perm)), r[-1]))
            out.append((acc.array, tuple(rows)))
    return out


def _leading_perm(points: tuple[Level, ...]) -> tuple[int, ...] | None:
    """For point loops (every transformation keeps one per iterator), the iterator each
    one leads: the first permutation ``p`` (in :func:`itertools.permutations` order) with
    a nonzero coefficient of iterator ``p[j]`` in loop ``j`` (the plain iterator of a plain
    loop; ``j`` of a skewed ``i + j`` after ``i``). None when there is none."""
    for p in itertools.permutations(range(len(points))):
        if all(lvl.coeffs[i] for lvl, i in zip(points, p, strict=True)):
            return p
    return None


def _inversions(order: tuple[int, ...] | list[int]) -> int:
    return sum(order[i] > order[j] for i in range(len(order)) for j in range(i + 1, len(order)))


def align_fuse(sched: Schedule, branch: int) -> Schedule | None:
    """FN: align the *next* branch (``branch + 1``) with the focused one and fuse it in, one
    step. The next branch's levels must be plain iterators (not tiled, skewed or shifted:
    the branch was never focused). The iterators of the two branches are matched so that
    most of the next branch's accesses to the arrays both use are the same function of the
    matched iterators as one of the focused branch's accesses to that array (ties: the
    fewest loops swapped against the next branch's current order); then the next branch
    gets the focused branch's transformations and is fused into its loops ``0..l``, ``l =
    min(depths) - 1`` (at most 3, as ``F(l)``). On mvt from branch 0 it is ``1:I(0,1)
    1:F(1)``: the second nest's ``A[j][i]`` becomes the first's ``A[i][j]``, and both read
    ``A`` in one pass (1.85x; tiled, 3.85x). It exists because ``next`` only moves
    forward: the fusion is not reachable from the first nest without the penalised
    ``next`` first. Legality is the usual dependence test of the result. None without a
    next branch, without a shared array, when no matching agrees on a shared access, or
    when nothing changes.

    Branches of one depth: the next branch's levels become the focused
    branch's levels, each row rewritten over the matched iterators (tile sizes and shifts
    kept), so ``FN`` applies after *any* sequence of the focused branch's
    transformations, e.g. a tile and an interchange of its point loops (``0:T(0,1,128,128)
    0:I(2,3)`` or ``0:I(1,2)`` on mvt), a skew or a reversal; ``0:T(0,1,x,y) 0:FN`` is
    ``0:FN 0:T(0,1,x,y)``. Branches of different depths (doitgen's): the focused branch's
    loops must be plain iterators, possibly under tile pairs of :func:`tile`, and the loops are matched by position (:func:`_align_by_position`)."""
    p = sched.program
    if branch + 1 >= len(p.branches):
        return None
    host, mine = sched.branch_stmts(branch), sched.branch_stmts(branch + 1)
    mperm = _level_perm(sched.stmts[mine[0]].levels)
    if mperm is None:
        return None

    def arrays(ks: list[int]) -> set[str]:
        return {a.array for k in ks for a in (p.statements[k].write, *p.statements[k].reads)}

    shared = arrays(host) & arrays(mine)
    if not shared:
        return None
    if p.statements[host[0]].depth != len(mperm):
        return _align_by_position(sched, branch, shared)
    hlevels = sched.stmts[host[0]].levels
    lead = _leading_perm(tuple(lv for lv in hlevels if not lv.tile))
    if lead is None or sched.parallel[branch + 1] >= 0:
        return None
    ident = tuple(range(len(mperm)))
    want = {acc for k in host for acc in _level_accesses(p, k, ident, shared)}
    best: tuple[int, int] | None = None
    match: tuple[int, ...] = ()
    for sigma in itertools.permutations(ident):  # host iterator i <-> next iterator sigma[i]
        hits = sum(acc in want for k in mine for acc in _level_accesses(p, k, sigma, shared))
        score = (hits, -_inversions([mperm.index(sigma[i]) for i in lead]))
        if best is None or score > best:
            best, match = score, sigma
    if best is None or best[0] == 0:
        return None

    def moved(lvl: Level) -> Level:
        coeffs = [0] * len(match)
        for i, c in enumerate(lvl.coeffs):
            coeffs[match[i]] = c
        return Level(tuple(coeffs), lvl.tile, lvl.shift)

    levels = tuple(moved(lv) for lv in hlevels)
    stmts = list(sched.stmts)
    for k in mine:  # the new (tile) loops' betas 0, the statements' own order kept
        b = stmts[k].betas
        stmts[k] = StmtSchedule(levels, b[:1] + (0,) * (len(levels) + 1 - len(b)) + b[1:])
    out = fuse(replace(sched, stmts=tuple(stmts)), branch + 1, min(len(levels) - 1, 3))
    return None if out is None or out.key == sched.key else out


def _align_by_position(sched: Schedule, branch: int, shared: set[str]) -> Schedule | None:
    """:func:`align_fuse` for branches of different depths: the focused branch's loops must be plain iterators, possibly under tile
    pairs of :func:`tile`; among the orders of the next branch's loops, the one under
    which most of its accesses to ``shared`` are the same function of the loop *positions*
    as one of the focused branch's (ties: the fewest swapped pairs, the current order
    first) is reached by adjacent interchanges, the next branch is tiled the same way (the
    same :func:`tile` calls) and fused into the focused one's loops ``0..l``, ``l =
    min(depths) - 1`` (at most 3)."""
    p = sched.program
    host, mine = sched.branch_stmts(branch), sched.branch_stmts(branch + 1)
    hlevels = sched.stmts[host[0]].levels
    pairs = _tile_pairs(hlevels)
    if pairs is None:
        return None
    if _level_perm(tuple(replace(lv, tile=0) for lv in hlevels if lv.tile)) is None:
        return None  # a tile over a skewed, reversed or shifted loop
    hperm = _level_perm(tuple(lv for lv in hlevels if not lv.tile))
    mperm = _level_perm(sched.stmts[mine[0]].levels)
    if hperm is None or mperm is None:
        return None
    want = {acc for k in host for acc in _level_accesses(p, k, hperm, shared)}
    best: tuple[int, int] | None = None
    best_order: tuple[int, ...] = ()
    for order in itertools.permutations(range(len(mperm))):
        perm = tuple(mperm[j] for j in order)
        hits = sum(acc in want for k in mine for acc in _level_accesses(p, k, perm, shared))
        score = (hits, -_inversions(order))
        if best is None or score > best:
            best, best_order = score, order
    if best is None or best[0] == 0:
        return None
    out: Schedule | None = sched
    order = list(best_order)  # bubble sort the current levels into ``order`` by adjacent swaps
    cur = list(range(len(order)))
    for i in range(len(order)):
        for j in range(len(order) - 1 - i):
            if order.index(cur[j]) > order.index(cur[j + 1]):
                cur[j], cur[j + 1] = cur[j + 1], cur[j]
                out = interchange(out, branch + 1, j)
                if out is None:
                    return None
    for q, x, y in pairs:  # left to right: each pair lands where the host has it
        out = tile(out, branch + 1, q, x, y)
        if out is None:
            return None
    mlevels = out.stmts[mine[0]].levels
    mpoints = _level_perm(tuple(lv for lv in mlevels if not lv.tile)) or ()
    it = dict(zip(hperm, mpoints, strict=False))  # host iterator -> the aligned one here
    for a, b in zip(hlevels, mlevels, strict=False):  # each tile over the matching loop
        if a.tile != b.tile or (a.tile and it.get(a.coeffs.index(1)) != b.coeffs.index(1)):
            return None
    depth = min(len(hlevels), len(mlevels))
    out = fuse(out, branch + 1, min(depth - 1, 3))
    return None if out is None or out.key == sched.key else out


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
