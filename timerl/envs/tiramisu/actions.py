"""The actions: the 56 of §2.2.3, plus 28 this environment adds (skews with a factor,
wavefront skews, shifts, fusions, one-step time tilings, an aligned fusion of the next
branch, interchanges of the levels tiling pushes below level 4), and how each applies to
a schedule's focused branch.

Added (gains the 56 cannot express on this machine; docs/tiramisu.md, "The ceiling of the
action space"):

- ``S(l,l+1,2)``: skew by factor 2 in one step (l < 3);
- ``W(l,l+1,f)``: wavefront skew, levels ``(a, b) -> (f*a + b, a)`` (l < 3, f in 1, 2):
  seidel2d's wavefront ``(t, 2i + j, i)`` is ``W(1,2,2)``;
- ``Sh(l)``: shift loop level ``l`` of the focused branch by +1 against the branches it
  shares the loop with (l < 4; repeatable up to ``schedule.MAX_SHIFT``): with a skew by 2
  it makes a two-statement time loop tileable (jacobi2d, heat2d, heat3d);
- ``F(l)``: fuse the focused branch into the previous branch's loops ``0..l`` (l < 4):
  blur's two stages (after ``Sh(0)`` twice on the second), mvt's two nests (after
  interchanging the second), the two statements of a stencil's time step.

- ``TT(f,x,y)``: time tiling in one action (:func:`.schedule.time_tile`: skew level 1 of
  every branch sharing the time loop by ``f``, shift the ``k``-th of them by ``k``, fuse
  them, tile ``(t, f t + i)`` by ``x`` by ``y``), f in 1, 2 and 4 tile sizes: the five
  actions of the hand-written time tiling, whose first four gain nothing alone. It needs two or more branches sharing the time loop (on one branch it
  would be ``S`` + ``T``).

- ``FN``: align the next branch's loop order with the focused branch's accesses to the
  arrays both use, and fuse it into the focused branch (:func:`.schedule.align_fuse`):
  mvt's ``1:I(0,1) 1:F(1)`` from branch 0, where ``next`` would otherwise come first.
  It applies after any transformations of the focused branch
  (the next branch gets them too, over the matched iterators).

- ``I(4,5)``, ``I(5,6)``: the paper's interchanges stop at ``I(3,4)``, its programs'
  loop levels before tiling; a tile inserts two levels in front, so a 4-deep nest tiled
  at ``(0, 1)`` has its innermost pair at levels 4 and 5 (a 5-deep one at 5 and 6).
  ``T(0,1,..)`` on doitgen's first branch tiles every statement sharing its ``r`` loop,
  so the reduction's ``I(2,3)`` (1.3-1.5x with an unroll) became ``I(4,5)`` on branch 1,
  which no action expressed: tiling first (the policies' choice) made the gain unreachable.

``PAPER_ACTIONS`` is the index set of the paper's 56.
"""

from __future__ import annotations

from dataclasses import dataclass

from timerl.envs.tiramisu import schedule as sc
from timerl.envs.tiramisu.schedule import Schedule

__all__ = ["ACTIONS", "NEXT", "NUM_ACTIONS", "PAPER_ACTIONS", "Action", "apply_action", "structurally_valid"]

TILE_SIZES = ((32, 32), (64, 64), (128, 128), (32, 64), (32, 128), (64, 32), (64, 128), (128, 32), (128, 64))
UNROLL_FACTORS = (2, 4, 8, 16, 32)
TIME_TILE_SIZES = ((32, 32), (32, 64), (64, 64), (32, 128))


@dataclass(frozen=True)
class Action:
    """``kind`` in I R S P T U W H(shift) F X(time tile) A(aligned fusion of the next branch) N; ``level`` (the first level), tile sizes,
    unroll factor or skew factor (``x``; 0 for the paper's factor-1 skew)."""

    kind: str
    level: int = 0
    x: int = 0
    y: int = 0

    @property
    def name(self) -> str:
        if self.kind in "IS" and not self.x:
            return f"{self.kind}({self.level},{self.level + 1})"
        if self.kind in "SW":
            return f"{self.kind}({self.level},{self.level + 1},{self.x})"
        if self.kind == "H":
            return f"Sh({self.level})"
        if self.kind == "F":
            return f"F({self.level})"
        if self.kind in "RP":
            return f"{self.kind}({self.level})"
        if self.kind == "T":
            return f"T({self.level},{self.level + 1},{self.x},{self.y})"
        if self.kind == "U":
            return f"U({self.x})"
        if self.kind == "X":
            return f"TT({self.level},{self.x},{self.y})"
        if self.kind == "A":
            return "FN"
        return "next"


ACTIONS: tuple[Action, ...] = (
    *(Action("I", i) for i in range(4)),
    *(Action("R", i) for i in range(5)),
    *(Action("S", i) for i in range(3)),
    *(Action("P", i) for i in range(2)),
    *(Action("T", i, x, y) for i in range(4) for x, y in TILE_SIZES),
    *(Action("U", 0, f) for f in UNROLL_FACTORS),
    # added by this environment (module doc)
    *(Action("S", i, 2) for i in range(3)),
    *(Action("W", i, f) for i in range(3) for f in (1, 2)),
    *(Action("H", i) for i in range(4)),
    *(Action("F", i) for i in range(4)),
    # time tiling in one step (``level`` holds the skew factor)
    *(Action("X", f, x, y) for f in (1, 2) for x, y in TIME_TILE_SIZES),
    # align the next branch and fuse it into the focused one
    Action("A"),
    # interchanges of the levels tiling pushes below level 4
    *(Action("I", i) for i in (4, 5)),
    Action("N"),
)
NUM_ACTIONS = len(ACTIONS)
NEXT = NUM_ACTIONS - 1
PAPER_ACTIONS: tuple[int, ...] = (*range(55), NEXT)
assert NUM_ACTIONS == 84


def apply_action(sched: Schedule, branch: int, a: int) -> Schedule | None:
    """The schedule after action ``a`` on ``branch``; None when it does not apply (a level
    beyond the branch's loops, a second parallel loop, ...) or for ``next``."""
    act = ACTIONS[a]
    if act.kind == "I":
        return sc.interchange(sched, branch, act.level)
    if act.kind == "R":
        return sc.reverse(sched, branch, act.level)
    if act.kind == "S":
        return sc.skew(sched, branch, act.level, act.x or 1)
    if act.kind == "W":
        return sc.wavefront(sched, branch, act.level, act.x)
    if act.kind == "H":
        return sc.shift(sched, branch, act.level)
    if act.kind == "F":
        return sc.fuse(sched, branch, act.level)
    if act.kind == "P":
        return sc.parallelize(sched, branch, act.level)
    if act.kind == "T":
        return sc.tile(sched, branch, act.level, act.x, act.y)
    if act.kind == "U":
        return sc.unroll(sched, branch, act.x)
    if act.kind == "X":
        return sc.time_tile(sched, branch, act.level, act.x, act.y)
    if act.kind == "A":
        return sc.align_fuse(sched, branch)
    return None


def structurally_valid(sched: Schedule, branch: int, a: int) -> bool:
    """The action changes the schedule (legality by dependences not checked)."""
    return a == NEXT or apply_action(sched, branch, a) is not None
