"""The measurement farm (issue 35) on a real cluster (a head and a worker node, separate
processes, ``ray.cluster_utils.Cluster``): a LoopTune run measured on a 2-worker farm equals
the run measured in this process; each key is measured and written to the cache once; a
worker that dies mid-batch is replaced and its measurement retried (counts exact); an
unreachable address fails when the env is made, before anything compiles."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers_dist import assert_same, two_node_cluster

import timerl as trl
from timerl.envs.looptune.analytic import AnalyticCostModel
from timerl.envs.looptune.ir import Problem

ray = pytest.importorskip("ray", reason="the Ray tests need ray (pip install -e '.[dist]')")

from ray.cluster_utils import Cluster  # noqa: E402

PROBLEMS = [Problem(64, 64, 64), Problem(64, 80, 96), Problem(96, 64, 128), Problem(128, 128, 64)]


class StuckOnce:
    """The analytic model, but the first measurement in ``marker``'s folder hangs (30 s)."""

    name = "stuck"

    def __init__(self, marker: str) -> None:
        self.marker, self.model = marker, AnalyticCostModel()
        self.peak = self.model.peak

    def gflops(self, state: Any) -> float:
        try:
            os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return self.model.gflops(state)
        time.sleep(30.0)
        return self.model.gflops(state)


