"""LoopTune evaluation tool: summary maths on a hand-made report, files written, the
policy results reader and the CLI, on the analytic model (no timing asserted)."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest

from timerl.envs.looptune import evaluate as ev
from timerl.envs.looptune.evaluate import ProblemResult, Report, Tuned
from timerl.envs.looptune.ir import ACTIONS, Problem, apply_action, initial_state
from timerl.envs.looptune.measure import AnalyticCostModel
from timerl.errors import TimeRLError

P1, P2, P3 = Problem(64, 64, 64), Problem(80, 96, 112), Problem(128, 64, 80)
NAN = math.nan


def hand_report() -> Report:
    """Two tuners; ``b`` fails on P2 and is not run on P3."""
    rows = (
        ProblemResult(P1, untuned=2.0, numpy=40.0, gflops={"a": 8.0, "b": 4.0}, seconds={"a": 1.0, "b": 3.0}),
        ProblemResult(P2, untuned=4.0, numpy=50.0, gflops={"a": 8.0, "b": 0.0}, seconds={"a": 2.0, "b": 5.0}),
        ProblemResult(P3, untuned=1.0, numpy=10.0, gflops={"a": 9.5, "b": NAN}, seconds={"a": 3.0, "b": NAN}),
    )
    return Report(("a", "b"), rows, {"note": "hand-made"})


def test_summary_of_a_hand_made_report() -> None:
    s = {x.method: x for x in ev.summarize(hand_report())}
    assert list(s) == ["untuned", "a", "b", "numpy"]
    a, b = s["a"], s["b"]
    assert a.num_problems == 3 and b.num_problems == 2
    assert a.speedup_geomean == pytest.approx((4.0 * 2.0 * 9.5) ** (1 / 3))
    assert a.numpy_fraction_geomean == pytest.approx((0.2 * 0.16 * 0.95) ** (1 / 3))
    assert b.speedup_geomean == pytest.approx(2.0)  # the failure (0 GFLOPS) is left out
    assert b.failures == 1 and a.failures == 0
    assert a.mean_seconds == pytest.approx(2.0) and b.mean_seconds == pytest.approx(4.0)
    # the best method is numpy on P1/P2 (40, 50) and a on P3 (9.5 >= 0.9 * 10)
    assert a.within_best_share == pytest.approx(1 / 3)
    assert s["numpy"].within_best_share == 1.0
    assert s["numpy"].speedup_geomean == pytest.approx((20.0 * 12.5 * 10.0) ** (1 / 3))
    assert math.isnan(s["untuned"].mean_seconds)
    assert ev.geomean([1.0, 4.0, 0.0, NAN]) == pytest.approx(2.0)
    assert math.isnan(ev.geomean([]))
    text = ev.format_summary(hand_report())
    assert "greedy" not in text and text.splitlines()[2].startswith("a ")


def test_fraction_of_the_machine_peak_per_problem(tmp_path) -> None:
    """With the measured peak in ``meta``, the summary and every problem's row give each
    method's GFLOPS as a fraction of it."""
    r = hand_report()
    r = Report(r.methods, r.results, {"peak_gflops": 20.0})
    s = {x.method: x for x in ev.summarize(r)}
    assert s["a"].peak_fraction_geomean == pytest.approx((0.4 * 0.4 * 0.475) ** (1 / 3))
    assert s["numpy"].peak_fraction_geomean == pytest.approx((2.0 * 2.5 * 0.5) ** (1 / 3))
    assert "x peak" in ev.format_summary(r) and "20.0 GFLOPS" in ev.format_summary(r)
    assert "x peak" not in ev.format_summary(hand_report())
    assert math.isnan({x.method: x for x in ev.summarize(hand_report())}["a"].peak_fraction_geomean)
    pytest.importorskip("matplotlib", reason="plots need pip install 'timerl[looptune]'")
    paths = ev.write_report(r, tmp_path / "out")
    with paths["results.csv"].open() as f:
        rows = list(csv.DictReader(f))
    assert float(rows[2]["a_x_peak"]) == pytest.approx(0.475) and float(rows[0]["numpy_x_peak"]) == 2.0
    assert json.loads(paths["results.json"].read_text())["problems"][1]["x_peak"]["a"] == pytest.approx(0.4)


