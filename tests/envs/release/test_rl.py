"""RELEASE's PPO search: the knob env, the multi-categorical policy head against NumPy, and
one round of the RT program of timerl.envs.release.study."""

from __future__ import annotations

import os
from dataclasses import replace
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest

import timerl as trl
from timerl.envs.release.cost_model import CostModel
from timerl.envs.release.env import KnobEnv
from timerl.envs.release.space import Layer, template_space

SPACE = template_space(Layer.matmul("mm", 16, 16, 16), max_tile_elems=64)


class LinearModel:
    """A cost model whose prediction is the sum of the knob indices (known rewards)."""

    def predict(self, cfgs) -> np.ndarray:
        return np.asarray(cfgs, float).sum(-1) if len(cfgs) else np.zeros(0)


def test_knob_env_moves_and_rewards() -> None:
    """Directions 0/1/2 move each knob down/stay/up; reward = the model's prediction of the
    configuration reached; done after episode_len steps; the trajectory records every step."""
    out: list[tuple[int, int, float]] = []
    ctx = trl.Context(dims=("b", "t"))
    with ctx as ((b, B), (t, T)):
        env = KnobEnv(SPACE, LinearModel(), B, starts=[(1, 1, 1, 1, 0, 0, 0)], episode_len=2, explore=0.0)
        o = trl.like(env.obs_space, domain=(b, t), name="obs")
        o[b, 0] = env.reset(domain=(b,))
        a = trl.const(np.array([2, 0, 1, 2, 2, 2, 2]), domain=(b, t))
        o[b, t + 1], r, d = env.step(a)
        r.sink(lambda v, p: out.append((p["t"], p["b"], float(v))))
    ctx.compile({B: 2, T: d}, backend="torch").execute()
    # (1,1,1,1,0,0,0) -> (2,0,1,2,1,1,1) (sum 8) -> (3,0,1,3,1,1,1) (clipped at the last values; sum 10)
    assert sorted(out) == [(0, 0, 8.0), (0, 1, 8.0), (1, 0, 10.0), (1, 1, 10.0)]
    assert [c for c, _ in env.trajectory] == [(2, 0, 1, 2, 1, 1, 1)] * 2 + [(3, 0, 1, 3, 1, 1, 1)] * 2


def test_multi_categorical_head_against_numpy() -> None:
    """log_prob and entropy of the MultiDiscrete head, and one SGD step on -sum(log_prob),
    equal their NumPy values (per knob: log_softmax over 3 directions; sums over knobs)."""
    rng = np.random.default_rng(0)
    k, h = 3, 5
    fake = SimpleNamespace(
        obs_space=gym.spaces.Box(0, 1, (4,), np.float32), action_space=gym.spaces.MultiDiscrete([3] * k)
    )
    w = {
        "dnn.w0": rng.standard_normal((4, h)).astype(np.float32),
        "dnn.b0": rng.standard_normal(h).astype(np.float32),
        "dnn.w1": rng.standard_normal((h, 3 * k)).astype(np.float32),
        "dnn.b1": rng.standard_normal(3 * k).astype(np.float32),
    }
    obs = rng.random(4).astype(np.float32)
    act = np.array([0, 2, 1])
    got: dict[str, list] = {"lp": [], "ent": [], "b1": []}
    ctx = trl.Context(dims=("i",))
    with ctx as ((i, I),):
        dnn = trl.DNNBuilder(domain=(i,), seed=0).from_env(fake, hidden=[h]).build(w)
        lp, ent, _ = dnn.evaluate(trl.const(obs, domain=(i,)), trl.const(act, domain=(i,)))
        lp.sink(lambda v, p: got["lp"].append(float(v)))
        ent.sink(lambda v, p: got["ent"].append(float(v)))
        dnn.params[3].sink(lambda v, p: got["b1"].append(np.asarray(v)))
        (-lp).backward()
        trl.optim.SGD(dnn.params, lr=0.5).step()
    ctx.compile({I: 2}, backend="torch").execute()
    hid = np.tanh(obs.astype(np.float64) @ w["dnn.w0"] + w["dnn.b0"])
    logits = (hid @ w["dnn.w1"] + w["dnn.b1"]).reshape(k, 3)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    assert got["lp"][0] == pytest.approx(logp[np.arange(k), act].sum(), rel=1e-5)
    assert got["ent"][0] == pytest.approx(-(np.exp(logp) * logp).sum(), rel=1e-5)
    grad_b1 = (np.exp(logp) - np.eye(3)[act]).reshape(-1)  # d(-sum log p)/d logits
    np.testing.assert_allclose(got["b1"][1], w["dnn.b1"] - 0.5 * grad_b1, rtol=1e-5, atol=1e-6)


