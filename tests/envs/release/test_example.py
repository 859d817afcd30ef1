"""A smoke run of the RELEASE study (``timerl.envs.release.study``): all four combinations, a tiny budget."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

pytest.importorskip("tvm")


def _release():
    """The study harness as a module."""
    from timerl.envs.release import study as release

    return release


def _tiny(release, **kw):
    """release.Args for a smoke run: MM64, 10 measurements, a tiny PPO search, no progress bar."""
    small = dict(
        workloads="MM64",
        budget=10,
        n_init=4,
        seeds=1,
        num_envs=4,
        iterations=1,
        episode_len=3,
        sa_iters=20,
        batch_size=2,  # greedy and adaptive: >= 3 rounds after the 4 random configurations
        k_min=1,
        k_max=2,
        progress=False,
    )
    return replace(release.Args(), **{**small, **kw})


def test_example_runs_all_four_combinations(tmp_path) -> None:
    release = _release()

    args = _tiny(release, remeasure=1, out_dir=str(tmp_path))
    out = release.main(args)
    rows = {r["combo"]: r for r in out["rows"]}
    assert set(rows) == {"sa+greedy", "sa+adaptive", "rl+greedy", "rl+adaptive"}
    for r in rows.values():
        assert r["seeds"] == 1 and r["best_gflops"] > 0 and r["invalid"] == 0
        assert 1 <= r["meas_to_95"] <= 10
    assert rows["sa+greedy"]["x_fewer_meas_to_95"] == pytest.approx(1.0)
    assert rows["sa+greedy"]["retimed_vs_sa_greedy"] == pytest.approx(1.0)
    assert all(r["retimed_gflops"] > 0 for r in rows.values())
    assert (tmp_path / "curves.png").stat().st_size > 0
    saved = json.loads((tmp_path / "results.json").read_text())
    assert len(saved["curves"]["MM64"]["rl+adaptive"]) == 1
    # the PPO program is compiled once per tuning run, however many rounds it ran
    for combo in ("rl+greedy", "rl+adaptive"):
        (stats,) = saved["run_stats"]["MM64"][combo]
        assert stats["compiles"] == 1 and stats["rounds"] >= 2


def test_example_combo_with_a_rank_objective(tmp_path) -> None:
    """``search+sampler:rank:itervar`` runs that combination with the ranking cost model on the
    loop-nest features beside the plain one (same layer, same measurer cache, here timed by the
    CPU-time clock) and reports it under its own name."""
    release = _release()

    args = replace(
        release.Args(),
        workloads="MM64",
        combos="sa+greedy,sa+greedy:rank:itervar",
        clock="cpu",
        budget=10,
        n_init=4,
        seeds=1,
        sa_iters=20,
        batch_size=2,
        remeasure=0,
        progress=False,
        out_dir=str(tmp_path),
    )
    out = release.main(args)
    rows = {r["combo"]: r for r in out["rows"]}
    assert set(rows) == {"sa+greedy", "sa+greedy:rank:itervar"}
    ranked = out["results"]["MM64"]["sa+greedy:rank:itervar"][0]
    assert len(ranked.measurements) == 10 and ranked.best.gflops > 0
    # the same 4 random configurations first, whatever the cost model
    plain = out["results"]["MM64"]["sa+greedy"][0]
    assert [m.config for m in ranked.measurements[:4]] == [m.config for m in plain.measurements[:4]]


def test_combo_options() -> None:
    """``search+sampler:options`` override the global flags for that combination only; an
    unknown option or search raises."""
    release = _release()

    base = release.Args()
    s, m, a = release.combo_args(base, "rl+adaptive:rank:itervar:ep20:knee1.3")
    assert (s, m) == ("rl", "adaptive")
    assert (a.cost_objective, a.cost_features, a.episode_len, a.knee) == ("rank", "itervar", 20, 1.3)
    _, _, lev = release.combo_args(base, "rl+adaptive:local1")
    assert (lev.local, base.local) == (1, 0)
    _, _, walk = release.combo_args(base, "rl+adaptive:walk2")
    assert (walk.walk, base.walk) == (2, 0)
    _, _, stall = release.combo_args(base, "rl+adaptive:walk1:stall3")
    assert (stall.walk, stall.walk_stall, base.walk_stall) == (1, 3, 0)
    _, _, rep = release.combo_args(base, "rl+adaptive:best:init4")
    assert (rep.representative, rep.n_init, base.representative, base.n_init) == ("best", 4, "centroid", 8)
    _, _, ucb = release.combo_args(base, "rl+adaptive:ucb0.5")
    assert (ucb.ucb, ucb.ensemble, base.ucb, base.ensemble) == (0.5, release.UCB_MEMBERS, 0.0, 0)
    _, _, ens = release.combo_args(base, "rl+adaptive:ens3:ucb1")
    assert (ens.ucb, ens.ensemble) == (1.0, 3)
    _, _, s11 = release.combo_args(base, "rl+adaptive:maximin:ucb1:decay40:priorC12:prows256:puntil32")
    assert (s11.init_design, s11.ucb_decay, s11.prior, s11.prior_rows, s11.prior_until) == (
        "maximin",
        40,
        "C12",
        256,
        32,
    )
    assert (base.init_design, base.ucb_decay, base.prior) == ("random", 0, "")
    assert release.combo_args(base, "rl+adaptive:lhs")[2].init_design == "lhs"
    _, _, plan = release.combo_args(base, "sa+greedy:batch8")
    assert (plan.batch_size, plan.plan_size, base.batch_size, base.plan_size) == (8, 64, 64, 64)
    assert release.combo_args(replace(base, plan_size=128), "sa+greedy:batch96")[2].plan_size == 128
    assert release.combo_args(base, "sa+greedy:batch100")[2].plan_size == 100  # the plan holds the batch
    _, _, plain = release.combo_args(base, "sa+greedy")
    assert plain == base
    for bad in (
        "sa+greedy:fast",
        "bo+greedy",
        "sa+greedy:localx",
        "sa+greedy:walk",
        "sa+greedy:stall",
        "sa+greedy:ucb",
        "sa+greedy:ucbx",
        "sa+greedy:init",
        "sa+greedy:sobol",
        "sa+greedy:decay",
        "sa+greedy:priorC99",
        "sa+greedy:batch",
        "sa+greedy:batch0",
    ):
        with pytest.raises(ValueError):
            release.combo_args(base, bad)


def test_combo_options_reach_the_tuner(tmp_path, monkeypatch) -> None:
    """A combination's ``initN``, ``ensN``, ``ucbK`` and session 11's ``lhs`` / ``decayN`` reach
    ``tune`` for that combination only
    (``run_layer`` passes the combination's arguments, not the global ones)."""
    release = _release()
    seen: list[tuple] = []
    batches: list[int] = []

    class Stop(Exception):
        pass

    def fake_tune(space, search, sampler, measurer, budget, seed, n_init, *rest):
        seen.append((n_init, *rest[6:10], rest[10] is not None, rest[11]))
        batches.append(sampler.batch_size)
        raise Stop

    monkeypatch.setattr(release, "tune", fake_tune)
    args = _tiny(release, out_dir=str(tmp_path))
    for combo, want in (
        ("sa+greedy", (4, 0, 0.0, "random", 0, False, 64)),
        ("sa+greedy:init3:ens4:ucb0.5", (3, 4, 0.5, "random", 0, False, 64)),
        ("sa+greedy:lhs:ucb0.5:decay32", (4, 5, 0.5, "lhs", 32, False, 64)),
    ):
        with pytest.raises(Stop):
            release.run_layer(replace(args, combos=combo), "MM64", None)
        assert seen[-1] == want
    assert batches == [args.batch_size] * 3 == [2, 2, 2]  # _tiny's
    with pytest.raises(Stop):  # session 12's batchN: the greedy sampler's batch, for that combination
        release.run_layer(replace(args, combos="sa+greedy:batch5"), "MM64", None)
    assert batches[-1] == 5


def test_example_on_a_table_repeats_exactly(tmp_path) -> None:
    """``--table``: the first process measures and records every configuration; a second one
    with the same seed measures nothing (every first ask a table hit) and repeats the first's
    runs exactly (the same configurations in the same order, the same GFLOPS and charges)."""
    release = _release()

    args = _tiny(release, combos="sa+greedy,rl+adaptive", remeasure=0, table=str(tmp_path / "table.jsonl"))
    first = release.main(replace(args, out_dir=str(tmp_path / "a")))
    second = release.main(replace(args, out_dir=str(tmp_path / "b")))
    t1, t2 = first["table"], second["table"]
    assert t1["hits"] == 0 and t1["measured"] == t1["records"] >= 10
    assert t2["measured"] == 0 and t2["hits"] == t1["measured"] and t2["records"] == t1["records"]
    for combo in ("sa+greedy", "rl+adaptive"):
        (r1,), (r2,) = first["results"]["MM64"][combo], second["results"]["MM64"][combo]
        assert r1.measurements == r2.measurements
    saved = json.loads((tmp_path / "b" / "results.json").read_text())
    assert saved["table"] == t2


def test_prior_from_the_table(tmp_path) -> None:
    """``--prior LAYER``: ``--prior-rows`` of that layer's records in the table (the same draw
    for the same seed), as its features and GFLOPS over the best drawn (invalid 0); without a
    table, or with no records of the layer, it raises."""
    release = _release()
    from timerl.envs.release.measure import Measurement, TemplateMeasurer
    from timerl.envs.release.space import layer, template_space

    mm = layer("MM64")
    space = template_space(mm)
    meas = TemplateMeasurer(table=str(tmp_path / "t.jsonl"))
    rng = np.random.default_rng(0)
    cfgs = list(dict.fromkeys(space.random(rng) for _ in range(30)))[:20]
    for j, c in enumerate(cfgs):
        meas.table.add(mm, Measurement(c, float(j), j != 3, 0.1, "" if j != 3 else "fails"))
    args = replace(release.Args(), prior="MM64", prior_rows=8, table=str(tmp_path / "t.jsonl"))
    x, y = release.prior_data(meas, args, 0)
    assert x.shape == (8, space.features(cfgs[:1]).shape[1]) and y.max() == 1.0 and y.min() >= 0.0
    x2, y2 = release.prior_data(meas, args, 0)
    np.testing.assert_array_equal(x, x2)
    assert not np.array_equal(release.prior_data(meas, args, 1)[1], y)
    assert release.prior_data(meas, replace(args, prior=""), 0) is None
    with pytest.raises(ValueError, match="no records"):
        release.prior_data(meas, replace(args, prior="MM256"), 0)
    with pytest.raises(ValueError, match="needs --table"):
        release.prior_data(TemplateMeasurer(), args, 0)


def test_short_example_tunes_one_layer(tmp_path) -> None:
    """``examples/release.py`` (the tuner on one layer, SA + greedy against RL + adaptive) runs
    on a tiny matmul and returns both best-so-far curves over the whole budget."""
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[3] / "examples" / "release.py"
    spec = importlib.util.spec_from_file_location("release_example", path)
    example = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = example  # dataclasses look their module up
    spec.loader.exec_module(example)
    curves = example.main(example.Args(layer="MM64", budget=10, out_dir=str(tmp_path), quiet=True))
    assert set(curves) == {"sa+greedy", "rl+adaptive"}
    assert all(len(c) == 10 and np.all(np.diff(c) >= 0) for c in curves.values())
    assert (tmp_path / "curves.png").exists()
