"""Legality of transformations (isl dependences) against a brute-force oracle that
enumerates every pair of conflicting statement instances of small programs."""

from __future__ import annotations

import pytest
from tiramisu_brute import conflicts, legal

from timerl.envs.tiramisu import benchmarks as bm
from timerl.envs.tiramisu import schedule as sc
from timerl.envs.tiramisu.actions import ACTIONS, NEXT, NUM_ACTIONS, PAPER_ACTIONS, apply_action
from timerl.envs.tiramisu.legality import LegalityChecker
from timerl.envs.tiramisu.schedule import initial_schedule

SMALL = {
    "mvt": lambda: bm.mvt(5),
    "doitgen": lambda: bm.doitgen(2, 2, 3),
    "seidel2d": lambda: bm.seidel2d(2, 6),
    "jacobi2d": lambda: bm.jacobi2d(2, 6),
    "heat3d": lambda: bm.heat3d(2, 4),
    "blur": lambda: bm.blur(4, 5),
}

A = {a.name: k for k, a in enumerate(ACTIONS)}


def test_actions() -> None:
    """§2.2.3's 56: 4 interchanges, 5 reversals, 3 skews, 2 parallelisations, 36 tilings,
    5 unrolls, next; plus 3 skews by 2, 6 wavefront skews, 4 shifts, 4 fusions, 8 time tilings,
    the aligned fusion FN and 2 interchanges below level 4 (tenth session)."""
    assert NUM_ACTIONS == 84 and ACTIONS[NEXT].name == "next"
    paper = [ACTIONS[a].kind for a in PAPER_ACTIONS]
    assert [paper.count(k) for k in "IRSPTUN"] == [4, 5, 3, 2, 36, 5, 1]
    kinds = [a.kind for a in ACTIONS]
    assert [kinds.count(k) for k in "ISWHFXA"] == [6, 6, 6, 4, 4, 8, 1]
    assert [a.name for a in ACTIONS if a.kind == "I"][4:] == ["I(4,5)", "I(5,6)"]
    assert len({a.name for a in ACTIONS}) == NUM_ACTIONS


@pytest.mark.parametrize("name", sorted(SMALL))
def test_legality_matches_brute_force(name: str) -> None:
    """Every single action from the original schedule, and every action after a legal
    first one on each branch (two-step sequences), gets the oracle's verdict."""
    p = SMALL[name]()
    check = LegalityChecker(p)
    pairs = conflicts(p)
    s0 = initial_schedule(p)
    seen = 0
    verdicts = set()
    for br in range(len(p.branches)):
        firsts = [s for a in range(NEXT) if (s := apply_action(s0, br, a)) is not None]
        for s in firsts:
            want = legal(p, s, pairs)
            assert check(s) == want, s.key
            verdicts.add(want)
            seen += 1
        for s in [s for s in firsts if check(s)][:3]:
            for a in range(0, NEXT, 3):
                s2 = apply_action(s, br, a)
                if s2 is not None:
                    assert check(s2) == legal(p, s2, pairs), s2.key
                    seen += 1
    assert seen > 20
    if name != "blur":
        assert verdicts == {True, False}  # both kinds of verdict occur


def test_known_verdicts() -> None:
    """Textbook cases: seidel2d forbids interchanging t and i (and parallel i) but allows
    skewing; jacobi2d's i loop is parallel, its t loop is not."""
    p = bm.seidel2d(2, 6)
    c = LegalityChecker(p)
    s0 = initial_schedule(p)
    get = {a.name: k for k, a in enumerate(ACTIONS)}
    assert not c(apply_action(s0, 0, get["I(0,1)"]))
    assert not c(apply_action(s0, 0, get["P(1)"]))
    assert c(apply_action(s0, 0, get["S(1,2)"]))
    q = bm.jacobi2d(2, 6)
    cq = LegalityChecker(q)
    q0 = initial_schedule(q)
    assert cq(apply_action(q0, 0, get["P(1)"]))
    assert not cq(apply_action(q0, 0, get["P(0)"]))


def _seq(p, spec: str):
    """The schedule after ``branch:action`` tokens, each applying structurally (legality not checked)."""
    s = initial_schedule(p)
    for tok in spec.split():
        br, _, name = tok.partition(":")
        s = apply_action(s, int(br), A[name])
        assert s is not None, tok
    return s


