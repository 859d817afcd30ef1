"""An exception raised by user code (a sink, a UDF, an environment) surfaces as a
``RuntimeExecutionError`` that names the node and the point, chained (``raise ... from``)
to the user's exception, so the printed traceback shows the user's own frame first."""

from __future__ import annotations

import traceback

import gymnasium as gym
import numpy as np
import pytest

import timerl as trl


def exploding_sink(v: np.ndarray, pt: dict[str, int]) -> None:
    if pt["t"] == 2:
        raise ValueError("bad reward in my logger")


def exploding_udf(inputs: list[np.ndarray], pt: dict[str, int]) -> list[np.ndarray]:
    if pt["t"] == 1:
        raise ZeroDivisionError("my model divided by zero")
    return [inputs[0] + 1.0]


class _ExplodingEnv(gym.Env):
    """Steps fine twice, then its simulator raises."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        self.k = 0
        return np.zeros(2, np.float32), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.k += 1
        if self.k == 3:
            raise KeyError("simulator lost its state")
        return np.zeros(2, np.float32), 1.0, False, False, {}


if "ExplodingEnv-v0" not in gym.registry:
    gym.register("ExplodingEnv-v0", entry_point=_ExplodingEnv, max_episode_steps=10)


def _raised(ex) -> tuple[trl.RuntimeExecutionError, str]:
    with pytest.raises(trl.RuntimeExecutionError) as info:
        ex.execute()
    return info.value, "".join(traceback.format_exception(info.value))


def _user_frame_shown(printed: str, fn: str) -> None:
    """The user's function, its file and the raising line are in the printed traceback,
    before timerl's error (Python prints the cause first)."""
    assert 'test_user_code_errors.py", line' in printed and f"in {fn}\n" in printed, printed
    assert printed.index(f"in {fn}\n") < printed.index("The above exception was the direct cause")
    assert printed.rstrip().splitlines()[-1].startswith("timerl.errors.RuntimeExecutionError: ")


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_sink_exception_keeps_the_user_traceback(backend: str) -> None:
    ctx = trl.Context(dims=("i", "t"))
    with ctx as ((i, I), (t, T)):
        (trl.as_tensor(t) * 2.0 + trl.as_tensor(i)).sink(exploding_sink, name="logger")
    err, printed = _raised(ctx.compile({I: 2, T: 4}, backend=backend))
    assert isinstance(err.__cause__, ValueError) and str(err.__cause__) == "bad reward in my logger"
    msg = str(err)
    assert "sink 'logger'" in msg and "ValueError: bad reward in my logger" in msg, msg
    assert "{'i': 0, 't': 2}" in msg and "raised in exploding_sink (test_user_code_errors.py:" in msg, msg
    assert 'raise ValueError("bad reward in my logger")' in printed
    _user_frame_shown(printed, "exploding_sink")


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_udf_exception_keeps_the_user_traceback(backend: str) -> None:
    ctx = trl.Context(dims=("t",))
    with ctx as ((t, T),):
        (y,) = trl.udf(exploding_udf, [((), trl.float32)], domain=(t,), inputs=[trl.as_tensor(t)])
        y.sink(lambda v, pt: None)
    err, printed = _raised(ctx.compile({T: 3}, backend=backend))
    assert isinstance(err.__cause__, ZeroDivisionError)
    msg = str(err)
    assert "udf defined at test_user_code_errors.py:" in msg and "{'t': 1}" in msg, msg
    assert "raised in exploding_udf" in msg, msg
    _user_frame_shown(printed, "exploding_udf")


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_env_exception_keeps_the_user_traceback(backend: str) -> None:
    ctx = trl.Context(dims=("b", "t"))
    with ctx as ((b, B), (t, T)):
        env = trl.env.make("gym.ExplodingEnv-v0", num_envs=B)
        o = trl.like(env.obs_space, domain=(b, t))
        o[b, 0] = env.reset(domain=(b,))
        o[b, t + 1], r, d = env.step(trl.zeros((), dtype=trl.int64, domain=(b, t)))
        r.sink(lambda v, pt: None)
    err, printed = _raised(ctx.compile({B: 2, T: d}, backend=backend))
    assert isinstance(err.__cause__, KeyError)
    msg = str(err)
    assert "'ExplodingEnv-v0.step'" in msg and "env.step(" in msg and "{'t': 2}, all of b at once" in msg, msg
    assert "raised in step (test_user_code_errors.py:" in msg, msg
    _user_frame_shown(printed, "step")
