"""``examples/ppo_tiramisu.py``'s GATv2 actor-critic (an RT program) against a NumPy
implementation of Table 3.2's network on a real env observation."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))

import ppo_tiramisu  # noqa: E402

import timerl as trl  # noqa: E402
from timerl.envs.tiramisu import benchmarks as bm  # noqa: E402
from timerl.envs.tiramisu.features import MAX_NODES, flatten, graph, unflatten  # noqa: E402
from timerl.envs.tiramisu.schedule import initial_schedule, tile  # noqa: E402


def _selu(x):
    return 1.0507009873554805 * np.where(x > 0, x, 1.6732632423543772 * (np.exp(np.minimum(x, 0)) - 1))


def _reference(w: dict, obs: np.ndarray, heads: int, hidden: int) -> tuple[np.ndarray, np.ndarray]:
    x, adj, m = unflatten(obs)
    m = m[:, None]
    pooled = []
    if "dnn.inp.w" in w:  # arch v2: the pooled raw features
        real = x[m[:, 0] > 0]
        pooled.append(np.concatenate([real.mean(0), real.max(0)]) @ w["dnn.inp.w"] + w["dnn.inp.b"])
    h = x
    for k in (1, 2):
        xl = (h @ w[f"dnn.gat{k}.wl"]).reshape(MAX_NODES, heads, hidden)
        xr = (h @ w[f"dnn.gat{k}.wr"]).reshape(MAX_NODES, heads, hidden)
        s = xr[:, None] + xl[None, :]
        s = np.where(s > 0, s, 0.2 * s)
        e = (s * w[f"dnn.gat{k}.att"]).sum(-1)
        e = np.where(adj[:, :, None] > 0, e, -np.inf)
        with np.errstate(invalid="ignore"):  # padding rows: no neighbours, uniform like the RT's
            e = e - e.max(1, keepdims=True)
            alpha = np.exp(e) / np.exp(e).sum(1, keepdims=True)
        alpha = np.nan_to_num(alpha, nan=1.0 / MAX_NODES)
        out = np.einsum("ijh,jhc->ihc", alpha, xl).reshape(MAX_NODES, -1) + w[f"dnn.gat{k}.bias"]
        h = _selu(out @ w[f"dnn.lin{k}.w"] + w[f"dnn.lin{k}.b"])
        real = h[m[:, 0] > 0]
        pooled.append(np.concatenate([real.mean(0), real.max(0)]))
    z = _selu(np.concatenate(pooled) @ w["dnn.summ.w"] + w["dnn.summ.b"])
    z = _selu(z @ w["dnn.shared.w"] + w["dnn.shared.b"])
    outs = []
    for head in ("pi", "v"):
        y = z
        for j in range(3):
            y = y @ w[f"dnn.{head}{j}.w"] + w[f"dnn.{head}{j}.b"]
            if j < 2:
                y = _selu(y)
        outs.append(y)
    return outs[0], outs[1][0]


@pytest.mark.parametrize("arch", ["v1", "v2"])
def test_gat_policy_matches_numpy(arch: str) -> None:
    heads, hidden = 2, 8
    p = bm.heat2d(2, 16)
    s = tile(initial_schedule(p), 0, 1, 32, 32)
    obs = np.stack([flatten(*graph(initial_schedule(p), 0)), flatten(*graph(s, 1))])
    got: dict[str, list] = {"pi": [], "v": []}
    ctx = trl.Context(dims=("b",))
    with ctx as ((b, B),):
        pol = ppo_tiramisu.GATPolicy((), 0, heads, hidden, arch=arch)
        weights = {}
        rng = np.random.default_rng(1)
        for name, w in pol.p.items():
            weights[name] = (rng.standard_normal(w.shape) * 0.3).astype(np.float32)
        pol = ppo_tiramisu.GATPolicy((), 0, heads, hidden, weights, arch)
        o = trl.const(obs)[b]
        logits = pol.forward(o)
        v = pol.value(o)
        logits.sink(lambda x, pt: got["pi"].append((pt["b"], np.asarray(x))))
        v.sink(lambda x, pt: got["v"].append((pt["b"], float(np.asarray(x)))))
    ctx.compile({B: 2}, backend="torch").execute()
    assert len(got["pi"]) == 2
    for (k, pi), (_, val) in zip(sorted(got["pi"], key=lambda e: e[0]), sorted(got["v"]), strict=True):
        ref_pi, ref_v = _reference(weights, obs[k], heads, hidden)
        np.testing.assert_allclose(pi, ref_pi, rtol=2e-3, atol=2e-3)
        np.testing.assert_allclose(val, ref_v, rtol=2e-3, atol=2e-3)
