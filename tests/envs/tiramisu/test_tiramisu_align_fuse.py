"""The aligned fusion of the next branch ``FN`` (eighth session): the same schedule as
interchanging the next branch and fusing it back, legality by isl (checked against the
brute-force oracle), and compiled output equal to the untransformed program's."""

from __future__ import annotations

import numpy as np
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


def test_align_fuse_is_the_sequence() -> None:
    """On mvt, ``0:FN`` is ``1:I(0,1) 1:F(1)`` (the second nest's ``A[j][i]`` becomes the
    first's ``A[i][j]``), and with a tile the hand schedule; a second nest already in the
    matching order is fused without an interchange."""
    task = TiramisuTask(bm.mvt(6), Measurer(disk_cache=False, threads=1))
    s = apply_action(task.initial, 0, A["FN"])
    assert s.key == apply_sequence(task, "1:I(0,1) 1:F(1)").key
    assert s.key != apply_sequence(task, "1:F(1)").key
    assert (
        apply_sequence(task, "0:FN 0:T(0,1,32,32)").key
        == apply_sequence(task, "1:I(0,1) 1:F(1) 1:T(0,1,32,32)").key
    )
    pre = apply_sequence(task, "1:I(0,1)")
    assert apply_action(pre, 0, A["FN"]).key == s.key
    # the unroll tags stay; the first nest's own order is the target
    swapped = apply_sequence(task, "0:I(0,1) 0:U(4)")
    assert apply_action(swapped, 0, A["FN"]).key == apply_sequence(task, "0:I(0,1) 0:U(4) 1:F(1)").key


def test_align_fuse_structure() -> None:
    """No next branch (the last branch, one-branch programs), a next branch whose loops are
    no longer plain iterators (skewed, tiled), or an already fused one: does not apply."""
    p = bm.mvt(6)
    init = initial_schedule(p)
    assert apply_action(init, 1, A["FN"]) is None
    assert apply_action(initial_schedule(bm.seidel2d(3, 10)), 0, A["FN"]) is None
    assert apply_action(initial_schedule(bm.cvtcolor(4, 4)), 0, A["FN"]) is None
    assert sc.align_fuse(sc.skew(init, 1, 0), 0) is None
    assert sc.align_fuse(sc.tile(init, 1, 0, 2, 2), 0) is None
    fused = sc.align_fuse(init, 0)
    assert sc.align_fuse(fused, 0) is None


def test_align_fuse_legality_matches_brute_force() -> None:
    """Legal on mvt (and with 2 x 3 tiles of the fused nest), illegal on blur (the second
    stage reads rows the first has not written yet) and jacobi2d (the copy back overwrites
    what the next point's stencil reads): isl and the oracle agree."""
    cases = [(bm.mvt(5), True), (bm.blur(6, 5), False), (bm.jacobi2d(2, 6), False)]
    for p, want in cases:
        s = sc.align_fuse(initial_schedule(p), 0)
        assert s is not None, p.name
        assert LegalityChecker(p)(s) == want == legal(p, s), p.name
    p = bm.mvt(5)
    t = sc.tile(sc.align_fuse(initial_schedule(p), 0), 0, 0, 2, 3)
    assert LegalityChecker(p)(t) and legal(p, t)


def test_align_fuse_computes_the_reference() -> None:
    """The fused (and tiled) mvt compiles to the untransformed program's output."""
    m = Measurer(disk_cache=False, threads=1)
    p = bm.mvt(7)
    s = sc.tile(sc.align_fuse(initial_schedule(p), 0), 0, 0, 2, 3)
    r = m.measure(s)
    assert r.ok, r.error
    np.testing.assert_allclose(m.reference(p), run_python(p), rtol=1e-5, atol=1e-5)


def test_align_fuse_after_a_tile_of_the_focused_branch() -> None:
    """A focused branch tiled first (the policies' ``0:T(0,1,64,32)`` on mvt) gets the next
    branch aligned, tiled the same way and fused: the schedule of ``0:FN 0:T(0,1,x,y)``,
    legal by isl and the oracle."""
    task = TiramisuTask(bm.mvt(6), Measurer(disk_cache=False, threads=1))
    for x, y in ((64, 32), (32, 128)):
        s = apply_sequence(task, f"0:T(0,1,{x},{y}) 0:FN")
        assert s.key == apply_sequence(task, f"0:FN 0:T(0,1,{x},{y})").key
    assert sc.align_fuse(apply_sequence(task, "0:T(0,1,64,32) 0:U(8)"), 0) is not None
    p = bm.mvt(5)
    s = sc.align_fuse(sc.tile(initial_schedule(p), 0, 0, 2, 3), 0)
    assert s is not None and LegalityChecker(p)(s) and legal(p, s)