# (program, schedule, legal?) for the added actions, each checked against the oracle too
NEW_ACTION_CASES = [
    (lambda: bm.mvt(5), "1:I(0,1) 1:F(1)", True),  # mvt's nests fused, both reading A[i][j]
    (lambda: bm.mvt(5), "1:F(0)", True),
    (lambda: bm.blur(4, 5), "1:F(1)", False),  # the second stage would read rows not yet blurred
    (lambda: bm.blur(4, 5), "1:Sh(0) 1:F(1)", False),  # shifted by one row: still one short
    (lambda: bm.blur(4, 5), "1:Sh(0) 1:Sh(0) 1:F(1)", True),
    (lambda: bm.blur(4, 5), "1:Sh(0) 1:Sh(0) 1:F(0)", True),
    (lambda: bm.seidel2d(2, 6), "0:W(1,2,2)", True),  # the wavefront (t, 2i + j, i)
    (lambda: bm.seidel2d(2, 6), "0:W(0,1,1)", True),  # (t + i, t, j)
    (lambda: bm.seidel2d(2, 6), "0:R(1) 0:W(1,2,1)", False),
    (lambda: bm.jacobi2d(2, 6), "0:W(0,1,1)", False),  # S0 alone on (t + i, t): S1 of step t is split off
    (lambda: bm.seidel2d(2, 6), "0:W(0,1,2)", True),
    (lambda: bm.seidel2d(2, 6), "0:S(1,2,2) 0:I(1,2)", True),
    (lambda: bm.jacobi2d(2, 6), "0:S(0,1,2) 1:S(0,1,2) 1:Sh(1) 0:T(0,1,32,32)", True),  # time tiling
    (lambda: bm.jacobi2d(2, 6), "0:S(0,1,2) 1:S(0,1,2) 1:Sh(1) 1:F(2)", True),  # fused (t, 2t+i, j)
    (lambda: bm.jacobi2d(2, 6), "0:S(0,1,2) 1:S(0,1,2) 1:Sh(1) 1:Sh(2) 1:F(2)", True),
    (lambda: bm.jacobi2d(2, 6), "0:S(0,1,2) 1:S(0,1,2) 1:F(2)", False),  # no shift: S1 reads B[i+1] too early
    (lambda: bm.heat3d(2, 4), "0:S(0,1,2) 1:S(0,1,2) 1:Sh(1) 0:T(0,1,32,32)", True),
    (lambda: bm.doitgen(2, 2, 3), "2:F(2)", False),  # S2 at p overwrites A[r][q][p] that S1 at p' > p reads
    (lambda: bm.doitgen(2, 2, 3), "1:F(2)", True),  # the init inside the p loop, before the s loop
]


@pytest.mark.parametrize("shift", [False, True])
def test_time_tiling_needs_the_shift(shift: bool) -> None:
    """jacobi2d skewed by 2t on both statements, tiled 2 x 3 on (t, 2t + i) (tiles smaller
    than the domain, so tiles really split it): legal only with S1 shifted by one."""
    p = bm.jacobi2d(3, 10)
    s = sc.skew(sc.skew(initial_schedule(p), 0, 0, 2), 1, 0, 2)
    if shift:
        s = sc.shift(s, 1, 1)
    s = sc.tile(s, 0, 0, 2, 3)
    assert s.stmts[1].levels[0].tile == 2  # both statements tiled (they share the t loop)
    assert LegalityChecker(p)(s) == shift == legal(p, s)


@pytest.mark.parametrize("case", range(len(NEW_ACTION_CASES)))
def test_added_actions_legality(case: int) -> None:
    make, spec, want = NEW_ACTION_CASES[case]
    p = make()
    s = _seq(p, spec)
    assert LegalityChecker(p)(s) == want, spec
    assert legal(p, s) == want, spec  # the brute-force oracle agrees


def test_added_actions_structure() -> None:
    """What does not apply: fusing the first branch, shifting beyond MAX_SHIFT, skewing a tile loop."""
    p = bm.mvt(5)
    s0 = initial_schedule(p)
    assert apply_action(s0, 0, A["F(0)"]) is None  # no branch before the first
    assert apply_action(apply_action(s0, 1, A["F(1)"]), 1, A["F(1)"]) is None  # already fused
    s = s0
    for _ in range(4):
        s = apply_action(s, 0, A["Sh(0)"])
    assert s is not None and apply_action(s, 0, A["Sh(0)"]) is None
    assert apply_action(initial_schedule(bm.seidel2d(2, 6)), 0, A["Sh(1)"]) is None  # one branch: no shift
    t = apply_action(s0, 0, A["T(0,1,32,32)"])
    assert apply_action(t, 0, A["S(0,1,2)"]) is None and apply_action(t, 0, A["W(0,1,2)"]) is None
    w = apply_action(initial_schedule(bm.seidel2d(2, 6)), 0, A["W(1,2,2)"])
    assert [lv.coeffs for lv in w.stmts[0].levels] == [(1, 0, 0), (0, 2, 1), (0, 1, 0)]