class LoggedModel:
    """A deterministic stand-in measurer (the analytic model) that appends every real
    measurement (key, pid) to ``log`` after ``delay`` seconds, and exits its process once,
    mid-measurement, at the ``die_at``-th measurement in the log's folder (a worker lost)."""

    name = "logged"

    def __init__(self, log: str, delay: float = 0.0, die_at: int = -1) -> None:
        self.log, self.delay, self.die_at = log, delay, die_at
        self.model = AnalyticCostModel()
        self.peak = self.model.peak

    def gflops(self, state: Any) -> float:
        time.sleep(self.delay)
        if self.die_at >= 0 and len(_lines(self.log)) == self.die_at:
            try:  # one worker only: the marker's creation is atomic
                os.close(os.open(self.log + ".died", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                pass
            else:
                os._exit(1)
        with open(self.log, "a") as f:
            f.write(json.dumps([state.schedule_key, os.getpid()]) + "\n")
        return self.model.gflops(state)


def _lines(path: str) -> list[list]:
    return [json.loads(x) for x in Path(path).read_text().splitlines()] if Path(path).exists() else []


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """A head node and one worker node (separate processes), one CPU each, this process connected."""
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # LoggedModel to the workers
    with two_node_cluster() as cluster:
        yield cluster


def _rollout(measurer: Any, farm: Any = None, bounds: tuple[int, int, int] = (4, 2, 6)) -> tuple[dict, Any]:
    """Random actions on LoopTune (6-action episodes over (b, i, t)); sinks each
    iteration's observations and rewards."""
    got: dict[tuple, np.ndarray] = {}
    ctx = trl.Context(dims=("b", "i", "t"))
    with ctx as ((b, B), (i, I), (t, T)):
        env = trl.env.make(
            "looptune.mm", num_envs=B, seed=1, problems=PROBLEMS, measurer=measurer, episode_len=6, farm=farm
        )
        o = trl.like(env.obs_space, domain=(b, i, t), name="o")
        a = (trl.rand((), domain=(b, i, t)) * 10.0).cast(trl.int64)
        o[b, i, 0] = env.reset(domain=(b, i))
        o2, r, d = env.step(a)
        o[b, i, t + 1] = o2
        o2[0:B, i, 0:T].sink(lambda v, p: got.__setitem__(("o", p["i"]), np.array(v)))
        r[0:B, i, 0:T].sink(lambda v, p: got.__setitem__(("r", p["i"]), np.array(v)))
    nb, ni, nt = bounds
    ctx.compile({B: nb, I: ni, T: nt}, backend="jax", seed=4).execute()
    return got, env


def test_farm_equals_local_measurement(cluster: Cluster) -> None:
    want, local = _rollout("analytic")
    farm = trl.dist.ray_farm(address=cluster.address, num_workers=2)
    got, env = _rollout("analytic", farm)
    assert_same(got, want)
    assert any(want[("r", i)].any() for i in (0, 1))  # the actions changed GFLOPS
    meas = env.measurer
    assert meas.writes and set(meas.writes.values()) == {1}  # each key measured, written once
    assert meas.stats.measured == len(meas.writes) == farm.start().stats.calls
    nodes = {p["node"] for p in farm.start().placement}
    assert len(nodes) == 2  # one worker on each node
    assert [h.final_gflops for h in env.history] == [h.final_gflops for h in local.history]
    farm.start().close()


def test_each_key_measured_and_written_once(cluster: Cluster, tmp_path: Path) -> None:
    """A batch with repeated and cached states: each distinct schedule is measured once on
    the farm (the workers' log) and written once (the driver's counts)."""
    from timerl.envs.looptune.ir import apply_action, initial_state

    log = str(tmp_path / "measured.jsonl")
    farm = trl.dist.ray_farm(address=cluster.address, num_workers=2)
    meas = farm.looptune_measurer(LoggedModel(log))
    s0 = [initial_state(p) for p in PROBLEMS]
    s1 = [apply_action(s, 4) for s in s0]  # a split
    first = meas.gflops_many(s0 + s0[:2])
    second = meas.gflops_many(s1 + s0)
    local = AnalyticCostModel()
    assert first == [local.gflops(s) for s in s0 + s0[:2]]
    assert second == [local.gflops(s) for s in s1 + s0]
    keys = [k for k, _ in _lines(log)]
    assert sorted(keys) == sorted({s.schedule_key for s in s0 + s1})  # each once
    assert len({pid for _, pid in _lines(log)}) == 2  # both workers measured
    assert set(meas.writes.values()) == {1} and len(meas.writes) == len(keys)
    farm.start().close()


def test_a_worker_killed_mid_batch(
    cluster: Cluster, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker's process exits during a measurement of a batch (the 3rd measured): the
    worker is replaced, the measurement retried; results equal the local ones, each key is
    measured once (the lost measurement left no result) and written once."""
    log = str(tmp_path / "measured.jsonl")
    farm = trl.dist.ray_farm(address=cluster.address, num_workers=2, max_retries=2)
    live = farm.start()
    before = live.stats
    meas = farm.looptune_measurer(LoggedModel(log, delay=0.05, die_at=2))
    from timerl.envs.looptune.ir import apply_action, initial_state

    states = [initial_state(p) for p in PROBLEMS] + [apply_action(initial_state(p), 5) for p in PROBLEMS]
    with caplog.at_level("WARNING", logger="timerl.dist"):
        got = meas.gflops_many(states)
    local = AnalyticCostModel()
    assert got == [local.gflops(s) for s in states]
    stats = live.stats
    assert Path(log + ".died").exists()
    assert (stats.retries - before.retries, stats.replacements - before.replacements) == (1, 1)
    assert stats.calls - before.calls == len(states)  # 8 answered; the lost call counted once
    keys = [k for k, _ in _lines(log)]
    assert sorted(keys) == sorted(s.schedule_key for s in states)
    assert set(meas.writes.values()) == {1} and len(meas.writes) == len(states)
    assert "was lost during gflops" in caplog.text
    pids = {p["pid"] for p in live.refresh_placement()}
    assert len(pids) == 2 and all(p is not None for p in pids)
    live.close()


def test_a_stuck_worker_is_replaced_after_the_call_timeout(cluster: Cluster, tmp_path: Path) -> None:
    from timerl.envs.looptune.ir import initial_state

    farm = trl.dist.ray_farm(address=cluster.address, num_workers=2, call_timeout_s=2.0)
    meas = farm.looptune_measurer(StuckOnce(str(tmp_path / "stuck")))
    states = [initial_state(p) for p in PROBLEMS]
    t = time.perf_counter()
    assert meas.gflops_many(states) == [AnalyticCostModel().gflops(s) for s in states]
    assert time.perf_counter() - t < 20.0
    stats = farm.start().stats
    assert (stats.retries, stats.replacements, stats.calls) == (1, 1, len(states))
    farm.start().close()


def test_a_farm_writes_the_tvm_cache_once_per_key(cluster: Cluster, tmp_path: Path) -> None:
    """TVM on the workers: the driver appends each new schedule to the TVM disk cache file
    once; a second measurer over the same folder reads them without measuring."""
    pytest.importorskip("tvm", reason="needs TVM")
    from timerl.envs.looptune.ir import initial_state

    farm = trl.dist.ray_farm(address=cluster.address, num_workers=2)
    meas = farm.looptune_measurer("tvm", cache_dir=tmp_path)
    states = [initial_state(Problem(64, 64, 64)), initial_state(Problem(64, 64, 80))] * 2
    g = meas.gflops_many(states)
    assert g[0] > 0 and g[:2] == g[2:]
    assert meas.disk is not None
    lines = meas.disk.path.read_text().splitlines()
    assert len(lines) == 2 and meas.disk.path.name.startswith("tvm-")
    again = farm.looptune_measurer("tvm", cache_dir=tmp_path)
    assert again.gflops_many(states) == g and again.stats.disk_hits == 2 and again.stats.measured == 0
    farm.start().close()


def test_rewards_on_a_tvm_farm_use_the_workers_peak(
    cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``reward="step"`` divides by the peak of the machines that measure: on a farm the
    workers' (read here from the peak cache they are given, one entry for this CPU), never
    the driver's own measurement."""
    pytest.importorskip("tvm", reason="needs TVM")
    from timerl.envs.looptune import env as looptune_env
    from timerl.envs.looptune import tvm_lower

    (tmp_path / "peak.json").write_text(json.dumps({tvm_lower.host_cpu(): 123.5}))

    def driver_peak(*_: Any, **__: Any) -> float:
        raise AssertionError("the driver measured its own peak")

    monkeypatch.setattr(looptune_env, "machine_peak", driver_peak)
    farm = trl.dist.ray_farm(address=cluster.address, num_workers=2)
    with trl.Context(dims=("b", "t")) as ((b, B), (t, T)):
        env = trl.env.make(
            "looptune.mm", num_envs=B, problems=PROBLEMS, measurer="tvm", farm=farm, cache_dir=tmp_path
        )
    assert env.peak == 123.5
    farm.start().close()


def test_an_unreachable_farm_fails_at_make(cluster: Cluster) -> None:
    with trl.Context(dims=("b", "t")) as ((b, B), (t, T)):
        with pytest.raises(
            trl.dist.DistributedError, match=r"cannot reach the Ray cluster at '127\.0\.0\.1:9'"
        ):
            trl.env.make(
                "looptune.mm",
                num_envs=B,
                measurer="analytic",
                farm=trl.dist.ray_farm(address="127.0.0.1:9", num_workers=2),
            )
    with pytest.raises(trl.dist.DistributedError, match="need 5 CPUs, the cluster has 2"):
        trl.dist.ray_farm(address=cluster.address, num_workers=5).start()


class SyntheticRelease:
    """A deterministic stand-in RELEASE measurer: GFLOPS a function of the configuration."""

    def measure(self, space: Any, cfg: Any) -> Any:
        from timerl.envs.release.measure import Measurement

        c = np.asarray(cfg, dtype=float)
        return Measurement(tuple(cfg), float(100.0 - np.sum((c - 2.0) ** 2)), True, 0.01)


def test_release_tune_on_a_farm_equals_local(cluster: Cluster) -> None:
    """RELEASE's tuner with a farm measurer: each sampled batch goes to the workers at once;
    the measurements, in order, equal the local tuner's; each configuration written once."""
    pytest.importorskip("lightgbm")
    from timerl.envs.release.sampling import GreedySampler
    from timerl.envs.release.search import SimulatedAnnealing
    from timerl.envs.release.space import Layer, template_space
    from timerl.envs.release.tuner import tune

    space = template_space(Layer.matmul("mm", 64, 64, 64))
    want = tune(space, SimulatedAnnealing(n_iter=30), GreedySampler(8, 0.05), SyntheticRelease(), 24, 1)
    farm = trl.dist.ray_farm(address=cluster.address, num_workers=2)
    meas = farm.release_measurer(measurer=SyntheticRelease())
    got = tune(space, SimulatedAnnealing(n_iter=30), GreedySampler(8, 0.05), meas, 24, 1)
    assert [m.config for m in got.measurements] == [m.config for m in want.measurements]
    assert [m.gflops for m in got.measurements] == [m.gflops for m in want.measurements]
    assert meas.measured == len(meas.writes) == 24 and set(meas.writes.values()) == {1}
    farm.start().close()


def test_tiramisu_on_a_farm(cluster: Cluster, tmp_path: Path) -> None:
    """Tiramisu schedules compiled and timed on the workers: the rollout runs, its
    observations equal the local measurer's run (the schedules do not depend on timings),
    and the driver appends each measurement to the cache file once."""
    import shutil

    if shutil.which("gcc") is None:
        pytest.skip("the Tiramisu env needs gcc")
    from timerl.envs.tiramisu import benchmarks as bm
    from timerl.envs.tiramisu.actions import NUM_ACTIONS

    def rollout(farm: Any, cache: Path) -> tuple[list, Any]:
        obs: list = []
        ctx = trl.Context(dims=("b", "i", "t"))
        with ctx as ((b, B), (i, I), (t, T)):
            env = trl.env.make(
                "tiramisu.benchmarks",
                num_envs=B,
                split="test",
                episode_len=3,
                programs=[bm.mvt(64), bm.cvtcolor(32, 32)],
                threads=1,
                cache_dir=cache,
                farm=farm,
            )
            o = trl.like(env.obs_space, domain=(b, i, t), name="obs")
            o[b, i, 0] = env.reset(domain=(b, i))
            mask = env.action_mask(o)
            a = (mask * trl.rand((NUM_ACTIONS,), domain=(b, i, t))).argmax(-1)
            o[b, i, t + 1], r, d = env.step(a)
            o[0:B, i, 0:T].sink(lambda v, p: obs.append(np.array(v)))
        ctx.compile({B: 2, I: 1, T: 3}, backend="torch", seed=2).execute()
        return obs, env

    want, _ = rollout(None, tmp_path / "local")
    farm = trl.dist.ray_farm(address=cluster.address, num_workers=2)
    got, env = rollout(farm, tmp_path / "farm")
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)
    meas = env.measurer
    assert meas.writes and set(meas.writes.values()) == {1}
    lines = (tmp_path / "farm" / "measurements-1t-cpu.jsonl").read_text().splitlines()
    assert len(lines) == len(meas.writes) == meas.measured
    assert all(np.isfinite(h.final_seconds) for h in env.history) and len(env.history) == 2
    farm.start().close()


def test_a_lost_worker_node(cluster: Cluster, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A node with a farm worker goes away mid-batch (its raylet and the worker end): the
    lost measurement goes to the next free worker, the batch's results equal the local ones,
    each key measured once; the replacement starts on a node with a free CPU."""
    import threading

    from timerl.envs.looptune.ir import apply_action, initial_state

    cluster.add_node(num_cpus=1)  # a spare node (Cluster.add_node works in the main thread only)
    log = str(tmp_path / "measured.jsonl")
    farm = trl.dist.ray_farm(address=cluster.address, num_workers=2)
    live = farm.start()
    (doomed,) = [n for n in cluster.worker_nodes if n.node_id in {p["node"] for p in live.placement}][:1]
    meas = farm.looptune_measurer(LoggedModel(log, delay=0.4))

    def remove_node() -> None:
        time.sleep(0.6)
        cluster.remove_node(doomed)

    states = [initial_state(p) for p in PROBLEMS] + [apply_action(initial_state(p), 5) for p in PROBLEMS]
    mover = threading.Thread(target=remove_node)
    mover.start()
    with caplog.at_level("WARNING", logger="timerl.dist"):
        got = meas.gflops_many(states)
    mover.join()
    assert got == [AnalyticCostModel().gflops(s) for s in states]
    stats = live.stats
    assert stats.retries == stats.replacements == 1 and stats.calls == len(states)
    keys = [k for k, _ in _lines(log)]
    assert sorted(keys) == sorted(s.schedule_key for s in states)  # each measured once
    nodes = {p["node"] for p in live.refresh_placement()}
    assert len(nodes) == 2 and doomed.node_id not in nodes  # the replacement on the spare node
    assert "was lost during gflops" in caplog.text
    live.close()
