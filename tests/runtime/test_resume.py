"""Checkpoint / resume: 2N iterations equal N + resume + N bit-for-bit (fixed seed, CPU)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import timerl as trl
from timerl.errors import TimeRLError


def _reinforce(out: list, hidden: int = 8, ckpt: str | None = None, every: int = 2):
    """REINFORCE on CartPole (examples/reinforce.py), small; sinks record returns and params."""
    ctx = trl.Context(dims=("b", "i", "t"))
    with ctx as ((b, B), (i, I), (t, T)):
        env = trl.env.make("gym.CartPole-v1", num_envs=B, seed=3)
        dnn = trl.DNNBuilder(domain=(i,), seed=3).from_env(env, hidden=[hidden] * 2).build()
        o = trl.like(env.obs_space, domain=(b, i, t), name="obs")
        o[b, i, 0] = env.reset(domain=(b, i))
        a = dnn(o)
        o[b, i, t + 1], r, d = env.step(a)
        g = r[b, i, t:T].discounted_sum(0.99)
        loss = -dnn.log_prob(a) * g
        loss.backward()
        trl.optim.Adam(dnn.params, lr=1e-2).step()
        r[b, i, 0:T].sum(0).sink(lambda v, p: out.append(("ret", p["i"], p["b"], np.array(v))))
        dnn.params[0].sink(lambda v, p: out.append(("w0", p["i"], 0, np.array(v))))
        if ckpt is not None:
            dnn[(i + 1) % every == 0].checkpoint(ckpt, config={"hidden": hidden})
    return ctx, (B, I, T, d)


def _run(backend: str, iters: int, hidden: int = 8, ckpt: str | None = None, resume: str = "") -> list:
    out: list = []
    ctx, (B, I, T, d) = _reinforce(out, hidden, ckpt)
    extra = {"resume": resume} if resume else {}
    ctx.compile({B: 2, I: iters, T: d}, backend=backend, seed=5, **extra).execute()
    return sorted(out, key=lambda x: x[:3])


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_resume_is_bit_exact(backend: str, tmp_path) -> None:
    n = 2
    full = _run(backend, 2 * n)
    ck = str(tmp_path / "ckpt")
    first = _run(backend, n, ckpt=ck)
    assert sorted(os.listdir(ck)) == [f"ckpt_{n - 1}.envs.pkl", f"ckpt_{n - 1}.json", f"ckpt_{n - 1}.npz"]
    meta = json.load(open(os.path.join(ck, f"ckpt_{n - 1}.json")))
    assert meta["iteration"] == n - 1 and meta["config"]["hidden"] == 8
    carried = meta["fingerprint"]["carried"]
    assert "dnn.w0" in carried and "dnn.w0.adam_m" in carried and "dnn.w0.adam_v" in carried
    second = _run(backend, 2 * n, resume=ck)
    assert {x[1] for x in second} == set(range(n, 2 * n))  # iterations <= n-1 never ran
    assert [x[:3] for x in first] == [x[:3] for x in full if x[1] < n]
    for a, b in zip(sorted(first + second, key=lambda x: x[:3]), full, strict=True):
        assert a[:3] == b[:3]
        assert np.array_equal(a[3], b[3]), (backend, a[:3])
    # a checkpoint in the middle of a run (plain loop over i), resumed from the file
    ck2 = str(tmp_path / "ckpt2")
    again = _run(backend, 2 * n, ckpt=ck2)
    assert sorted(os.listdir(ck2)) == [f"ckpt_{k}.{x}" for k in (1, 3) for x in ("envs.pkl", "json", "npz")]
    tail = _run(backend, 2 * n, resume=os.path.join(ck2, "ckpt_1.npz"))
    for a, b in zip(again, full, strict=True):
        assert a[:3] == b[:3] and np.array_equal(a[3], b[3])
    for a, b in zip(tail, [x for x in full if x[1] >= 2], strict=True):
        assert a[:3] == b[:3] and np.array_equal(a[3], b[3]), (backend, a[:3])


def test_bad_resume_path(tmp_path) -> None:
    for bad in (str(tmp_path / "nope"), str(tmp_path / "nope" / "ckpt_3.npz"), str(tmp_path)):
        with pytest.raises(TimeRLError, match="does not exist|no checkpoint"):
            _run("jax", 2, resume=bad)
    assert list(tmp_path.iterdir()) == []


def test_resume_other_program(tmp_path) -> None:
    ck = str(tmp_path / "ckpt")
    _run("jax", 2, ckpt=ck)
    before = {f: os.path.getmtime(os.path.join(ck, f)) for f in os.listdir(ck)}
    with pytest.raises(
        TimeRLError, match=r"(?s)does not match.*'dnn.w0': shape \(4, 8\) in the checkpoint, \(4, 16\)"
    ):
        _run("jax", 4, hidden=16, resume=ck)
    after = {f: os.path.getmtime(os.path.join(ck, f)) for f in os.listdir(ck)}
    assert before == after


def _two_dim_params(out: list, ckpt: str | None):
    ctx = trl.Context(dims=("i", "k"))
    with ctx as ((i, I), (k, K)):
        w = trl.param(np.ones(3, np.float32), domain=(i, k), name="dnn.w0")
        x = trl.const(np.arange(3, dtype=np.float32))
        target = w[i - i % 2, 0]  # a target network: w of an earlier iteration
        loss = ((w * x).sum() - (target * x).sum().detach() * 0.5) ** 2
        loss.backward()
        trl.optim.Adam([w], lr=0.1).step()
        w.sink(lambda v, p: out.append((p["i"], p["k"], np.array(v))))
        if ckpt is not None:
            w[(i + 1) % 2 == 0].checkpoint(ckpt)
    return ctx, {I: 4, K: 2}


def test_params_over_two_dims_keep_their_names(tmp_path) -> None:
    """Params over ``(i, k)`` (Adam along ``k``, carried into ``i + 1``) read at an earlier
    ``i`` too: ``w`` itself and its update ``w.next`` cross the ``i`` boundary. Both used to
    fall back to ``%<id>.<out>`` (two values named ``dnn.w0``). Resuming stays bit-exact."""
    from timerl.compile import CompileOptions, build_pdg
    from timerl.plan.iterations import carried_values

    ctx, bounds = _two_dim_params([], None)
    pdg = build_pdg(ctx, bounds, CompileOptions())
    names = {c.name for c in carried_values(pdg, next(s for s, _ in pdg.dims if s.name == "i"))}
    assert {"dnn.w0", "dnn.w0.next", "dnn.w0.adam_m", "dnn.w0.adam_v"} <= names
    assert not any(n.startswith("%") for n in names)
    full: list = []
    ctx, bounds = _two_dim_params(full, None)
    ctx.compile(bounds, backend="torch").execute()
    ck = str(tmp_path / "ck")
    ctx, bounds = _two_dim_params([], ck)
    ctx.compile(bounds, backend="torch").execute()
    meta = json.load(open(os.path.join(ck, "ckpt_1.json")))
    assert "dnn.w0.next" in meta["fingerprint"]["carried"]
    tail: list = []
    ctx, bounds = _two_dim_params(tail, None)
    ctx.compile(bounds, backend="torch", resume=os.path.join(ck, "ckpt_1.npz")).execute()
    want = sorted((x for x in full if x[0] >= 2), key=lambda x: x[:2])
    tail = sorted(tail, key=lambda x: x[:2])
    assert [x[:2] for x in tail] == [x[:2] for x in want]
    for a, b in zip(tail, want, strict=True):
        assert np.array_equal(a[2], b[2]), a[:2]