def _rl_rounds(mode: str, rounds: int = 3) -> tuple[list, int]:
    """``rounds`` rounds of the RELEASE study's PPO search in ``mode`` on SPACE, with the
    cost model refit between rounds on two of the round's candidates: (candidates, compiles)."""
    from timerl.envs.release import study as release

    rng = np.random.default_rng(0)
    cfgs = [SPACE.random(rng) for _ in range(24)]
    model = CostModel(SPACE)
    model.fit(cfgs, [float(SPACE.tile_elems(c)) for c in cfgs])
    args = replace(
        release.Args(), num_envs=4, iterations=2, episode_len=3, plan_size=8, rl_program=mode, budget=12
    )
    search = release.RLSearch(args)
    out = []
    try:
        for r in range(rounds):
            cands = search.propose(SPACE, model, set(cfgs), cfgs[:4], rng)
            assert 0 < len(cands.configs) <= 8
            assert all(SPACE.is_valid(c) and c not in cfgs for c in cands.configs)
            assert list(cands.scores) == sorted(cands.scores, reverse=True)
            assert search.round == r + 1
            out.append((cands.configs, [float(x) for x in cands.scores]))
            cfgs += list(cands.configs[:2])
            model.fit(cfgs, [float(SPACE.tile_elems(c)) for c in cfgs])
        if mode == "per-round":
            assert any(f.startswith("ckpt_") for f in os.listdir(search.dir))
    finally:
        search.close()
    return out, search.compiles


def test_rl_search_compiled_once_equals_per_round() -> None:
    """The PPO search compiled once and paused between rounds returns exactly the candidates
    of the per-round path (recompiled every round, resumed from a checkpoint) for the same
    seed, over rounds that refit the cost model: the agent's parameters, Adam moments and
    random streams carry over, and the env reads the refitted model. One compile vs one per
    round."""
    once, n_once = _rl_rounds("once")
    per_round, n_per_round = _rl_rounds("per-round")
    assert n_once == 1 and n_per_round == 3
    assert once == per_round
    assert once[0] != once[1]  # the rounds differ (the model and the agent changed)


def test_rl_search_once_runs_out_of_rounds() -> None:
    """A once-compiled program that has run all its rounds says so (no hang, no silent reuse)."""
    from timerl.envs.release import study as release

    rng = np.random.default_rng(0)
    cfgs = [SPACE.random(rng) for _ in range(8)]
    model = CostModel(SPACE)
    model.fit(cfgs, [float(SPACE.tile_elems(c)) for c in cfgs])
    args = replace(release.Args(), num_envs=2, iterations=1, episode_len=2, plan_size=4, budget=8, n_init=8)
    search = release.RLSearch(args)
    try:
        for _ in range(search.max_rounds()):
            search.propose(SPACE, model, set(cfgs), cfgs[:2], rng)
        with pytest.raises(trl.TimeRLError, match="ran all its iterations"):
            search.propose(SPACE, model, set(cfgs), cfgs[:2], rng)
    finally:
        search.close()
    assert search.compiles == 1
