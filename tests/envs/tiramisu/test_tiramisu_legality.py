"""Legality of transformations (isl dependences) against a brute-force oracle that
enumerates every pair of conflicting statement instances of small programs."""

from __future__ import annotations

import pytest
from tiramisu_brute import conflicts, legal

from timerl.envs.tiramisu import benchmarks as bm
from timerl.envs.tiramisu.actions import ACTIONS, NEXT, NUM_ACTIONS, apply_action
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


def test_56_actions() -> None:
    """§2.2.3: 4 interchanges, 5 reversals, 3 skews, 2 parallelisations, 36 tilings, 5 unrolls, next."""
    assert NUM_ACTIONS == 56 and ACTIONS[NEXT].name == "next"
    kinds = [a.kind for a in ACTIONS]
    assert [kinds.count(k) for k in "IRSPTUN"] == [4, 5, 3, 2, 36, 5, 1]


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
        for s in [s for s in firsts if check(s)][:4]:
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
