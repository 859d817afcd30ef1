"""Beam search and random schedules respect their measurement budget and only return
legal, correct schedules that are at least as fast as measured as the untransformed one."""

from __future__ import annotations

import pytest

from timerl.envs.tiramisu import benchmarks as bm
from timerl.envs.tiramisu.env import TiramisuTask
from timerl.envs.tiramisu.measure import Measurer
from timerl.envs.tiramisu.search import beam_search, random_search


@pytest.mark.parametrize("search", [beam_search, random_search], ids=["beam", "random"])
def test_budget_and_result(search) -> None:
    m = Measurer(disk_cache=False, threads=1)
    task = TiramisuTask(bm.jacobi2d(2, 48), m)
    res = search(task, 5)
    assert res.measurements <= 5
    assert m.runs <= 5 + 1  # the reference run of the untransformed program, then one per schedule
    assert task.legal(res.best) and m.measure(res.best).ok
    assert res.best_seconds <= res.initial_seconds and res.speedup >= 1.0