# the focused branch's steps (small tiles: the actions' 32-128 would be one tile here) -> the
# same schedule by the next branch's own steps (its loops interchanged to match ``A[i][j]``,
# then the focused branch's steps) and ``F(3)`` / ``F(1)``; legal? (reversing mvt's ``i``
# reverses the second nest's reduction loop ``j``: illegal, as the order of a float sum)
I, T, S, R, F = sc.interchange, sc.tile, sc.skew, sc.reverse, sc.fuse
AFTER_ANY = (
    ([(T, 0, 0, 4, 4), (I, 0, 1)], [(I, 1, 0), (T, 1, 0, 4, 4), (I, 1, 1), (F, 1, 3)], True),  # s9 seed 0
    ([(T, 0, 0, 4, 2), (I, 0, 2)], [(I, 1, 0), (T, 1, 0, 4, 2), (I, 1, 2), (F, 1, 3)], True),  # points
    ([(S, 0, 0)], [(I, 1, 0), (S, 1, 0), (F, 1, 1)], True),
    ([(I, 0, 0), (S, 0, 0, 2)], [(S, 1, 0, 2), (F, 1, 1)], True),
    ([(R, 0, 0), (T, 0, 0, 2, 4)], [(I, 1, 0), (R, 1, 0), (T, 1, 0, 2, 4), (F, 1, 3)], False),
)


def _run(s: sc.Schedule | None, steps: list[tuple]) -> sc.Schedule | None:
    for fn, *args in steps:
        s = None if s is None else fn(s, *args)
    return s


def test_align_fuse_after_any_sequence_of_the_focused_branch() -> None:
    """Tenth session: ``FN`` after an interchange of the point loops under the tiles (the
    ninth session's seed 0 on mvt played ``T(0,1,128,128) I(1,2)``, after which ``FN`` did
    not apply), a skew, a reversal: the next branch gets the focused branch's
    transformations over the matched iterators (the schedule its own steps reach) and is
    fused in; legal by isl and the brute-force oracle (illegal after a reversal that
    reverses the next branch's reduction: the legality check still decides)."""
    p = bm.mvt(6)
    check = LegalityChecker(p)
    for pre, same, want in AFTER_ANY:
        host = _run(initial_schedule(p), pre)
        assert host is not None and check(host)
        s = sc.align_fuse(host, 0)
        assert s is not None, pre
        assert s.key == _run(host, same).key, pre
        assert check(s) == legal(p, s) == want, pre
    # as an action in the env's order: the ninth session's seed 0 sequence, then FN
    task = TiramisuTask(bm.mvt(6), Measurer(disk_cache=False, threads=1))
    apply_sequence(task, "0:T(0,1,128,128) 0:I(1,2) 0:FN")  # raises if FN does not apply or is illegal
    # the next branch's loops no longer plain (tiled alone): no alignment
    assert sc.align_fuse(T(T(initial_schedule(p), 0, 0, 4, 4), 1, 0, 2, 2), 0) is None
    # still an illegal fusion where the plain one is (blur's stages), by isl and the oracle
    p = bm.blur(6, 5)
    s = sc.align_fuse(I(T(initial_schedule(p), 0, 0, 2, 2), 0, 2), 0)
    assert s is not None and not LegalityChecker(p)(s) and not legal(p, s)


def test_align_fuse_after_any_sequence_computes_the_reference() -> None:
    """The generated code of ``FN`` after the interchanged tiles and after a skew computes
    the untransformed program's output (the measurer checks it; the reference against a
    Python run)."""
    m = Measurer(disk_cache=False, threads=1)
    p = bm.mvt(7)
    np.testing.assert_allclose(m.reference(p), run_python(p), rtol=1e-5, atol=1e-5)
    for pre, _, _ in AFTER_ANY[:4]:
        s = sc.align_fuse(_run(initial_schedule(p), pre), 0)
        assert s is not None
        r = m.measure(s)
        assert r.ok, (pre, r.error)
