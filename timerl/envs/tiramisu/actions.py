"""The 56 actions of §2.2.3 and how each applies to a schedule's focused branch."""

from __future__ import annotations

from dataclasses import dataclass

from timerl.envs.tiramisu import schedule as sc
from timerl.envs.tiramisu.schedule import Schedule

__all__ = ["ACTIONS", "NEXT", "NUM_ACTIONS", "Action", "apply_action", "structurally_valid"]

TILE_SIZES = ((32, 32), (64, 64), (128, 128), (32, 64), (32, 128), (64, 32), (64, 128), (128, 32), (128, 64))
UNROLL_FACTORS = (2, 4, 8, 16, 32)


@dataclass(frozen=True)
class Action:
    """``kind`` in I R S P T U N; ``level`` (the first level), tile sizes or unroll factor."""

    kind: str
    level: int = 0
    x: int = 0
    y: int = 0

    @property
    def name(self) -> str:
        if self.kind in "IS":
            return f"{self.kind}({self.level},{self.level + 1})"
        if self.kind in "RP":
            return f"{self.kind}({self.level})"
        if self.kind == "T":
            return f"T({self.level},{self.level + 1},{self.x},{self.y})"
        if self.kind == "U":
            return f"U({self.x})"
        return "next"


ACTIONS: tuple[Action, ...] = (
    *(Action("I", i) for i in range(4)),
    *(Action("R", i) for i in range(5)),
    *(Action("S", i) for i in range(3)),
    *(Action("P", i) for i in range(2)),
    *(Action("T", i, x, y) for i in range(4) for x, y in TILE_SIZES),
    *(Action("U", 0, f) for f in UNROLL_FACTORS),
    Action("N"),
)
NUM_ACTIONS = len(ACTIONS)
NEXT = NUM_ACTIONS - 1
assert NUM_ACTIONS == 56


def apply_action(sched: Schedule, branch: int, a: int) -> Schedule | None:
    """The schedule after action ``a`` on ``branch``; None when it does not apply (a level
    beyond the branch's loops, a second parallel loop, ...) or for ``next``."""
    act = ACTIONS[a]
    if act.kind == "I":
        return sc.interchange(sched, branch, act.level)
    if act.kind == "R":
        return sc.reverse(sched, branch, act.level)
    if act.kind == "S":
        return sc.skew(sched, branch, act.level)
    if act.kind == "P":
        return sc.parallelize(sched, branch, act.level)
    if act.kind == "T":
        return sc.tile(sched, branch, act.level, act.x, act.y)
    if act.kind == "U":
        return sc.unroll(sched, branch, act.x)
    return None


def structurally_valid(sched: Schedule, branch: int, a: int) -> bool:
    """The action changes the schedule (legality by dependences not checked)."""
    return a == NEXT or apply_action(sched, branch, a) is not None
