"""gymnax environments (``trl.env.make("gymnax.<id>")``) in RT programs, on both backends.

Each program records what the env returned and the actions the policy took; the test then
replays those actions through gymnax itself, with the keys ``timerl.envs.gymnax_env``
documents, and checks that observations, rewards and done flags are the same. Episodes are
kept short with ``max_steps_in_episode`` so that both truncation and termination happen.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("gymnax")

import jax  # noqa: E402

import timerl as trl  # noqa: E402
from timerl.envs import gymnax_env  # noqa: E402
from timerl.errors import TimeRLError  # noqa: E402

ENV = "CartPole-v1"
NB, NI, MAX_STEPS, SEED = 4, 2, 12, 7
ROOT = Path(__file__).resolve().parents[2]


def _keep(rec: dict[str, list[Any]], key: str) -> Any:
    return lambda v, pt: rec.setdefault(key, []).append(((pt["i"], pt["b"]), np.array(v)))


def _by_point(rec: dict[str, list[Any]], key: str) -> dict[tuple[int, int], np.ndarray]:
    out = dict(rec[key])
    assert len(out) == len(rec[key]) == NB * NI  # every (i, b) exactly once
    return out


def _acting_program(backend: str, autoreset: bool, num_steps: int, rec: dict[str, list[Any]]) -> Any:
    """Acting only (the parameters stay put): per (b, i) the observations the policy saw,
    its actions, the rewards and the done flags of the rollout."""
    ctx = trl.Context(dims=("b", "i", "t"))
    with ctx as ((b, B), (i, I), (t, T)):
        env = trl.env.make(
            f"gymnax.{ENV}", num_envs=B, seed=SEED, autoreset=autoreset, max_steps_in_episode=MAX_STEPS
        )
        dnn = trl.DNNBuilder(domain=(i,), seed=1).from_env(env, hidden=[8]).build()
        o = trl.like(env.obs_space, domain=(b, i, t))
        if autoreset:  # fixed-length rollouts: iteration i continues where i - 1 stopped
            o0 = env.reset(domain=(b,))
            a = dnn(o)
            o_next, r, d = env.step(a)
            o[b, 0, 0] = o0
            o[b, i, 0] = o_next[b, i - 1, T - 1]
            o[b, i, t + 1] = o_next
        else:  # one episode per (b, i)
            o[b, i, 0] = env.reset(domain=(b, i))
            a = dnn(o)
            o[b, i, t + 1], r, d = env.step(a)
        for p in dnn.params:  # no learning: keep the parameters
            p[i + 1] = p
        o[b, i, 0:T].sink(_keep(rec, "obs"))
        a[b, i, 0:T].sink(_keep(rec, "act"))
        r[b, i, 0:T].sink(_keep(rec, "rew"))
        d[b, i, 0:T].sink(_keep(rec, "done"))
    return ctx.compile({B: NB, I: NI, T: num_steps if autoreset else d}, backend=backend)


def _gymnax_reset(seed: int) -> tuple[Any, Any, Any, Any, Any]:
    """gymnax itself, with the keys timerl documents: ``(env, params, obs, state, k_run)``."""
    import gymnax

    env, params = gymnax.make(ENV)
    params = params.replace(max_steps_in_episode=MAX_STEPS)
    k_reset, k_run = jax.random.split(jax.random.PRNGKey(seed))
    obs, st = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(k_reset, NB), params)
    return env, params, obs, st, k_run


def _gymnax_step(env: Any, params: Any, st: Any, k_run: Any, action: np.ndarray) -> tuple[Any, ...]:
    k_run, k_step = jax.random.split(k_run)
    keys = jax.random.split(k_step, NB)
    a = jax.numpy.asarray(action, dtype=jax.numpy.int32)
    obs, st, rew, term, trunc, info = jax.vmap(env.step, in_axes=(0, 0, 0, None))(keys, st, a, params)
    return st, k_run, obs, rew, np.asarray(term | trunc), info["final_observation"]


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_autoreset_rollouts_match_gymnax(backend: str) -> None:
    """Fixed-length rollouts: gymnax's own auto-reset inside ``step`` (reset observation,
    the finished episode's reward, done = terminated | truncated), continued across i."""
    T = 2 * MAX_STEPS  # every env ends at least one episode per iteration
    rec: dict[str, list[Any]] = {}
    _acting_program(backend, True, T, rec).execute()
    obs, act, rew, done = (_by_point(rec, k) for k in ("obs", "act", "rew", "done"))
    for (it, e), v in obs.items():
        assert v.shape == (T, 4) and v.dtype == np.float32
        assert act[(it, e)].shape == (T,) and set(np.unique(act[(it, e)])) <= {0, 1}
        assert rew[(it, e)].shape == (T,) and rew[(it, e)].dtype == np.float32
        assert done[(it, e)].shape == (T,) and done[(it, e)].dtype == np.bool_
    with jax.enable_x64(False):
        env, params, o, st, k_run = _gymnax_reset(SEED)  # reset at point () of domain (b,)
        for it in range(NI):
            for t in range(T):
                np.testing.assert_allclose(
                    np.stack([obs[(it, e)][t] for e in range(NB)]), np.asarray(o), rtol=1e-5, atol=1e-6
                )
                a = np.stack([act[(it, e)][t] for e in range(NB)])
                st, k_run, o, r, d, _ = _gymnax_step(env, params, st, k_run, a)
                assert np.array_equal(np.stack([done[(it, e)][t] for e in range(NB)]), d)
                assert np.array_equal(np.stack([rew[(it, e)][t] for e in range(NB)]), np.asarray(r))
    for e in range(NB):
        assert done[(0, e)].any() and done[(1, e)].any()


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_episodic_mode_matches_gymnax_and_stays_done(backend: str) -> None:
    """One episode per (b, i): the step that ends an episode returns its final observation
    (not gymnax's reset one); afterwards the env stays done with reward 0 and its last
    observation repeated, and T is the longest episode of the batch."""
    rec: dict[str, list[Any]] = {}
    _acting_program(backend, False, 0, rec).execute()
    obs, act, rew, done = (_by_point(rec, k) for k in ("obs", "act", "rew", "done"))
    with jax.enable_x64(False):
        for it in range(NI):
            T = len(rew[(it, 0)])
            env, params, o, st, k_run = _gymnax_reset(SEED + 7919 * it)
            want_obs = np.asarray(o)
            was_done = np.zeros(NB, dtype=bool)
            for t in range(T):
                got_obs = np.stack([obs[(it, e)][t] for e in range(NB)])
                np.testing.assert_allclose(got_obs, want_obs, rtol=1e-5, atol=1e-6)
                a = np.stack([act[(it, e)][t] for e in range(NB)])
                st, k_run, _, r, d, final = _gymnax_step(env, params, st, k_run, a)
                prev = was_done
                want_rew = np.where(prev, 0.0, np.asarray(r))
                was_done = prev | d
                want_obs = np.where(prev[:, None], want_obs, np.asarray(final))  # done envs stay put
                assert np.array_equal(np.stack([done[(it, e)][t] for e in range(NB)]), was_done)
                assert np.array_equal(np.stack([rew[(it, e)][t] for e in range(NB)]), want_rew)
            assert was_done.all()  # T ends when every env is done ...
            lengths = [int(np.argmax(done[(it, e)])) + 1 for e in range(NB)]
            assert max(lengths) == T  # ... and not later
            for e in range(NB):
                first = lengths[e] - 1
                assert done[(it, e)][first:].all() and (rew[(it, e)][first + 1 :] == 0).all()
                assert (rew[(it, e)][: first + 1] == 1).all()  # CartPole: 1 per live step
                assert 1 <= lengths[e] <= MAX_STEPS


