"""``timerl.looptune``: einsum parsing, the NumPy policy against the RT program's greedy
rollout, ``tune()`` and its CLI on a checkpoint of ``examples/ppo_looptune.py``."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))

import ppo_looptune  # noqa: E402

from timerl.envs.looptune import ppo_run  # noqa: E402
from timerl.envs.looptune.analytic import AnalyticCostModel  # noqa: E402
from timerl.envs.looptune.ir import ACTIONS, MAX_LOOPS, NUM_FEATURES, Problem, initial_state  # noqa: E402
from timerl.envs.looptune.kernels import BMM  # noqa: E402
from timerl.errors import TimeRLError  # noqa: E402
from timerl.looptune import Policy, parse_einsum, tune  # noqa: E402


def test_parse_einsum() -> None:
    assert parse_einsum("mk,kn->mn", (128, 256, 64)) == Problem(m=128, n=64, k=256)
    assert parse_einsum("ik, kj -> ij", {"i": 16, "j": 32, "k": 48}) == Problem(16, 32, 48)
    assert parse_einsum("bmk,bkn->bmn", (2, 3, 4, 5)) == Problem(2, 3, 5, 4, kernel=BMM)
    # not a built-in kernel: a kernel of its own, strides from its index expressions
    t = parse_einsum("km,kn->mn", (3, 4, 5))
    assert t.kernel.text == "A[k, m] * B[k, n] -> C[m, n]" and t.extents == {"m": 4, "n": 5, "k": 3}
    assert parse_einsum("mk,kn->nm", (3, 4, 5)).kernel.out.dims == ("n", "m")


@pytest.mark.parametrize(
    ("spec", "shape", "match"),
    [
        ("mk,kn,nl->ml", (3, 4, 5, 6), "3 operands"),
        ("mk,kn->mm", (3, 4, 5), "distinct plain dims"),
        ("mk,kn->", (3, 4, 5), "scalar"),
        ("mk,kn", (3, 4, 5), "output"),
        ("mk,kn->mn", (3, 4), "3 sizes"),
        ("mk,kn->mn", {"m": 3, "k": 4}, "no size"),
        ("mk,kn->mn", (3, 0, 5), ">= 1"),
        ("mm,mn->mn", (3, 4), "no reduction dim"),
        ("mK,Kn->mn", (3, 4, 5), "unsupported character"),
    ],
)
def test_parse_einsum_rejects_what_the_env_cannot_express(spec: str, shape: object, match: str) -> None:
    with pytest.raises(TimeRLError, match=match):
        parse_einsum(spec, shape)  # type: ignore[arg-type]


def _weights(hidden: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    sizes = [MAX_LOOPS * NUM_FEATURES, hidden, hidden, len(ACTIONS)]
    out = {}
    for k, (fi, fo) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        out[f"dnn.w{k}"] = rng.normal(0, 1.5 / np.sqrt(fi), (fi, fo)).astype(np.float32)
        out[f"dnn.b{k}"] = rng.normal(0, 0.3, fo).astype(np.float32)
    return out


def test_numpy_policy_matches_the_rt_program() -> None:
    """Policy.rollout picks the same actions as the example's greedy RT program."""
    weights = _weights(16, seed=3)
    problems = [Problem(64, 80, 96), Problem(96, 64, 128), Problem(128, 144, 64)]
    args = ppo_looptune.Args(backend="torch", measurer="analytic", num_envs=3, hidden=16)
    rt = ppo_run.tune_with_policy(args, weights, problems)
    pol = Policy.from_weights(weights)
    for p in problems:
        _, actions = pol.rollout(initial_state(p), 10)
        assert actions == rt[p.name]["actions"], p.name
    assert len({tuple(rt[p.name]["actions"]) for p in problems}) >= 1


def test_policy_rejects_wrong_networks() -> None:
    w = _weights(8, seed=0)
    w["dnn.w2"] = w["dnn.w2"][:, :4]
    w["dnn.b2"] = w["dnn.b2"][:4]
    with pytest.raises(TimeRLError, match="actions"):
        Policy.from_weights(w)
    with pytest.raises(TimeRLError, match="no policy parameters"):
        Policy.from_weights({"other": np.zeros(3)})
    with pytest.raises(TimeRLError, match="no LoopTune policy"):
        Policy.load("/nonexistent/run")


def test_tune_keeps_the_best_schedule_of_the_greedy_episode() -> None:
    model = AnalyticCostModel()
    pol = Policy.from_weights(_weights(16, seed=5))
    res = tune("mk,kn->mn", pol, shape=(96, 128, 80), measurer=model)
    assert res.problem == Problem(96, 80, 128)
    states, actions = pol.rollout(initial_state(res.problem), 10)
    assert res.actions == tuple(ACTIONS[a] for a in actions)
    assert res.gflops == max(model.gflops(s) for s in states) == model.gflops(res.state)
    assert res.untuned_gflops == model.gflops(initial_state(res.problem))
    assert res.listing.startswith("# mm_96x80x128") and "@T.prim_func" in res.tir
    with pytest.raises(TimeRLError, match="shape"):
        tune("mk,kn->mn", pol, measurer=model)


def test_tune_cli_on_a_trained_checkpoint(tmp_path, capsys) -> None:
    """Train for 2 iterations (analytic), then tune with TVM from the run folder."""
    pytest.importorskip("tvm", reason="needs pip install 'timerl[looptune]'")
    from timerl.looptune import tuning as tune_mod

    args = ppo_looptune.Args(
        backend="torch",
        measurer="analytic",
        iterations=2,
        num_envs=2,
        train_problems=2,
        eval_problems=2,
        hidden=8,
        out_dir=str(tmp_path),
        progress=False,
    )
    ppo_looptune.main(args)
    pol = Policy.load(tmp_path)
    assert pol.layers[0][0].shape == (MAX_LOOPS * NUM_FEATURES, 8)
    capsys.readouterr()
    assert (
        tune_mod.main(["mk,kn->mn", "--shape", "24,20,16", "--policy", str(tmp_path), "--remeasure", "1"])
        == 0
    )
    out = capsys.readouterr().out
    assert "mm_24x16x20" in out and "@T.prim_func" in out and "GFLOPS, untuned" in out
    assert (
        tune_mod.main(["bmk,bkn->bmn", "--shape", "2,3,4,5", "--policy", str(tmp_path), "--remeasure", "1"])
        == 0
    )
    assert "bmm_2x3x5x4" in capsys.readouterr().out
    assert tune_mod.main(["mk,kn,nl->ml", "--shape", "2,3,4,5", "--policy", str(tmp_path)]) == 2
    assert "3 operands" in capsys.readouterr().err


def test_policy_save_and_load_keep_the_activation(tmp_path) -> None:
    w = _weights(8, seed=1)
    for act in ("tanh", "relu"):
        pol = Policy.from_weights(w, activation=act)
        back = Policy.load(pol.save(tmp_path / act / "policy.npz").parent)
        assert back.activation == act
        s = initial_state(Problem(64, 80, 96))
        np.testing.assert_allclose(back.logits(s), pol.logits(s))
    assert not np.allclose(
        Policy.from_weights(w).logits(s), Policy.from_weights(w, activation="relu").logits(s)
    )
    with pytest.raises(TimeRLError, match="tanh or relu"):
        Policy.from_weights(w, activation="gelu")
