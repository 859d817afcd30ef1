"""``examples/ppo_looptune.py`` end to end on the analytic cost model (CI only; real runs use TVM)."""

from __future__ import annotations

import json
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))

import ppo_looptune  # noqa: E402

from timerl.envs.looptune import ppo_run  # noqa: E402
from timerl.envs.looptune.analytic import AnalyticCostModel  # noqa: E402
from timerl.envs.looptune.evaluate import state_from_key  # noqa: E402
from timerl.envs.looptune.ir import apply_action, initial_state  # noqa: E402


def test_trains_saves_and_tunes_test_problems(tmp_path, capsys) -> None:
    args = ppo_looptune.Args(
        backend="torch",
        measurer="analytic",
        iterations=2,
        num_envs=3,
        train_problems=4,
        eval_problems=4,
        hidden=16,
        out_dir=str(tmp_path),
    )
    out = ppo_looptune.main(args)
    assert len(out["means"]) == 2 and all(math.isfinite(m) for m in out["means"])
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("ckpt_*.npz")) == ["ckpt_1.npz"]
    results = json.loads((tmp_path / "policy_results.json").read_text())
    report = out["report"]
    assert [r.problem.name for r in report.results] == sorted(results, key=list(results).index)
    model = AnalyticCostModel()
    for r in report.results:
        # the reported GFLOPS is the best nest of the replayed greedy episode, measured again
        s = initial_state(r.problem)
        seen = [model.gflops(s)]
        for a in results[r.problem.name]["actions"]:
            s = apply_action(s, a)
            seen.append(model.gflops(s))
        assert len(results[r.problem.name]["actions"]) == 10
        kept = state_from_key(results[r.problem.name]["state"])
        assert r.gflops["ppo"] == model.gflops(kept) == max(seen)
        assert r.untuned == model.gflops(initial_state(r.problem))
    assert len(out["speedups"]) == 2 and all(x > 0 for x in out["speedups"])
    for name in ("results.csv", "results.json", "fig8.png", "fig9.png", "learning_curve.png"):
        assert (tmp_path / name).stat().st_size > 0
    stdout = capsys.readouterr().out
    assert "ppo" in stdout and "demonstrations:" in stdout
    # the ten-seed figure reads the curves back from such logs
    (tmp_path / "seed7.log").write_text(stdout)
    curves = ppo_run.curves_from_logs([str(tmp_path / "seed7.log")])
    assert list(curves) == ["seed7"] and curves["seed7"] == [round(m, 3) for m in out["means"]]
    ppo_run.plot_curves(curves, tmp_path / "curves.png")
    assert (tmp_path / "curves.png").stat().st_size > 0