def test_spaces_parameters_and_bad_ids() -> None:
    ctx = trl.Context(dims=("b", "t"))
    with ctx as ((b, B), (t, T)):
        env = trl.env.make(f"gymnax.{ENV}", num_envs=B, max_steps_in_episode=33)
    assert env.env_id == f"gymnax.{ENV}"
    assert env.action_space.n == 2 and env.obs_space.shape == (4,)
    assert env.compiled.params.max_steps_in_episode == 33
    assert "CartPole-v1" in gymnax_env.gymnax_env_names()
    with ctx, pytest.raises(TimeRLError, match="unknown gymnax environment 'NoSuchEnv-v0'.*CartPole-v1"):
        trl.env.make("gymnax.NoSuchEnv-v0", num_envs=B)
    with ctx, pytest.raises(TimeRLError, match="cannot be created"):
        trl.env.make(f"gymnax.{ENV}", num_envs=B, no_such_argument=1)


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_ppo_example_fixed_length_rollouts(backend: str) -> None:
    """``examples/ppo.py --env-id gymnax.CartPole-v1 --num-steps 16`` trains a few iterations."""
    cmd = [
        sys.executable,
        str(ROOT / "examples" / "ppo.py"),
        "--env-id",
        f"gymnax.{ENV}",
        "--num-steps",
        "16",
        "--num-envs",
        "4",
        "--iterations",
        "3",
        "--backend",
        backend,
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [x for x in out.stdout.splitlines() if x.startswith("iter")]
    assert len(lines) == 3 and "env steps      192" in lines[-1]
