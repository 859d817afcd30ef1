"""Beam search and random schedules respect their measurement budget and only return
legal, correct schedules that are at least as fast as measured as the untransformed one."""

from __future__ import annotations

import pytest

from timerl.envs.tiramisu import benchmarks as bm
from timerl.envs.tiramisu.env import TiramisuTask
from timerl.envs.tiramisu.measure import Measurer
from timerl.envs.tiramisu.search import apply_sequence, beam_search, random_search
from timerl.errors import TimeRLError


@pytest.mark.parametrize("search", [beam_search, random_search], ids=["beam", "random"])
def test_budget_and_result(search) -> None:
    m = Measurer(disk_cache=False, threads=1)
    task = TiramisuTask(bm.jacobi2d(2, 48), m)
    res = search(task, 5)
    assert res.measurements <= 5
    assert m.runs <= 5 + 1  # the reference run of the untransformed program, then one per schedule
    assert task.legal(res.best) and m.measure(res.best).ok
    assert res.best_seconds <= res.initial_seconds and res.speedup >= 1.0


SMALL = {
    "mvt": lambda: bm.mvt(40),
    "doitgen": lambda: bm.doitgen(4, 5, 6),
    "blur": lambda: bm.blur(12, 20),
    "seidel2d": lambda: bm.seidel2d(3, 24),
    "jacobi2d": lambda: bm.jacobi2d(3, 24),
    "heat2d": lambda: bm.heat2d(3, 24),
    "heat3d": lambda: bm.heat3d(2, 10),
    "cvtcolor": lambda: bm.cvtcolor(12, 20),
}


@pytest.mark.parametrize("name", list(bm.HAND_SCHEDULES))
def test_hand_schedules_are_legal_and_correct(name) -> None:
    """The evaluation's hand-schedule ceiling: each sequence applies, is legal by isl,
    changes the schedule and computes the untransformed program's result."""
    m = Measurer(disk_cache=False, threads=1)
    task = TiramisuTask(SMALL[name](), m)
    for spec in bm.HAND_SCHEDULES[name]:
        s = apply_sequence(task, spec)
        assert s.key != task.initial.key
        assert m.measure(s).ok, m.measure(s).error


def test_apply_sequence_rejects_illegal_and_unknown_tokens() -> None:
    task = TiramisuTask(bm.seidel2d(2, 12), Measurer(disk_cache=False, threads=1))
    assert apply_sequence(task, "0:S(1,2) 0:S(1,2) 0:I(1,2)").key != task.initial.key
    for bad in ("0:I(1,2)", "0:I(0,1)", "1:U(4)", "0:X(1)"):  # j <-> i and t <-> i break dependences
        with pytest.raises(TimeRLError):
            apply_sequence(task, bad)