def test_write_report_files(tmp_path) -> None:
    pytest.importorskip("matplotlib", reason="plots need pip install 'timerl[looptune]'")
    paths = ev.write_report(hand_report(), tmp_path / "out")
    assert set(paths) == {"results.csv", "results.json", "summary.txt", "fig8.png", "fig9.png"}
    with paths["results.csv"].open() as f:
        rows = list(csv.DictReader(f))
    assert [r["problem"] for r in rows] == [P1.name, P2.name, P3.name]
    assert float(rows[0]["a_gflops"]) == 8.0 and rows[2]["b_gflops"] == "nan"
    doc = json.loads(paths["results.json"].read_text())  # strict JSON: nan became null
    assert doc["problems"][2]["gflops"]["b"] is None
    assert doc["meta"] == {"note": "hand-made"} and doc["methods"] == ["a", "b"]
    assert [x["method"] for x in doc["summary"]] == ["untuned", "a", "b", "numpy"]
    for name in ("fig8.png", "fig9.png"):
        assert paths[name].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_evaluate_runs_searches_and_custom_tuners(tmp_path) -> None:
    model = AnalyticCostModel()
    tuners = dict(
        ev.search_tuners(["greedy1", "beam2_dfs"], lambda: model, time_limit=10.0, max_measurements=40)
    )
    tuners["fixed"] = lambda p: (1.5, 0.25)
    tuners["broken"] = lambda p: 1 / 0
    report = ev.evaluate([P1, P2], tuners, model, numpy_fn=lambda p: 80.0, meta={"run": 1})
    assert report.methods == ("greedy1", "beam2_dfs", "fixed", "broken")
    for r in report.results:
        assert r.untuned == model.gflops(initial_state(r.problem)) and r.numpy == 80.0
        assert r.gflops["greedy1"] >= r.untuned and r.gflops["fixed"] == 1.5
        assert math.isnan(r.gflops["broken"])
        info = r.info["beam2_dfs"]
        assert info["num_measured"] <= 40 and r.gflops["beam2_dfs"] == model.gflops(
            ev.state_from_key(info["state"])
        )
    with pytest.raises(TimeRLError, match="reserved"):
        ev.evaluate([P1], {"numpy": lambda p: (1.0, 1.0)}, model, numpy_fn=lambda p: 1.0)
    with pytest.raises(TimeRLError, match="unknown searches"):
        ev.search_tuners(["greedy3"], lambda: model)


def test_best_of_keeps_the_best_fresh_measurement() -> None:
    readings = iter([3.0, 5.0, 4.0, 7.0, 1.0, 2.0])

    class Noisy:
        name = "noisy"

        def gflops(self, state) -> float:
            return next(readings)

    ref = ev.BestOf(Noisy, count=3)
    s = initial_state(P1)
    assert ref.gflops(s) == 5.0
    assert ref.gflops(apply_action(s, ACTIONS.index("down"))) == 5.0  # same schedule: cached
    assert ref.gflops(apply_action(s, ACTIONS.index("split_2"))) == 7.0


def test_policy_results_and_state_keys(tmp_path) -> None:
    model = AnalyticCostModel()
    s = initial_state(P2)
    for a in ("down", "split_16", "swap_down", "up", "split_4"):
        s = apply_action(s, ACTIONS.index(a))
    assert ev.state_from_key(s.key) == s
    with pytest.raises(TimeRLError, match="cannot parse"):
        ev.state_from_key("mm_64x64x64|c:m64|@0")
    results = {
        P1.name: {"seconds": 0.5, "actions": ["down", "split_16"]},
        P2.name: {"seconds": 0.7, "state": s.key},
        P3.name: {"seconds": 0.2, "gflops": 12.0},
    }
    path = tmp_path / "policy.json"
    path.write_text(json.dumps(results))
    tuner = ev.policy_tuner(path, model)
    expected = apply_action(apply_action(initial_state(P1), 1), ACTIONS.index("split_16"))
    assert tuner(P1) == Tuned(model.gflops(expected), 0.5, {"state": expected.key})
    assert tuner(P2).gflops == model.gflops(s)
    assert tuner(P3) == Tuned(12.0, 0.2)
    assert math.isnan(tuner(Problem(256, 256, 256)).gflops)
    path.write_text(json.dumps({P1.name: {"gflops": 1.0}}))
    with pytest.raises(TimeRLError, match="seconds"):
        ev.policy_tuner(path, model)


