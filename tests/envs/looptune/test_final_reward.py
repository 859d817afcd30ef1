"""``reward="final"`` and ``reward="best"`` against the per-step reward (analytic model)."""

from __future__ import annotations

import numpy as np

from timerl.envs.looptune.analytic import AnalyticCostModel
from timerl.envs.looptune.ir import Problem


class _Counting(AnalyticCostModel):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def gflops(self, state):  # type: ignore[no-untyped-def]
        self.calls += 1
        return super().gflops(state)


def _episode(reward: str, actions: list[int], **kw: object) -> tuple[np.ndarray, int, object]:
    import timerl as trl

    ctx = trl.Context(dims=("t",))
    with ctx:
        meas = _Counting()
        env = trl.env.make("looptune.mm", problems=[Problem(96, 64, 128)], measurer=meas, reward=reward, **kw)
    st = env._state
    st.bind({})
    st.reset({"i": 0})
    rews = [float(st.step(np.array([a]))[1]) for a in actions]
    return np.array(rews), meas.calls, env.history[-1]


def test_final_reward_sums_to_the_per_step_return() -> None:
    acts = [4, 1, 3, 1, 9, 0, 2, 5, 1, 6]  # splits, moves and swaps, some of them no-ops
    step_r, step_calls, step_h = _episode("step", acts)
    fin_r, fin_calls, fin_h = _episode("final", acts)
    assert np.all(fin_r[:-1] == 0.0)
    np.testing.assert_allclose(fin_r.sum(), step_r.sum(), rtol=1e-5, atol=1e-7)
    assert fin_h.final_key == step_h.final_key and fin_h.actions == step_h.actions
    assert fin_calls == 2 < step_calls  # the untuned nest and the final one


def test_best_reward_pays_each_new_best_once() -> None:
    # split m by 2, then move the inner m below k (a gain), then wreck it (n split 64)
    acts = [4, 1, 3, 1, 9, 0, 2, 5, 1, 6]
    step_r, _, step_h = _episode("step", acts)
    best_r, _, best_h = _episode("best", acts)
    assert best_h.final_key == step_h.final_key and best_h.best_key == step_h.best_key
    assert np.all(best_r >= 0.0)
    peak = AnalyticCostModel().peak
    np.testing.assert_allclose(best_r.sum(), (best_h.best_gflops - best_h.initial_gflops) / peak, rtol=1e-5)
    # the running best of the per-step returns, step by step
    running = np.maximum.accumulate(np.concatenate([[0.0], np.cumsum(step_r)]))
    np.testing.assert_allclose(best_r, np.diff(running), rtol=1e-5, atol=1e-7)
    assert step_r.min() < 0.0  # the sequence does lose GFLOPS somewhere, which best does not pay back


class _Scripted(AnalyticCostModel):
    """GFLOPS from a table by schedule, the untuned nest 100."""

    def __init__(self, values: dict[str, float]) -> None:
        super().__init__()
        self.values = values

    def gflops(self, state):  # type: ignore[no-untyped-def]
        return self.values.get(state.schedule_key, 100.0)


def test_log_reward_is_the_log_speedup_of_the_best_and_ignores_noise() -> None:
    import timerl as trl
    from timerl.envs.looptune.ir import ACTIONS, apply_action, initial_state

    p = Problem(96, 64, 128)
    names = ("split_2", "split_4", "split_8", "down", "down", "down", "swap_down", "swap_down")
    seq = [ACTIONS.index(a) for a in names]
    keys = []
    s = initial_state(p)
    for a in seq:
        s = apply_action(s, a)
        if s.schedule_key not in keys:
            keys.append(s.schedule_key)
    assert len(keys) == 5  # the cursor moves do not change the schedule
    # 102 (noise: under 3 %), 150 (a gain), 140 (a loss), 160 (a gain), 150
    ctx = trl.Context(dims=("t",))
    with ctx:
        meas = _Scripted(dict(zip(keys, [102.0, 150.0, 140.0, 160.0, 150.0], strict=True)))
        env = trl.env.make("looptune.mm", problems=[p], measurer=meas, reward="log")
    st = env._state
    st.bind({})
    st.reset({"i": 0})
    rews = np.array([float(st.step(np.array([a]))[1]) for a in seq])
    np.testing.assert_allclose(rews, [0, np.log(1.5), 0, 0, 0, 0, np.log(160 / 150), 0], rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(rews.sum(), np.log(160 / 100), rtol=1e-6)


def test_log_reward_noise_is_checked() -> None:
    import pytest

    import timerl as trl
    from timerl.errors import TimeRLError

    with pytest.raises(TimeRLError, match="noise"), trl.Context(dims=("t",)):
        trl.env.make(
            "looptune.mm", problems=[Problem(64, 64, 64)], measurer="analytic", reward="log", noise=1.5
        )
