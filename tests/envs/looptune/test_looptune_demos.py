"""LoopTune's demonstrations (each problem's best measured episode) and PPO's buffer imitation
of them (``ppo.build`` with ``bc_coef``), on the analytic cost model."""

from __future__ import annotations

import math

import numpy as np
import pytest

import timerl as trl
from timerl.agents import ppo
from timerl.envs.demos import Demonstrations, buffer_rows
from timerl.envs.looptune.analytic import AnalyticCostModel
from timerl.envs.looptune.env import LoopTuneEnv
from timerl.envs.looptune.ir import ACTIONS, Problem, apply_action, features, initial_state, is_valid
from timerl.errors import TimeRLError
from timerl.looptune import Policy
from timerl.runtime.checkpoint import read_values

PROBLEMS = [Problem(64, 96, 80), Problem(128, 64, 112), Problem(96, 128, 64)]
# m/2 with the inner m2 under k: the move that pays on real CPUs (docs/looptune.md)
MOVE = tuple(ACTIONS.index(a) for a in ("split_2", "down", "swap_down", "swap_down"))


def _planted_env(num_envs: object) -> LoopTuneEnv:
    """LoopTune on ``PROBLEMS`` (analytic measurer) with ``MOVE`` remembered as every
    problem's demonstration."""
    env = trl.env.make(
        "looptune.mm", num_envs=num_envs, seed=0, problems=PROBLEMS, measurer="analytic", reward="log"
    )
    for p in PROBLEMS:
        env.demonstrations.remember(p.name, 2.0, MOVE)
    return env


def test_demonstrations_keep_the_fastest_episode() -> None:
    d = Demonstrations()
    assert d.remember("p", 1.2, [1, 2])
    assert not d.remember("p", 1.1, [3])  # slower: the kept one stays
    assert not d.remember("p", math.nan, [3]) and not d.remember("q", 2.0, [])
    assert d.remember("p", 1.5, (4,))
    assert d["p"] == (1.5, (4,))
    assert d.actions("p", 1.4) == (4,) and d.actions("p", 1.6) == () and d.actions("q", 0.0) == ()


def test_buffer_rows_lay_out_one_part_of_the_tasks() -> None:
    def rows_of(p: int | None, per: int) -> tuple[np.ndarray, ...]:
        return np.full(per, -1 if p is None else p), np.full(per, 0.0 if p is None else 1.0)

    ids, w = buffer_rows(5, 6, part=1, parts=2, rows_of=rows_of)  # tasks 1, 3 and an empty share
    assert ids.tolist() == [1, 1, 3, 3, -1, -1] and w.tolist() == [1, 1, 1, 1, 0, 0]
    ids, _ = buffer_rows(5, 5, part=0, parts=1, rows_of=rows_of)
    assert ids.tolist() == [0, 1, 2, 3, 4]
    with pytest.raises(TimeRLError, match="multiple of 3"):
        buffer_rows(5, 4, part=0, parts=2, rows_of=rows_of)


def _random_episodes(iterations: int = 6) -> LoopTuneEnv:
    """A uniformly random policy on ``PROBLEMS`` (an RT program), its env returned."""
    ctx = trl.Context(dims=("b", "i", "t"))
    with ctx as ((b, B), (i, I), (t, T)):
        env = trl.env.make(
            "looptune.mm", num_envs=B, seed=3, problems=PROBLEMS, measurer="analytic", reward="log"
        )
        o = trl.like(env.obs_space, domain=(b, i, t))
        o[b, i, 0] = env.reset(domain=(b, i))
        a = (trl.rand((len(ACTIONS),), domain=(b, i, t)) + o.sum() * 0.0).argmax(-1)
        o[b, i, t + 1], _, d = env.step(a)
    ctx.compile({B: 4, I: iterations, T: d}, backend="torch").execute()
    return env


def test_env_keeps_each_problems_best_measured_episode_without_no_ops() -> None:
    env = _random_episodes()
    model = AnalyticCostModel()
    demos = env.demonstrations
    assert demos, "random episodes on the analytic model found no gain at all"
    for p in PROBLEMS:
        recs = [r for r in env.history if r.problem == p]
        best = max(r.best_gflops / r.initial_gflops for r in recs)
        if best <= 1.0:
            assert p.name not in demos
            continue
        speedup, actions = demos[p.name]
        assert speedup == pytest.approx(best)
        s = initial_state(p)
        for a in actions:  # every kept action changes the nest
            assert is_valid(s, a)
            s = apply_action(s, a)
        assert model.gflops(s) / model.gflops(initial_state(p)) == pytest.approx(speedup)


