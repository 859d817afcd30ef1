"""The one-step time tiling ``TT(f,x,y)`` (seventh session): the same schedule as the
five-action sequence, legality by isl (checked against the brute-force oracle), and
compiled output equal to the untransformed program's."""

from __future__ import annotations

import numpy as np
import pytest
from tiramisu_brute import legal, run_python

from timerl.envs.tiramisu import benchmarks as bm
from timerl.envs.tiramisu import schedule as sc
from timerl.envs.tiramisu.actions import ACTIONS, apply_action
from timerl.envs.tiramisu.env import TiramisuTask
from timerl.envs.tiramisu.legality import LegalityChecker
from timerl.envs.tiramisu.measure import Measurer
from timerl.envs.tiramisu.schedule import initial_schedule
from timerl.envs.tiramisu.search import apply_sequence

A = {a.name: k for k, a in enumerate(ACTIONS)}


@pytest.mark.parametrize(
    ("make", "spec"),
    [
        (lambda: bm.jacobi2d(3, 10), "0:S(0,1,2) 1:S(0,1,2) 1:Sh(1) 1:F(2) 1:T(0,1,32,64)"),
        (lambda: bm.heat3d(3, 6), "0:S(0,1,2) 1:S(0,1,2) 1:Sh(1) 1:F(2) 1:T(0,1,32,64)"),
    ],
    ids=["jacobi2d", "heat3d"],
)
def test_time_tile_is_the_sequence(make, spec: str) -> None:
    """``TT(2,32,64)`` on either branch reaches the hand-written sequence's schedule."""
    p = make()
    task = TiramisuTask(p, Measurer(disk_cache=False, threads=1))
    want = apply_sequence(task, spec).key
    for br in range(len(p.branches)):
        assert apply_action(task.initial, br, A["TT(2,32,64)"]).key == want


def test_time_tile_structure() -> None:
    """Does not apply where a step does not (doitgen's statements differ in depth; a
    time-tiled nest cannot be time-tiled again), nor on a branch that shares no time loop
    (seidel2d, mvt: eighth session; there it was a skew + tile, ``S`` + ``T``)."""
    assert apply_action(initial_schedule(bm.doitgen(2, 2, 3)), 0, A["TT(2,32,32)"]) is None
    p = bm.jacobi2d(3, 10)
    s = apply_action(initial_schedule(p), 0, A["TT(2,32,32)"])
    assert apply_action(s, 0, A["TT(2,32,32)"]) is None and apply_action(s, 1, A["TT(1,32,32)"]) is None
    for q in (bm.mvt(5), bm.seidel2d(3, 10)):
        for br in range(len(q.branches)):
            for name in ("TT(1,32,32)", "TT(2,32,32)"):
                assert apply_action(initial_schedule(q), br, A[name]) is None, (q.name, br, name)


@pytest.mark.parametrize("factor", [1, 2])
def test_time_tile_legality_matches_brute_force(factor: int) -> None:
    """Tiles of 2 x 3 split jacobi2d's (t, f t + i): a skew by 1 leaves S0(t + 1, i - 1)
    before S1(t, i) that it reads (illegal), a skew by 2 is legal; isl and the oracle
    agree. With the action's tiles (32 x 32) on a larger domain isl decides the same."""
    p = bm.jacobi2d(3, 10)
    s = sc.time_tile(initial_schedule(p), 0, factor, 2, 3)
    assert LegalityChecker(p)(s) == (factor == 2) == legal(p, s)
    q = bm.jacobi2d(40, 70)
    assert LegalityChecker(q)(apply_action(initial_schedule(q), 0, A[f"TT({factor},32,32)"])) == (factor == 2)


def test_time_tile_computes_the_reference() -> None:
    """The legal time tilings (tiles splitting the domain) compile to the untransformed
    program's output; the illegal one (skew by 1) computes a wrong result."""
    m = Measurer(disk_cache=False, threads=1)
    for p in (bm.heat2d(4, 12), bm.heat3d(3, 6)):
        s = sc.time_tile(initial_schedule(p), 0, 2, 2, 5)
        assert LegalityChecker(p)(s), p.name
        r = m.measure(s)
        assert r.ok, (p.name, r.error)
        np.testing.assert_allclose(m.reference(p), run_python(p), rtol=1e-5, atol=1e-5)
    p = bm.heat2d(4, 12)
    bad = sc.time_tile(initial_schedule(p), 0, 1, 2, 5)
    assert not LegalityChecker(p)(bad) and not m.measure(bad).ok
