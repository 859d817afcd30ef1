"""The ceiling search (``search.hill_climb``) and the best-of-K evaluation pieces:
``timerl.envs.tiramisu.evaluate.best_of_episodes`` and ``agents.tiramisu.sampled_rollouts``."""

from __future__ import annotations

import numpy as np

from timerl.agents import tiramisu
from timerl.envs.tiramisu import benchmarks as bm
from timerl.envs.tiramisu import evaluate as tiramisu_eval
from timerl.envs.tiramisu.actions import ACTIONS, NEXT
from timerl.envs.tiramisu.env import TiramisuTask
from timerl.envs.tiramisu.measure import Measurer
from timerl.envs.tiramisu.search import apply_sequence, hill_climb


def test_hill_climb_budget_ranking_and_specs() -> None:
    m = Measurer(disk_cache=False, threads=1)
    task = TiramisuTask(bm.jacobi2d(2, 48), m)
    res = hill_climb(task, ["0:U(4) 1:U(4)", "0:I(0,1) 0:I(0,1) 9:Q(1)"], 6, skip=("P",))
    assert res.measurements <= 6
    times = [t for t, _, _ in res.ranked]
    assert times == sorted(times)
    assert any(spec == "" for _, spec, _ in res.ranked)  # the untransformed program
    for _t, spec, s in res.ranked:  # every spec replays to its schedule, legal, never P
        assert apply_sequence(task, spec).key == s.key and task.legal(s)
        assert "P(" not in spec
    assert res.best[0] <= res.initial_seconds


def test_best_of_episodes_counts_distinct_measurements() -> None:
    m = Measurer(disk_cache=False, threads=1)
    task = TiramisuTask(bm.heat2d(2, 24), m)
    name = {a.name: k for k, a in enumerate(ACTIONS)}
    ep1 = (name["U(4)"], NEXT, name["U(4)"], NEXT)
    ep2 = (name["U(4)"], name["U(8)"], NEXT)  # U(4) again: no new measurement
    best, measured = tiramisu_eval.best_of_episodes(task, [ep1, ep2])
    assert len(measured) == 4  # untransformed, 0:U(4), 0:U(4) 1:U(4), 0:U(8)
    assert all(k == s.key for k, s in measured.items())
    seen = {
        apply_sequence(task, s).key: task.seconds(apply_sequence(task, s))
        for s in ("0:U(4)", "0:U(4) 1:U(4)", "0:U(8)")
    }
    seen[task.initial.key] = task.seconds(task.initial)
    assert seen[best.key] == min(seen.values())  # the fastest (its times can tie: any of those)


def test_sampled_rollouts_episodes_per_program() -> None:
    args = tiramisu.TiramisuArgs(episode_len=1, heads=1, hidden=4, threads=1, surrogate="off")
    weights = tiramisu.GATPolicy.init_weights(0, args.heads, args.hidden, "v2")
    progs = [bm.heat2d(2, 16)]
    m = Measurer(disk_cache=False, threads=1)
    per = tiramisu.sampled_rollouts(args, weights, progs, 2, measurer=m, seed=3)
    assert [len(eps) for eps in per] == [2]
    for eps, p in zip(per, progs, strict=True):
        assert all(r.program == p.name and r.predicted_steps == 0 for r in eps)
        assert all(len(r.actions) == 1 for r in eps)
    assert np.isfinite([r.best_seconds for eps in per for r in eps]).all()


def test_partial_results_are_written_per_benchmark(tmp_path) -> None:
    """An evaluation stopped early keeps what it measured: results.partial.json / .md hold
    the finished benchmarks' columns, the unfinished ones show ``-`` and no geomean."""
    import json
    import time

    rows = {"mvt": {"agent": 1.5, "budget": 9, "beam": 1.2, "untransformed_ms": 20.0}, "blur": {"agent": 1.0}}
    tiramisu_eval.write_partial(
        tmp_path, rows, ["mvt", "blur"], ["mvt"], "searches mvt", time.perf_counter(), 8
    )
    res = json.loads((tmp_path / "results.partial.json").read_text())
    assert res["done"] == ["mvt"] and res["rows"]["mvt"]["beam"] == 1.2
    md = (tmp_path / "results.partial.md").read_text()
    assert "| mvt | 20.0 | 9 | 1.50x | 1.20x |" in md
    assert "| blur | - | - | 1.00x | - |" in md
    assert "**1.22x**" in md  # agent: both benchmarks have it (geomean of 1.5 and 1.0)
    assert not list(tmp_path.glob("*.tmp"))