def test_demo_buffer_replays_the_demonstrations_from_the_untuned_nest() -> None:
    env = _random_episodes()
    st = env._state
    p0 = PROBLEMS[0]
    st.demos.clear()
    st.demos.remember(p0.name, 1.9, MOVE)
    st.demos.remember(PROBLEMS[1].name, 1.05, MOVE)  # below min_speedup: an empty row
    L = env.episode_len
    assert env.demo_slots() == len(PROBLEMS) * L and env.demo_slots(2) == 2 * L
    obs, act, w = st.demo_buffer(env.demo_slots(), 1.1)
    assert obs.shape == (3 * L, env.obs_space.shape[0]) and act.shape == w.shape == (3 * L,)
    assert w.tolist() == [1.0] * len(MOVE) + [0.0] * (3 * L - len(MOVE))
    assert tuple(act[: len(MOVE)].tolist()) == MOVE
    s = initial_state(p0)
    for j, a in enumerate(MOVE):
        np.testing.assert_array_equal(obs[j], features(s).reshape(-1))
        s = apply_action(s, a)
    # the minibatch share of part 1 of 2: problem 1 alone (its demonstration is too slow), then padding
    _, _, w1 = st.demo_buffer(env.demo_slots(2), 1.1, part=1, parts=2)
    assert w1.sum() == 0.0


def _demo_probability(weights: dict[str, np.ndarray]) -> float:
    """The geometric mean over the demonstration's steps on every problem of the policy's
    probability of the demonstrated action."""
    pol = Policy.from_weights(weights)
    logps = []
    for p in PROBLEMS:
        s = initial_state(p)
        for a in MOVE:
            z = pol.logits(s)
            logps.append(z[a] - z.max() - math.log(np.exp(z - z.max()).sum()))
            s = apply_action(s, a)
    return math.exp(float(np.mean(logps)))


@pytest.mark.parametrize("bc_coef", [0.0, 1.0])
def test_ppo_buffer_imitation_learns_the_demonstrated_move(tmp_path, bc_coef: float) -> None:
    """PPO with ``bc_coef`` makes the demonstrated actions likely on every problem (a planted
    demonstration, as a search would give); without it they stay near uniform (1/10). Over
    random streams (seeds 1-3), 60 iterations gave 0.64-0.90 with ``bc_coef`` (40: 0.52-0.73)."""
    args = ppo.PPOArgs(
        env_id="looptune.mm",
        backend="torch",
        num_envs=3,
        iterations=60,
        hidden=32,
        norm_adv=False,
        lr=1e-2,
        bc_coef=bc_coef,
        demo_min_speedup=1.1,
        out_dir=str(tmp_path),
        checkpoint_every=60,
        checkpoint_dir=str(tmp_path / "ckpt"),
        quiet=True,
    )

    def env_fn(a: ppo.PPOArgs, B: object) -> LoopTuneEnv:
        return _planted_env(B)

    ppo.build(args, lambda v, pt: None, env_fn).execute()
    latest = {k: v[max(v)] for k, v in read_values(str(tmp_path / "ckpt")).items() if k.startswith("dnn.")}
    prob = _demo_probability(latest)
    if bc_coef:
        assert prob > 0.6, prob
    else:
        assert prob < 0.3, prob


def test_bc_needs_an_env_with_demonstrations(tmp_path) -> None:
    args = ppo.PPOArgs(env_id="CartPole-v1", iterations=1, bc_coef=0.5, out_dir=str(tmp_path), quiet=True)
    with pytest.raises(TimeRLError, match="--bc-coef needs an env with demonstrations"):
        ppo.build(args, lambda v, pt: None)


def _dqn_demo_argmax(tmp_path, monkeypatch, demo_coef: float) -> float:
    """DQN (``dqn.build``) on ``PROBLEMS`` with ``MOVE`` planted as every problem's
    demonstration: the fraction of the demonstration's steps, over every problem, whose
    action is the greedy Q-policy's."""
    from timerl.agents import dqn

    args = dqn.DQNArgs(
        env_id="looptune.mm",
        measurer="analytic",
        backend="torch",
        num_envs=2,
        iterations=8,
        learner_steps=16,
        batch_size=16,
        learning_starts=16,
        hidden=32,
        lr=3e-3,
        demo_coef=demo_coef,
        demo_min_speedup=1.1,
        seed_demos=False,
        train_problems=0,
        out_dir=str(tmp_path),
        quiet=True,
    )

    def make_env(a: dqn.DQNArgs, B: object) -> LoopTuneEnv:
        return _planted_env(B)

    monkeypatch.setattr(dqn, "make_env", make_env)
    params: dict[str, np.ndarray] = {}
    dqn.build(args, lambda v, pt: None, final_params=params).execute()
    pol = Policy.from_weights(params, "dqn", activation="relu")
    hits = []
    for p in PROBLEMS:
        s = initial_state(p)
        for a in MOVE:
            hits.append(int(np.argmax(pol.logits(s))) == a)
            s = apply_action(s, a)
    return float(np.mean(hits))


@pytest.mark.parametrize("demo_coef", [0.0, 1.0])
def test_dqn_margin_loss_makes_the_demonstrated_move_greedy(tmp_path, monkeypatch, demo_coef: float) -> None:
    """DQN with ``demo_coef`` (DQfD's large-margin loss on the demonstration buffer) makes
    every demonstrated action the greedy one on every problem; without it, the Q-network
    learned from 16 random-ish episodes picks few of them."""
    hit = _dqn_demo_argmax(tmp_path, monkeypatch, demo_coef)
    if demo_coef:
        assert hit == 1.0, hit
    else:
        assert hit < 0.5, hit
