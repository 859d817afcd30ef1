"""The interchanges below level 4, ``I(4,5)`` and ``I(5,6)`` (tenth session): a tile of
doitgen's first branch tiles every statement sharing its ``r`` loop, which pushes the
reduction's ``(p, s)`` pair of branch 1 to levels 4 and 5; its interchange (the hand
schedule's ``1:I(2,3)``) must stay reachable: in the env's mask, legal by isl and the
brute-force oracle, and compiled to the untransformed program's output."""

from __future__ import annotations

import numpy as np
import pytest
from tiramisu_brute import legal, run_python

from timerl.envs.tiramisu import benchmarks as bm
from timerl.envs.tiramisu import schedule as sc
from timerl.envs.tiramisu.actions import ACTIONS, NEXT, apply_action
from timerl.envs.tiramisu.env import TiramisuTask, _TiramisuState
from timerl.envs.tiramisu.legality import LegalityChecker
from timerl.envs.tiramisu.measure import Measurer
from timerl.envs.tiramisu.schedule import initial_schedule

A = {a.name: k for k, a in enumerate(ACTIONS)}


@pytest.fixture(scope="module")
def measurer():
    return Measurer(disk_cache=False, threads=1)


def test_deep_interchange_after_a_tile_is_the_reductions_interchange() -> None:
    """After ``0:T(0,1,2,2)`` (all three statements tiled at ``(r, q)``), ``1:I(4,5)`` swaps
    the reduction's ``p`` and ``s``: the schedule of ``1:I(2,3)`` then the same tile; legal
    by isl and the oracle, as ``1:I(2,3)`` is; ``I(5,6)`` needs a seventh level."""
    p = bm.doitgen(2, 3, 3)
    check = LegalityChecker(p)
    tiled = sc.tile(initial_schedule(p), 0, 0, 2, 2)
    assert [len(lv) for lv in map(tiled.branch_levels, range(3))] == [5, 6, 5]
    s = apply_action(tiled, 1, A["I(4,5)"])
    assert s is not None
    assert s.key == sc.tile(sc.interchange(initial_schedule(p), 1, 2), 0, 0, 2, 2).key
    assert check(s) and legal(p, s)
    assert apply_action(tiled, 1, A["I(3,4)"]) is not None  # q <-> p: also legal here
    assert apply_action(tiled, 1, A["I(5,6)"]) is None and apply_action(tiled, 0, A["I(4,5)"]) is None
    deeper = sc.tile(tiled, 1, 4, 2, 2)  # 8 > MAX_LEVELS: no
    assert deeper is None
    five = sc.tile(initial_schedule(bm.heat3d(2, 4)), 0, 0, 2, 2)  # (t, i, j, k): 6 levels
    assert apply_action(five, 0, A["I(4,5)"]) is not None and apply_action(five, 0, A["I(5,6)"]) is None


def test_deep_interchange_in_the_env_after_tile_and_next(measurer) -> None:
    """The legal mask offers ``I(4,5)`` on branch 1 after ``T(0,1,32,32) next`` (before this
    session the reduction's interchange was unreachable after a tile), and the step
    computes the untransformed program's output."""
    p = bm.doitgen(4, 4, 6)
    st = _TiramisuState("tiramisu.test", 1, 0, [TiramisuTask(p, measurer)], True, 8)
    st.bind({})
    st.reset({"i": 0})
    st.step(np.array([A["T(0,1,32,32)"]]))
    st.step(np.array([NEXT]))
    m = st.mask(legal=True)[0]
    assert m[A["I(4,5)"]] == 1.0
    before = measurer.compiles
    st.step(np.array([A["I(4,5)"]]))
    ep = st.episodes[0]
    assert measurer.compiles > before and np.isfinite(ep.t)  # compiled, output checked
    assert ep.sched.branch_levels(1)[4].coeffs == (0, 0, 0, 1)
    np.testing.assert_allclose(measurer.reference(p), run_python(p), rtol=1e-5, atol=1e-5)
