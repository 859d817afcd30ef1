"""Env runners on Ray (issue 35): ``trl.env.make("gym.<id>", num_envs=B,
runners=trl.dist.ray_runners(num_runners=K, address=...))`` on a real cluster (a head and a
worker node, separate processes, ``ray.cluster_utils.Cluster``): a K-runner run observes what
the one-process run observes, step for step; a runner killed mid-run is replaced, its envs'
episodes are cut short (done) and the run's step count stays exact; an unreachable address
fails at ``make`` time."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from helpers_dist import assert_same, two_node_cluster

import timerl as trl

ray = pytest.importorskip("ray", reason="the Ray tests need ray (pip install -e '.[dist]')")

from ray.cluster_utils import Cluster  # noqa: E402

SEED = 3


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """A head node and one worker node (separate processes), this process connected."""
    with two_node_cluster() as cluster:
        yield cluster


@pytest.fixture
def address(cluster: Cluster) -> str:
    return cluster.address


def _rollout(
    env_id: str,
    runners: Any,
    bounds: tuple[int, int, int] = (4, 2, 25),
    autoreset: bool = False,
    on_step: Callable[[Any, dict[str, int]], None] | None = None,
    between: Callable[[Any], None] | None = None,
    **kwargs: Any,
) -> tuple[dict[tuple, np.ndarray], Any]:
    """Random actions; episodes over (b, i, t) (autoreset: one reset, iterations continue);
    sinks each iteration's observations, rewards and done flags."""
    got: dict[tuple, np.ndarray] = {}
    ctx = trl.Context(dims=("b", "i", "t"))
    with ctx as ((b, B), (i, I), (t, T)):
        env = trl.env.make(env_id, num_envs=B, seed=SEED, runners=runners, autoreset=autoreset, **kwargs)
        n_act = int(env.action_space.n)
        o = trl.like(env.obs_space, domain=(b, i, t), name="o")
        a = (trl.rand((), domain=(b, i, t)) * float(n_act)).cast(trl.int64)
        if autoreset:
            o0 = env.reset(domain=(b,))
            o2, r, d = env.step(a)
            o[b, 0, 0] = o0
            o[b, i, 0] = o2[b, i - 1, T - 1]
        else:
            o[b, i, 0] = env.reset(domain=(b, i))
            o2, r, d = env.step(a)
        o[b, i, t + 1] = o2
        o2[0:B, i, 0:T].sink(lambda v, p: got.__setitem__(("o", p["i"]), np.array(v)))
        r[0:B, i, 0:T].sink(lambda v, p: got.__setitem__(("r", p["i"]), np.array(v)))
        d[0:B, i, 0:T].sink(lambda v, p: got.__setitem__(("d", p["i"]), np.array(v)))
        if on_step is not None:
            r[0:B, i, t].sink(lambda v, p: on_step(env, p))
    nb, ni, nt = bounds
    executor = ctx.compile({B: nb, I: ni, T: nt}, backend="jax", seed=SEED)
    executor.execute()
    if between is not None:  # run the program again after `between(env)`
        between(env)
        got.clear()
        executor.execute()
    return got, env


def test_two_runners_equal_one_process(address: str) -> None:
    want, _ = _rollout("gym.CartPole-v1", None)
    got, env = _rollout("gym.CartPole-v1", trl.dist.ray_runners(num_runners=2, address=address))
    assert_same(got, want)
    assert want[("d", 1)].any() and not want[("d", 1)].all()  # episodes end at different steps
    stats = env.runners.stats
    assert (stats.num_runners, stats.env_steps, stats.replacements) == (2, 4 * 2 * 25, 0)
    env.runners.close()


@pytest.mark.parametrize(
    ("env_id", "kw"),
    [
        # PPO's setting: CartPole's NumPy vector env, episodes restarted inside step
        ("gym.CartPole-v1", {"bounds": (4, 2, 40)}),
        # no native vector env (synchronous vector env, one seed per env), 7-step episodes
        ("gym.MountainCar-v0", {"bounds": (4, 2, 10), "max_episode_steps": 7}),
    ],
)
def test_runners_equal_one_process_with_autoreset(address: str, env_id: str, kw: dict) -> None:
    want, _ = _rollout(env_id, None, autoreset=True, **kw)
    got, env = _rollout(env_id, trl.dist.ray_runners(num_runners=2, address=address), autoreset=True, **kw)
    assert_same(got, want)
    assert want[("d", 0)].sum() >= 2  # episodes restarted
    env.runners.close()


def test_a_killed_runner_is_replaced_with_autoreset(address: str) -> None:
    def kill_runner_1(env: Any, p: dict[str, int]) -> None:
        if p["i"] == 0 and p["t"] == 4 and env.runners.stats.replacements == 0:
            ray.kill(env.runners.actors[1])

    kw = {"bounds": (4, 2, 40), "autoreset": True}
    want, _ = _rollout("gym.CartPole-v1", None, **kw)
    got, env = _rollout(
        "gym.CartPole-v1", trl.dist.ray_runners(num_runners=2, address=address), on_step=kill_runner_1, **kw
    )
    stats = env.runners.stats
    assert (stats.replacements, stats.truncated_envs, stats.env_steps) == (1, 2, 4 * 2 * 40)
    np.testing.assert_array_equal(got[("o", 0)][:, :5], want[("o", 0)][:, :5])
    assert got[("d", 0)][2:, 5].all() and not got[("r", 0)][2:, 5].any()  # envs 2, 3 cut at t = 5
    assert not want[("d", 0)][2:, 5].any()
    env.runners.close()