def test_cli_on_the_analytic_model(tmp_path, capsys) -> None:
    pytest.importorskip("matplotlib", reason="plots need pip install 'timerl[looptune]'")
    out = tmp_path / "cli"
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"mm_64x64x64": {"seconds": 0.1, "actions": ["split_8"]}}))
    argv = ["--measurer", "analytic", "--problems", "mm_64x64x64,mm_80x64x96", "--searches", "greedy1,random"]
    argv += ["--time-limit", "0.3", "--policy-results", str(policy), "--out", str(out), "--quiet"]
    assert ev.main(argv) == 0
    captured = capsys.readouterr()
    printed = captured.out
    assert "greedy1" in printed and "policy" in printed
    assert "measuring" not in captured.err  # --quiet: no progress bar
    with (out / "results.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [r["problem"] for r in rows] == ["mm_64x64x64", "mm_80x64x96"]
    assert float(rows[0]["greedy1_gflops"]) > 0
    doc = json.loads((out / "results.json").read_text())
    assert doc["methods"] == ["greedy1", "random", "policy"]
    assert [p["problem"] for p in doc["problems"]] == ["mm_64x64x64", "mm_80x64x96"]
    assert doc["problems"][1]["gflops"]["policy"] is None
    assert (out / "fig8.png").exists() and (out / "fig9.png").exists()


def _write_policy(folder, hidden: int = 8, seed: int = 0) -> None:
    """A checkpoint of random policy weights, as the PPO example saves them."""
    from timerl.envs.looptune.ir import MAX_LOOPS, NUM_FEATURES

    rng = np.random.default_rng(seed)
    sizes = [MAX_LOOPS * NUM_FEATURES, hidden, hidden, len(ACTIONS)]
    arrays = {}
    for k, (fi, fo) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        arrays[f"dnn.w{k}@3"] = rng.normal(0, 1 / np.sqrt(fi), (fi, fo)).astype(np.float32)
        arrays[f"dnn.b{k}@3"] = rng.normal(0, 0.3, fo).astype(np.float32)
    folder.mkdir(parents=True)
    np.savez(folder / "ckpt_3.npz", **arrays)
    (folder / "ckpt_3.json").write_text("{}")


def test_cli_policy_on_every_problem_searches_on_a_fixed_subset(tmp_path, capsys) -> None:
    pytest.importorskip("matplotlib", reason="plots need pip install 'timerl[looptune]'")
    _write_policy(tmp_path / "run" / "checkpoints")
    out = tmp_path / "cli"
    argv = [
        "--measurer",
        "analytic",
        "--num-problems",
        "6",
        "--search-problems",
        "2",
        "--searches",
        "greedy1",
    ]
    argv += ["--time-limit", "0.2", "--policy", str(tmp_path / "run"), "--out", str(out), "--remeasure", "1"]
    assert ev.main(argv) == 0
    assert "measuring" in capsys.readouterr().err  # the progress bar, with the time left
    doc = json.loads((out / "results.json").read_text())
    assert doc["methods"] == ["greedy1", "policy"]
    rows = doc["problems"]
    assert len(rows) == 6 and all(r["gflops"]["policy"] > 0 for r in rows)
    searched = [r["problem"] for r in rows if r["gflops"]["greedy1"] is not None]
    assert sorted(searched) == doc["meta"]["search_problems"] and len(searched) == 2
    for r in rows:
        steps = r["info"]["policy"]["step_gflops"]
        assert len(steps) == 11 and steps == sorted(steps)  # best so far: never decreases
        assert r["gflops"]["policy"] == pytest.approx(steps[-1])  # analytic: the same value again
        assert steps[0] == pytest.approx(r["untuned_gflops"])
    assert (out / "fig10.png").stat().st_size > 0 and (out / "fig8.png").exists()
    # the same subset every run
    assert ev._fixed_subset(list(range(440)), 32) == ev._fixed_subset(list(range(440)), 32)
    assert len(set(ev._fixed_subset(list(range(440)), 32))) == 32
