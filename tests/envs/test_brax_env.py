"""brax environments (``trl.env.make("brax.<name>")``) in RT programs, on both backends.

brax compiles its jitted ``reset``/``step`` once per process (about 10-30 s on a CPU dev
box); ``timerl.envs.brax_env`` caches them at module level, so every test here reuses the
first compilation. Episodes are kept short with ``max_steps``.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import numpy as np
import pytest
import torch

import timerl as trl
from timerl.backends.torch_backend import TorchBackend
from timerl.envs import brax_env

ENV = "brax.inverted_pendulum"
NB, NI, MAX_STEPS = 4, 2, 20


def _program(backend: str, seed: int, rec: dict[str, list[Any]]) -> Any:
    """REINFORCE with a Gaussian policy in brax; the sinks fill ``rec`` (keyed by (i, b))."""

    def keep(key: str) -> Any:
        return lambda v, pt: rec.setdefault(key, []).append(((pt["i"], pt["b"]), np.array(v)))

    ctx = trl.Context(dims=("b", "i", "t"))
    with ctx as ((b, B), (i, I), (t, T)):
        env = trl.env.make(ENV, num_envs=B, seed=seed, max_steps=MAX_STEPS)
        dnn = trl.DNNBuilder(domain=(i,)).from_env(env, hidden=[16]).build()
        assert dnn.head == "gaussian"
        o = trl.like(env.obs_space, domain=(b, i, t))
        o[b, i, 0] = env.reset(domain=(b, i))
        a = dnn(o)
        o[b, i, t + 1], r, d = env.step(a)
        g = r[b, i, t:T].discounted_sum(0.99)
        loss = (-dnn.log_prob(a) * g).mean()
        loss.backward()
        trl.optim.Adam(dnn.params, lr=1e-3).step()
        r[b, i, 0:T].sink(keep("r"))
        d[b, i, 0:T].sink(keep("d"))
        o[b, i, 0].sink(keep("obs0"))
        a[b, i, 0].sink(keep("a0"))
    return ctx.compile({B: NB, I: NI, T: d}, backend=backend)


def _by_point(rec: dict[str, list[Any]], key: str) -> dict[tuple[int, int], np.ndarray]:
    out = dict(rec[key])
    assert len(out) == len(rec[key]) == NB * NI  # every (i, b) exactly once
    return out


def _check_episodes(rec: dict[str, list[Any]]) -> dict[tuple[int, int], float]:
    rews, dones = _by_point(rec, "r"), _by_point(rec, "d")
    obs0, a0 = _by_point(rec, "obs0"), _by_point(rec, "a0")
    n_obs = brax_env.compiled("inverted_pendulum").obs_size
    lengths = {}
    for p in rews:
        r, d = rews[p], dones[p]
        assert obs0[p].shape == (n_obs,) and obs0[p].dtype == np.float32 and np.isfinite(obs0[p]).all()
        assert a0[p].shape == (1,) and np.isfinite(a0[p]).all()
        assert r.dtype == np.float32 and np.isfinite(r).all()
        assert d.dtype == np.bool_ and r.shape == d.shape
        assert d[-1], "the episode ends with every env done"
        first = int(np.argmax(d))
        assert d[first:].all(), "once done, an env stays done"
        assert (r[first + 1 :] == 0).all(), "no reward after done"
        assert (r[: first + 1] == 1).all()  # inverted_pendulum: reward 1 per live step
        lengths[p] = first + 1
        assert 1 <= lengths[p] <= MAX_STEPS
    for i in range(NI):  # T (per iteration) is the longest episode of the batch
        assert max(lengths[(i, b)] for b in range(NB)) == len(rews[(i, 0)])
    return {p: float(r.sum()) for p, r in rews.items()}


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_gaussian_policy_in_brax(backend: str) -> None:
    rec: dict[str, list[Any]] = {}
    ex = _program(backend, seed=0, rec=rec)
    ex.execute()
    first = _check_episodes(rec)
    assert all(math.isfinite(v) for v in first.values())
    rec.clear()
    ex.execute()  # the same executor again: the same seeds, the same returns
    assert _check_episodes(rec) == first


def test_same_seed_same_run_other_seed_other_starts() -> None:
    runs = []
    for seed in (5, 5, 6):
        rec: dict[str, list[Any]] = {}
        _program("torch", seed, rec).execute()
        runs.append((_check_episodes(rec), _by_point(rec, "obs0")))
    (ret_a, obs_a), (ret_b, obs_b), (_, obs_c) = runs
    assert ret_a == ret_b
    assert all(np.array_equal(obs_a[p], obs_b[p]) for p in obs_a)
    assert not all(np.array_equal(obs_a[p], obs_c[p]) for p in obs_a)
    # within one run, the reset of iteration 1 draws other initial states than iteration 0
    assert not np.array_equal(obs_a[(0, 0)], obs_a[(1, 0)])


def test_torch_crossing_shares_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the Torch backend, brax outputs cross through DLPack without copies; actions go to
    the jitted step as NumPy views of the torch buffer (the step copies them in itself)."""
    outs: list[tuple[Any, torch.Tensor]] = []
    ins: list[tuple[Any, np.ndarray]] = []
    to_torch = TorchBackend.from_dlpack
    to_numpy = np.from_dlpack

    def spy_out(self: TorchBackend, obj: Any) -> torch.Tensor:
        x = to_torch(self, obj)
        outs.append((obj, x))
        return x

    def spy_in(obj: Any, *args: Any, **kwargs: Any) -> np.ndarray:
        x = to_numpy(obj, *args, **kwargs)
        ins.append((obj, x))
        return x

    monkeypatch.setattr(TorchBackend, "from_dlpack", spy_out)
    monkeypatch.setattr(np, "from_dlpack", spy_in)
    rec: dict[str, list[Any]] = {}
    _program("torch", 0, rec).execute()
    _check_episodes(rec)
    brax_outs = [(o, x) for o, x in outs if isinstance(o, jax.Array)]
    # per iteration: one reset (obs) and one step per timestep (obs, reward, done)
    assert len(brax_outs) >= NI * 4
    for o, x in brax_outs:
        assert x.data_ptr() == o.unsafe_buffer_pointer(), "jax -> torch copied"
    actions = [(o, x) for o, x in ins if isinstance(o, torch.Tensor)]
    assert len(actions) >= NI
    for o, x in actions:
        assert x.__array_interface__["data"][0] == o.data_ptr(), "torch -> NumPy copied"


def test_unknown_brax_env_lists_valid_names() -> None:
    with trl.Context(dims=("b", "t")) as ((b, B), (t, T)):
        with pytest.raises(trl.TimeRLError, match="unknown brax environment 'no_such_env'") as info:
            trl.env.make("brax.no_such_env", num_envs=B)
    assert "inverted_pendulum" in str(info.value) and "ant" in str(info.value)
    with pytest.raises(trl.TimeRLError, match="brax"):
        trl.env.make("nosuchfamily.x")
