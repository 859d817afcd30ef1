"""``timerl.agents.dqn`` (through ``examples/dqn_looptune.py``, which trains it): the prioritised
replay buffer, and the DQN program on CartPole."""

from __future__ import annotations

import math

import numpy as np
import pytest
from example_pdg import dqn, lower_example

from timerl.agents import dqn as dqn_agent
from timerl.pdg.ops import OpKind
from timerl.schedule.ast import Exec, Loop, walk
from timerl.schedule.scheduler import schedule_pdg

# -- the replay buffer ------------------------------------------------------------------------


def _filled(n: int, alpha: float = 1.0, capacity: int = 64) -> dqn_agent.PrioritizedReplay:
    buf = dqn_agent.PrioritizedReplay(capacity, (2,), alpha=alpha)
    obs = np.arange(2 * n, dtype=np.float32).reshape(n, 2)
    buf.add(obs, np.arange(n) % 3, np.arange(n, dtype=np.float32), obs + 1, np.zeros(n))
    return buf


def test_priorities_drive_sampling_frequency() -> None:
    """P(j) = p_j^alpha / sum p^alpha: empirical frequencies over many draws match it."""
    buf = _filled(4, alpha=0.5)
    prio = np.array([1.0, 4.0, 9.0, 16.0])
    buf.update(np.arange(4), prio)
    rng = np.random.default_rng(0)
    idx = np.concatenate([buf.sample(32, 0.4, rng).index for _ in range(500)])
    freq = np.bincount(idx, minlength=4) / len(idx)
    want = np.sqrt(prio + buf.eps) / np.sqrt(prio + buf.eps).sum()
    np.testing.assert_allclose(freq, want, atol=0.01)


def test_importance_weights() -> None:
    """w_j = (N P(j))^-beta / max over the minibatch: 1 for its least likely transition."""
    buf = _filled(3, alpha=1.0)
    buf.update(np.arange(3), np.array([1.0, 2.0, 4.0]))
    mb = buf.sample(60, 0.5, np.random.default_rng(1))
    p = buf.mass[:3] / buf.mass[:3].sum()
    assert set(mb.index.tolist()) == {0, 1, 2}
    want = (3 * p[mb.index]) ** -0.5 / (3 * p.min()) ** -0.5
    np.testing.assert_allclose(mb.weight, want, rtol=1e-6)
    np.testing.assert_allclose(mb.weight[mb.index == 0], 1.0)
    assert np.all(buf.sample(8, 0.0, np.random.default_rng(1)).weight == 1.0)  # beta = 0: none


def test_new_transitions_get_the_largest_priority_and_the_ring_wraps() -> None:
    buf = _filled(3, alpha=1.0, capacity=4)
    buf.update(np.array([0]), np.array([5.0]))
    obs = np.full((3, 2), 7.0, np.float32)
    n = buf.add(obs, np.zeros(3), np.ones(3), obs, np.ones(3), valid=np.array([True, False, True]))
    assert n == 2 and buf.size == 4 and buf.pos == 1  # slots 3 and 0 (wrapped)
    assert buf.obs[0, 0] == 7.0 and buf.obs[3, 0] == 7.0 and buf.obs[1, 0] == 2.0
    assert buf.mass[0] == pytest.approx(5.0 + buf.eps) and buf.mass[3] == buf.mass[0]


def test_sampling_is_reproducible_by_seed() -> None:
    """The sample UDF seeds its generator with (seed, i, k): same point, same minibatch."""

    def udfs(seed: int) -> dqn_agent.ReplayUDFs:
        return dqn_agent.ReplayUDFs(_filled(20), batch_size=8, learning_starts=1, seed=seed)

    def draw(r: dqn_agent.ReplayUDFs, i: int, k: int) -> np.ndarray:
        return r.sample([np.float32(0.4), np.float32(0.0)], {"i": i, "k": k})[6]

    a, b = udfs(3), udfs(3)
    np.testing.assert_array_equal(draw(a, 2, 1), draw(b, 2, 1))
    assert not np.array_equal(draw(a, 2, 1), draw(a, 2, 2))
    assert not np.array_equal(draw(a, 2, 1), draw(udfs(4), 2, 1))
    warm = dqn_agent.ReplayUDFs(_filled(20), batch_size=8, learning_starts=50, seed=3)
    assert np.all(warm.sample([np.float32(0.4), np.float32(0.0)], {"i": 0, "k": 0})[5] == 0.0)


def test_push_stores_running_actors_and_bootstraps_at_the_time_limit() -> None:
    """Only alive actors' transitions are stored; done at the env's step limit is a
    truncation (stored as not done), done before it a termination."""
    buf = dqn_agent.PrioritizedReplay(16, (2,))
    r = dqn_agent.ReplayUDFs(buf, batch_size=4, learning_starts=1, seed=0, time_limit=5)
    obs = np.zeros((3, 2), np.float32)
    done, alive = np.array([1.0, 1.0, 0.0]), np.array([1.0, 1.0, 0.0])
    ins = [obs, np.zeros(3, np.int64), np.ones(3, np.float32), obs, done, alive, np.zeros(3)]
    r.push(ins, {"i": 0, "t": 3})
    r.push(ins, {"i": 0, "t": 4})  # t + 1 == 5: the step limit
    assert buf.size == 4 and buf.done[:4].tolist() == [1.0, 1.0, 0.0, 0.0]