def test_a_killed_runner_is_replaced(address: str, caplog: pytest.LogCaptureFixture) -> None:
    killed: list[int] = []

    def kill_runner_0(env: Any, p: dict[str, int]) -> None:
        if p["i"] == 0 and p["t"] == 2 and not killed:
            ray.kill(env.runners.actors[0])
            killed.append(p["t"])

    want, _ = _rollout("gym.CartPole-v1", None)
    with caplog.at_level("WARNING", logger="timerl.dist"):
        got, env = _rollout(
            "gym.CartPole-v1", trl.dist.ray_runners(num_runners=2, address=address), on_step=kill_runner_0
        )
    stats = env.runners.stats
    assert killed and stats.replacements == 1 and stats.truncated_envs == 2
    assert stats.env_steps == 4 * 2 * 25  # no step lost or counted twice
    assert "was lost; replacing it" in caplog.text
    # runner 1's envs (2, 3) and the next episode (a fresh reset) are untouched by the loss
    for key in want:
        if key[1] == 1:
            np.testing.assert_array_equal(got[key], want[key], err_msg=str(key))
        np.testing.assert_array_equal(got[key][2:], want[key][2:], err_msg=str(key))
    # runner 0's envs (0, 1): the same up to the loss (the step after the sink at t = 2), then
    # done (truncated) with reward 0, repeating the last observation
    np.testing.assert_array_equal(got[("o", 0)][:2, :3], want[("o", 0)][:2, :3])
    assert got[("d", 0)][:2, 3:].all() and not got[("r", 0)][:2, 3:].any()
    assert not want[("d", 0)][:2, 3].all()
    np.testing.assert_array_equal(got[("o", 0)][:2, 3:], np.repeat(got[("o", 0)][:2, 2:3], 22, axis=1))
    env.runners.close()


def test_a_lost_worker_node(cluster: Cluster) -> None:
    """The worker node goes away mid-episode (its raylet and runner processes end) and a new
    one joins: the runner of the lost node is replaced on it, the run completes with its step
    count exact. One CPU per runner, one per node: a runner on each node."""
    lost: list[int] = []

    def replace_worker_node(env: Any, p: dict[str, int]) -> None:
        if p["i"] == 0 and p["t"] == 2 and not lost:
            head = cluster.head_node.node_id
            lost.extend(j for j, where in enumerate(env.runners.placement) if where["node"] != head)
            (worker,) = list(cluster.worker_nodes)
            cluster.remove_node(worker)
            cluster.add_node(num_cpus=1)

    want, _ = _rollout("gym.CartPole-v1", None)
    runners = trl.dist.ray_runners(num_runners=2, address=cluster.address, cpus_per_runner=1.0)
    got, env = _rollout("gym.CartPole-v1", runners, on_step=replace_worker_node)
    assert len(lost) == 1
    stats = env.runners.stats
    assert (stats.replacements, stats.truncated_envs, stats.env_steps) == (1, 2, 4 * 2 * 25)
    cut = slice(2 * lost[0], 2 * lost[0] + 2)
    assert got[("d", 0)][cut, 3:].all() and not got[("r", 0)][cut, 3:].any()
    for key in want:
        if key[1] == 1:  # the next episode is untouched
            np.testing.assert_array_equal(got[key], want[key], err_msg=str(key))
    env.runners.close()


def test_a_runner_lost_between_runs_is_replaced_at_reset(address: str) -> None:
    """A runner lost before an episode starts: its replacement resets as it would have, so the
    run is unchanged."""
    want, _ = _rollout("gym.CartPole-v1", None)
    got, env = _rollout(
        "gym.CartPole-v1",
        trl.dist.ray_runners(num_runners=2, address=address),
        between=lambda env: ray.kill(env.runners.actors[1]),
    )
    assert_same(got, want)
    stats = env.runners.stats
    assert (stats.replacements, stats.truncated_envs, stats.env_steps) == (1, 0, 2 * 4 * 2 * 25)
    env.runners.close()


def test_an_unreachable_cluster_fails_at_make(address: str) -> None:
    with trl.Context(dims=("b", "t")) as ((b, B), (t, T)):
        with pytest.raises(
            trl.dist.DistributedError, match=r"cannot reach the Ray cluster at '127\.0\.0\.1:9'"
        ):
            trl.env.make(
                "gym.CartPole-v1", num_envs=B, runners=trl.dist.ray_runners(2, address="127.0.0.1:9")
            )
        with pytest.raises(trl.dist.DistributedError, match="host:port"):
            trl.env.make("gym.CartPole-v1", num_envs=B, runners=trl.dist.ray_runners(2, address="nowhere"))


def test_runners_must_split_the_envs_evenly(address: str) -> None:
    ctx = trl.Context(dims=("b", "t"))
    with ctx as ((b, B), (t, T)):
        env = trl.env.make("gym.CartPole-v1", num_envs=B, runners=trl.dist.ray_runners(3, address=address))
        o0 = env.reset(domain=(b,))
        o0.sink(lambda v, p: None)
    with pytest.raises(trl.RTDefinitionError, match="3 runners cannot split 4 envs evenly"):
        ctx.compile({B: 4, T: 2}, backend="jax").execute()
