"""``trl.env.make("looptune.mm")`` in a real RT program, on the analytic cost model."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import timerl as trl
from timerl.envs.looptune.analytic import AnalyticCostModel
from timerl.envs.looptune.dataset import split
from timerl.envs.looptune.env import LoopTuneEnv
from timerl.envs.looptune.ir import ACTIONS, MAX_LOOPS, Problem, apply_action, features, initial_state
from timerl.errors import TimeRLError

NB, NI, LEN = 3, 2, 10


def test_reinforce_program_rewards_done_and_history() -> None:
    """Per step, the reward is (GFLOPS(S') - GFLOPS(S)) / peak of the replayed state (0 for
    an invalid action); the episode ends after exactly 10 actions; test problems come in
    order; the history matches the rewards."""
    rec: dict[str, list[Any]] = {}

    def keep(key: str) -> Any:
        return lambda v, pt: rec.setdefault(key, []).append(((pt["i"], pt["b"]), np.array(v)))

    ctx = trl.Context(dims=("b", "i", "t"))
    with ctx as ((b, B), (i, I), (t, T)):
        env = trl.env.make("looptune.mm", num_envs=B, seed=0, split="test", measurer="analytic")
        dnn = trl.DNNBuilder(domain=(i,)).from_env(env, hidden=[16]).build()
        o = trl.like(env.obs_space, domain=(b, i, t))
        o[b, i, 0] = env.reset(domain=(b, i))
        a = dnn(o)
        o[b, i, t + 1], r, d = env.step(a)
        g = r[b, i, t:T].discounted_sum(0.99)
        (-dnn.log_prob(a) * g).mean().backward()
        trl.optim.Adam(dnn.params, lr=1e-2).step()
        r[b, i, 0:T].sink(keep("r"))
        d[b, i, 0:T].sink(keep("d"))
        a[b, i, 0:T].sink(keep("a"))
        o[b, i, 0].sink(keep("o0"))
    ctx.compile({B: NB, I: NI, T: d}, backend="torch").execute()

    assert env.obs_space.shape == (MAX_LOOPS * 20,) and env.action_space.n == len(ACTIONS)
    rews, dones, acts, obs0 = (dict(rec[k]) for k in ("r", "d", "a", "o0"))
    assert sorted(rews) == [(it, e) for it in range(NI) for e in range(NB)]
    test = split("mm")[1]
    model = AnalyticCostModel()
    by_point = {(h.reset_point, h.env_index): h for h in env.history}
    assert len(env.history) == NB * NI
    for (it, e), rw in rews.items():
        assert rw.shape == (LEN,) and dones[it, e].tolist() == [False] * (LEN - 1) + [True]
        h = by_point[it, e]
        assert h.problem == test[it * NB + e]  # the test split, in order
        assert tuple(int(x) for x in acts[it, e]) == h.actions
        np.testing.assert_array_equal(obs0[it, e], features(initial_state(h.problem)).reshape(-1))
        s = initial_state(h.problem)
        for step, act in enumerate(h.actions):
            nxt = apply_action(s, act)
            want = (model.gflops(nxt) - model.gflops(s)) / model.peak
            assert rw[step] == pytest.approx(want, abs=1e-6)
            if nxt is s:  # an invalid action: exactly zero
                assert rw[step] == 0.0
            s = nxt
        assert s.key == h.final_key and h.initial_key == initial_state(h.problem).key
        assert float(rw.sum()) == pytest.approx((h.final_gflops - h.initial_gflops) / model.peak, abs=1e-5)
        assert h.best_gflops >= max(h.initial_gflops, h.final_gflops)
    assert any(float(r.sum()) != 0.0 for r in rews.values())


def _state_env(**kw: Any) -> tuple[LoopTuneEnv, Any]:
    ctx = trl.Context(dims=("b", "i", "t"))
    with ctx as ((b, B), (i, I), (t, T)):
        env = LoopTuneEnv("mm", num_envs=B, measurer="analytic", **kw)
    env._state.bind({B: 2})
    return env, env._state


def test_invalid_actions_reward_zero_and_done_envs_stay_done() -> None:
    p = Problem(64, 64, 64)
    env, st = _state_env(problems=[p], episode_len=3)
    obs = st.reset({"i": 0})
    assert obs.shape == (2, MAX_LOOPS * 20)
    up, split64 = ACTIONS.index("up"), ACTIONS.index("split_64")
    _, rew, done = st.step(np.array([up, split64]))  # both invalid at the start (cursor 0, size 64)
    assert rew.tolist() == [0.0, 0.0] and not done.any()
    swap = ACTIONS.index("swap_down")
    _, rew, _ = st.step(np.array([swap, ACTIONS.index("down")]))
    assert rew[0] != 0.0 and rew[1] == 0.0
    last_obs, _, done = st.step(np.array([up, up]))
    assert done.all()
    again_obs, rew, done = st.step(np.array([swap, swap]))  # done: frozen, no reward
    assert done.all() and not rew.any() and np.array_equal(again_obs, last_obs)
    assert len(env.history) == 2 and env.history[0].actions == (up, swap, up)


def test_train_split_is_seeded_by_reset_point() -> None:
    _, st = _state_env(seed=5)

    def drawn(k: int) -> list[Problem]:
        st.reset({"i": k})
        return [ep.initial.problem for ep in st.episodes]

    first, again, other = drawn(0), drawn(0), drawn(1)
    train = set(split("mm")[0])
    assert first == again != other and set(first) <= train


def test_bad_arguments() -> None:
    ctx = trl.Context(dims=("b", "i", "t"))
    with ctx as ((b, B), _, _):
        with pytest.raises(TimeRLError, match="valid datasets: mm, bmm, conv1d, conv2d"):
            trl.env.make("looptune.conv3d", num_envs=B, measurer="analytic")
        with pytest.raises(TimeRLError, match="max_loops=6 is less than the 9 loops"):
            trl.env.make("looptune.conv2d", num_envs=B, measurer="analytic", max_loops=6)
        with pytest.raises(TimeRLError, match="unknown split"):
            trl.env.make("looptune.mm", num_envs=B, split="val", measurer="analytic")
        with pytest.raises(TimeRLError, match="unknown LoopTune measurer"):
            trl.env.make("looptune.mm", num_envs=B, measurer="gcc")
        with pytest.raises(TimeRLError, match="'looptune.<dataset>'"):
            trl.env.make("loop.mm", num_envs=B)


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_action_mask_marks_the_no_ops(backend: str) -> None:
    """``env.action_mask(o)`` is ``is_valid`` of the state ``o`` shows; a policy that
    prefers ``up`` (a no-op at the top) and ``swap_down`` picks valid actions only."""
    from timerl.envs.looptune.ir import is_valid

    masks: dict[tuple[int, int], np.ndarray] = {}
    ctx = trl.Context(dims=("b", "t"))
    with ctx as ((b, B), (t, T)):
        env = trl.env.make("looptune.mm", num_envs=B, seed=0, split="test", measurer="analytic")
        o = trl.like(env.obs_space, domain=(b, t))
        o[b, 0] = env.reset(domain=(b,))
        valid = env.action_mask(o)
        prefer = trl.const(np.array([9.0, 0, 0, 5.0, 0, 0, 0, 0, 0, 0], np.float32))
        a = (prefer + (valid - 1.0) * 1e9).argmax(-1)
        o[b, t + 1], _, d = env.step(a)
        valid.sink(lambda v, pt: masks.__setitem__((pt["b"], pt["t"]), np.array(v)))
    ctx.compile({B: 2, T: d}, backend=backend).execute()
    assert len(env.history) == 2 and len(masks) == 2 * LEN
    for h in env.history:
        s = initial_state(h.problem)
        for step, act in enumerate(h.actions):
            want = [float(is_valid(s, k)) for k in range(len(ACTIONS))]
            assert masks[h.env_index, step].tolist() == want
            assert is_valid(s, act)
            s = apply_action(s, act)
        # up is a no-op at the top: swap_down (the cursor follows the loop), then up, ...
        assert h.actions == (ACTIONS.index("swap_down"), ACTIONS.index("up")) * (LEN // 2)