# -- the program ------------------------------------------------------------------------------

_SMALL = dict(
    env_id="gym.CartPole-v1",
    iterations=3,
    num_envs=2,
    learner_steps=3,
    batch_size=8,
    learning_starts=8,
    buffer_size=256,
    eps_fraction=0.5,
)


def _loop_of(ast, nid):
    return [
        x
        for x in walk(ast)
        if isinstance(x, Loop) and any(isinstance(y, Exec) and y.node == nid for y in walk(x.body))
    ][-1]


def test_schedule_learns_then_acts_in_each_iteration() -> None:
    """One statement per kind of work: K learner steps, then the episode, inside the loop over i."""
    pdg = lower_example(dqn.build, dqn.Args(**_SMALL), lambda v, p: None)
    sched = schedule_pdg(pdg)
    by_name = {n.name: n.id for n in pdg if n.op.kind is OpKind.UDF}
    learn = _loop_of(sched.ast, by_name["replay.sample"])
    act = _loop_of(sched.ast, by_name["replay.push"])
    assert learn is _loop_of(sched.ast, by_name["replay.update"]) and learn is not act
    order = [x for x in walk(sched.ast) if x is learn or x is act]
    assert order == [learn, act]


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_short_training_run(backend: str, capsys) -> None:
    means = dqn.main(dqn.Args(**_SMALL, backend=backend, seed=1))
    assert len(means) == 3 and all(math.isfinite(m) and 8 <= m <= 500 for m in means)
    out = capsys.readouterr().out
    assert "iter    2  mean return" in out and "eps 0.050" in out


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_compiled_equals_reference_evaluator(backend: str) -> None:
    """The whole program (env, replay UDFs with order tokens, Double DQN, Adam over (i, k),
    target w[i - i % 2, 0], per-actor epsilon) against the schedule-free evaluator."""
    from timerl.backends import get_backend
    from timerl.runtime.reference import reference_evaluate

    args = dqn.Args(**_SMALL, backend=backend, target_every=2, seed=2)
    got: list[tuple] = []

    def sink(v, p):
        got.append((p["i"], p.get("b", -1), *np.asarray(v, np.float64).tolist()))

    dqn.build(args, sink).execute()
    compiled = sorted(got)
    got.clear()
    pdg = lower_example(dqn.build, args, sink, seed=args.seed)
    reference_evaluate(pdg, get_backend(backend), seed=args.seed)
    ref = sorted(got)
    assert len(compiled) == len(ref) == 3 * 2 + 3
    for c, r in zip(compiled, ref, strict=True):
        if c[1] >= 0:  # (i, b, episode return, steps): integers, equal iff the same actions
            assert c == r
        else:  # (i, -1, mean loss, epsilon)
            assert c[0] == r[0] and c[2:] == pytest.approx(r[2:], rel=1e-5, abs=1e-7)


def test_cli_checkpoint_and_resume(tmp_path, capsys) -> None:
    """--checkpoint-every / --resume: the Q-network, Adam state and the replay buffer are
    saved, and the iterations after the resume point match a straight run (returns, and
    the loss, which depends on the restored buffer)."""

    def last_line() -> str:  # "iter 2  mean return ...  eps ...  loss ..." without the counters
        line = [x for x in capsys.readouterr().out.splitlines() if x.startswith("iter    2")][0]
        return line.split("env steps")[0]

    base = dict(_SMALL, backend="torch", seed=4, checkpoint_every=2)
    straight = dqn.main(dqn.Args(**base, checkpoint_dir=str(tmp_path / "a")))
    want = last_line()
    first = dqn.main(dqn.Args(**{**base, "iterations": 2}, checkpoint_dir=str(tmp_path / "b")))
    assert (tmp_path / "b" / "ckpt_1.json").exists() and (tmp_path / "b" / "replay_1.npz").exists()
    rest = dqn.main(dqn.Args(**{**base, "checkpoint_every": 0}, resume=str(tmp_path / "b")))
    assert first == straight[:2]
    assert rest == straight[2:]
    assert last_line() == want


def test_looptune_run_saves_the_q_policy_and_reports_it(tmp_path, capsys) -> None:
    """On LoopTune (analytic model: CI), the example saves the last Q-network as a
    ``Policy`` (relu) and reports its greedy schedules with the evaluation PPO uses."""
    from timerl.looptune import Policy

    args = dqn.Args(
        env_id="looptune.mm",
        measurer="analytic",
        iterations=3,
        learner_steps=2,
        batch_size=8,
        learning_starts=8,
        num_envs=2,
        eval_problems=2,
        train_problems=3,
        out_dir=str(tmp_path),
        hidden=16,
    )
    dqn.main(args)
    pol = Policy.load(tmp_path)
    assert pol.activation == "relu" and pol.layers[0][0].shape == (320, 16)
    out = capsys.readouterr().out
    assert "dqn              2" in out and (tmp_path / "results.csv").is_file()
    assert (tmp_path / "fig10.png").is_file()
