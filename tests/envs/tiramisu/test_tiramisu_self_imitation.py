"""Self-imitation (``--sil-coef``): the env keeps each program's best measured episode and
replays it in a training episode (``demo_actions``), and the agent's loss on replayed steps."""

from __future__ import annotations

import numpy as np
import pytest

import timerl as trl
from timerl.agents.tiramisu import TiramisuArgs, make_env, sil_loss
from timerl.envs.tiramisu import benchmarks as bm
from timerl.envs.tiramisu.actions import ACTIONS, NEXT, NUM_ACTIONS
from timerl.envs.tiramisu.env import TiramisuTask, _Episode, _TiramisuState
from timerl.envs.tiramisu.measure import Measurer

A = {a.name: k for k, a in enumerate(ACTIONS)}


@pytest.fixture(scope="module")
def measurer():
    return Measurer(disk_cache=False, threads=1)


def _state(measurer, demo_prob: float) -> _TiramisuState:
    st = _TiramisuState(
        "tiramisu.test", 2, 0, [TiramisuTask(bm.mvt(64), measurer)], True, 4, None, demo_prob, 1.1
    )
    st.bind({})
    return st


def _finished(task: TiramisuTask, actions: tuple[int, ...], best_step: int, speedup: float, predicted=False):
    ep = _Episode(0, 0, task)
    ep.actions, ep.best_step, ep.best_t, ep.best_predicted = (
        list(actions),
        best_step,
        ep.t0 / speedup,
        predicted,
    )
    return ep


def test_the_best_measured_episode_is_kept_up_to_its_fastest_schedule(measurer) -> None:
    st = _state(measurer, 1.0)
    task = st.tasks[0]
    st._remember(_finished(task, (A["P(0)"], NEXT, A["U(4)"]), 1, 1.5))
    assert st.demos["mvt"] == (1.5, (A["P(0)"],))
    st._remember(_finished(task, (A["I(0,1)"], A["P(0)"]), 2, 1.3))  # slower: not kept
    st._remember(_finished(task, (A["I(0,1)"],), 1, 3.0, predicted=True))  # a prediction: not kept
    st._remember(_finished(task, (A["P(0)"],), 0, 1.0))  # nothing faster than the start
    assert st.demos["mvt"] == (1.5, (A["P(0)"],))


def test_a_replayed_episode_plays_the_demonstration_then_the_policy(measurer) -> None:
    st = _state(measurer, 1.0)
    st.demos["mvt"] = (1.5, (A["P(0)"], NEXT))
    st.reset({"i": 0})
    sampled = np.array([A["U(4)"], A["U(4)"]])
    played, flags = [], []
    for _ in range(3):
        mask = st.mask(legal=True)
        a, f = st.demo_actions(sampled, mask)
        played.append(a.tolist())
        flags.append(f.tolist())
        st.step(a)
    assert played == [[A["P(0)"]] * 2, [NEXT] * 2, [A["U(4)"]] * 2]
    assert flags == [[1.0, 1.0], [1.0, 1.0], [0.0, 0.0]]
    assert [ep.demo_steps for ep in st.episodes] == [2, 2]
    # below demo_min_speedup, or at demo_prob 0: no replay
    st.demos["mvt"] = (1.05, (A["P(0)"],))
    st.reset({"i": 1})
    assert st.demo_actions(sampled, None)[1].tolist() == [0.0, 0.0]
    off = _state(measurer, 0.0)
    off.demos["mvt"] = (2.0, (A["P(0)"],))
    off.reset({"i": 0})
    assert off.demo_actions(sampled, None)[1].tolist() == [0.0, 0.0]


def test_a_masked_demonstration_action_ends_the_replay(measurer) -> None:
    st = _state(measurer, 1.0)
    st.demos["mvt"] = (1.5, (A["P(0)"], A["U(4)"]))
    st.reset({"i": 0})
    mask = np.ones((2, NUM_ACTIONS), np.float32)
    mask[1, A["P(0)"]] = 0.0
    a, f = st.demo_actions(np.array([NEXT, NEXT]), mask)
    assert a.tolist() == [A["P(0)"], NEXT] and f.tolist() == [1.0, 0.0]
    assert st.episodes[1].demo == ()


def test_demo_actions_in_an_rt_program(measurer) -> None:
    args = TiramisuArgs(sil_coef=1.0, demo_prob=1.0, episode_len=3, surrogate="off", threads=1)
    flags: list[tuple[int, float]] = []
    ctx = trl.Context(dims=("b", "i", "t"))
    with ctx as ((b, B), (i, I), (t, T)):
        env = make_env(args, B, programs=[bm.mvt(64)], measurer=measurer)
        env._state.demos["mvt"] = (2.0, (A["P(0)"],))
        o = trl.like(env.obs_space, domain=(b, i, t), name="obs")
        o[b, i, 0] = env.reset(domain=(b, i))
        mask = env.action_mask(o, legal=True)
        nxt = trl.const(np.eye(NUM_ACTIONS, dtype=np.float32)[NEXT])
        a, demo = env.demo_actions((mask * 0.0 + nxt).argmax(-1), mask)  # the policy: always next
        o[b, i, t + 1], _, d = env.step(a)
        demo.sink(lambda v, pt: flags.append((pt["t"], float(v))))
    ctx.compile({B: 1, I: 1, T: d}, backend="torch").execute()
    assert env.history[0].actions == (A["P(0)"], NEXT, NEXT)
    assert env.history[0].demo_steps == 1
    assert sorted(flags) == [(0, 1.0), (1, 0.0), (2, 0.0)]


def test_sil_loss() -> None:
    got = []
    logp = np.array([-2.0, -0.5, -1.0], np.float32)
    ret = np.array([1.0, 0.2, -0.3], np.float32)
    v = np.array([0.5, 0.4, -0.5], np.float32)
    ctx = trl.Context(dims=("b",))
    with ctx as ((b, B),):
        out = sil_loss(trl.const(logp)[b], trl.const(ret)[b], trl.const(v)[b], 0.1)
        out.sink(lambda x, pt: got.append((pt["b"], float(x))))
    ctx.compile({B: 3}, backend="torch").execute()
    gap = np.maximum(ret - v, 0.0)
    want = -logp * gap + 0.05 * gap * gap
    assert np.allclose([x for _, x in sorted(got)], want, atol=1e-6)
    assert sorted(got)[1][1] == 0.0  # the return below the value: no loss


@pytest.mark.parametrize("which", ["action_mask", "demo_actions"])
def test_an_episode_udf_before_reset_names_the_env_and_the_call(measurer, which: str) -> None:
    from timerl.envs.tiramisu.env import _DemoFn, _MaskFn
    from timerl.errors import RuntimeExecutionError

    st = _state(measurer, 1.0)
    fn = _MaskFn(st, True) if which == "action_mask" else _DemoFn(st, False)
    with pytest.raises(RuntimeExecutionError, match=f"tiramisu.test: {which} before reset"):
        fn._checked([np.zeros(2, np.int64)], {"i": 0})
    st.reset({"i": 0})
    out = fn._checked([np.zeros(2, np.int64)], {"i": 0})  # after the reset: the call's result
    if which == "action_mask":
        assert out[0].shape[-1] == NUM_ACTIONS and out[0].any()
    else:
        assert len(out) == 2 and out[0].size == 2
