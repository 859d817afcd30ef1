"""``examples/ppo.py``: activations reused by learning (TimeRL Fig. 4), short training runs."""

from __future__ import annotations

import math

import numpy as np
import pytest
from example_pdg import lower_example, ppo

from timerl.pdg.ops import OpKind
from timerl.schedule.ast import Exec, Loop, walk
from timerl.schedule.scheduler import schedule_pdg


def _pdg(args: ppo.Args):
    return lower_example(ppo.build, args, lambda v, p: None)


def test_one_epoch_reuses_the_acting_forward_pass() -> None:
    """Policy and critic: 3 layers each, so 6 forward matmuls per (i, t) point and no more;
    backward: an input gradient per layer but the first, per point, and a weight gradient
    per layer, contracted over the episode's points into one matmul per iteration."""
    pdg = _pdg(ppo.Args(iterations=2, num_envs=2))
    mms = [n for n in pdg if n.op.kind is OpKind.MATMUL]

    def param_read(n):
        names = [pdg.nodes[e.src].name or "" for e in pdg.data_in_edges(n.id)]
        return next((x for x in names if x.startswith("dnn.")), None)

    per_layer = sorted(p for p in map(param_read, mms) if p is not None)
    assert per_layer == ["dnn.vw0", "dnn.vw1", "dnn.vw2", "dnn.w0", "dnn.w1", "dnn.w2"]
    assert len(mms) == 6 + 2 * (3 + 2)
    per_point = [n for n in mms if len(n.domain) == 2]  # (i, t)
    per_iteration = [n for n in mms if len(n.domain) == 1]  # (i,): summed outer products
    assert len(per_point) == 6 + 2 * 2 and len(per_iteration) == 6


def test_gae_runs_backwards_after_acting() -> None:
    pdg = _pdg(ppo.Args(iterations=2, num_envs=2))
    sched = schedule_pdg(pdg)
    adv = next(n.id for n in pdg if n.name == "adv")
    step = next(n.id for n in pdg if n.op.kind is OpKind.UDF and len(n.domain) == 2)

    def loop_of(nid):
        return [
            x
            for x in walk(sched.ast)
            if isinstance(x, Loop) and any(isinstance(y, Exec) and y.node == nid for y in walk(x.body))
        ][-1]

    act, gae = loop_of(step), loop_of(adv)
    assert act is not gae
    assert gae.inc == 1 and "T" in str(gae.init)  # runs from t = T - 1 down (counter -t)


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_short_training_run(backend: str, capsys) -> None:
    means = ppo.main(ppo.Args(backend=backend, iterations=2, num_envs=3, seed=1))
    assert len(means) == 2 and all(math.isfinite(m) and 8 <= m <= 500 for m in means)
    assert "env steps" in capsys.readouterr().out


def _ppo_returns(args: ppo.Args) -> tuple[list[tuple[int, float]], object]:
    got: list[tuple[int, float]] = []
    ex = ppo.build(args, lambda v, p: got.append((p["i"], float(v[0]))))
    ex.execute()
    return sorted(got), ex


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_epochs_and_minibatches_run_and_match_the_reference(backend: str) -> None:
    """E = 2 epochs x M = 2 minibatches (dims e, m): the compiled program against the
    schedule-free evaluator (episode returns are integers: equal iff the same actions)."""
    from timerl.backends import get_backend
    from timerl.runtime.reference import reference_evaluate

    args = ppo.Args(
        backend=backend, iterations=3, num_envs=2, hidden=8, seed=5, update_epochs=2, num_minibatches=2
    )
    compiled, _ = _ppo_returns(args)
    assert len(compiled) == 6 and all(math.isfinite(r) and 8 <= r <= 500 for _, r in compiled)
    got: list[tuple[int, float]] = []
    pdg = lower_example(ppo.build, args, lambda v, p: got.append((p["i"], float(v[0]))), seed=args.seed)
    reference_evaluate(pdg, get_backend(backend), seed=args.seed)
    assert sorted(got) == compiled


def test_update_dims_with_one_epoch_equal_the_plain_update(tmp_path) -> None:
    """The (i, e, m) program with E = M = 1 (a forward pass recomputed on the stored rollout,
    parameters read at (i, 0, 0), Adam's count from the flattened index) learns exactly what
    the one-epoch program (acting activations reused) learns."""
    import numpy as np

    from timerl.runtime.checkpoint import read_values

    runs = {}
    for dims in (False, True):
        d = tmp_path / str(dims)
        args = ppo.Args(
            iterations=3,
            num_envs=2,
            hidden=8,
            seed=3,
            update_dims=dims,
            checkpoint_every=3,
            checkpoint_dir=str(d),
        )
        runs[dims] = (_ppo_returns(args)[0], read_values(str(d)))
    (r0, v0), (r1, v1) = runs[False], runs[True]
    assert r0 == r1
    names = sorted(k for k in v0 if k.startswith("dnn."))
    assert names and names == sorted(k for k in v1 if k.startswith("dnn."))
    for k in names:
        (a,), (b,) = v0[k].values(), v1[k].values()
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7, err_msg=k)
    # the parameters moved (Adam's first moments are not zero): the check is not vacuous
    moved = [k for k in names if ".adam_m" in k and np.abs(next(iter(v0[k].values()))).max() > 0]
    assert moved


def _fixed_run(backend: str, **options) -> tuple[list, dict[str, np.ndarray]]:
    """Fixed-length PPO (4 envs x 8 steps x 3 iterations, 2 epochs x 2 minibatches when asked):
    the rewards/dones of every env each iteration and the final parameters."""
    args = ppo.Args(backend=backend, num_envs=4, num_steps=8, iterations=3, seed=2, ent_coef=0.01)
    got: list = []
    ex = ppo.build_fixed(args, lambda v, p: got.append((p["i"], v.copy())), **options)
    ex.execute()
    params = {n.name: n.id for n in ex.pdg if n.name and n.name.startswith("dnn.")}
    last = {k: ex._interp.value(nid, (args.iterations - 1,)) for k, nid in params.items()}
    return sorted(got, key=lambda x: x[0]), last


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_fixed_length_passes_on_equal_off(backend: str) -> None:
    """--num-steps: every optimising pass on and every one off (vectorizing t, contraction,
    scan lifting, CSE, simplification, fusion) change no return and move the parameters by
    float rounding only (sums in another order)."""
    on_log, on_w = _fixed_run(backend)
    off_log, off_w = _fixed_run(
        backend, vectorize_time=False, contract=False, scan_lift=False, cse=False, simplify=False, fuse=False
    )
    assert len(on_log) == 3 and on_log[0][1].shape == (2, 4, 8)
    for (i1, x), (i2, y) in zip(on_log, off_log, strict=True):
        assert i1 == i2 and np.array_equal(x, y)
    assert on_w.keys() == off_w.keys() and "dnn.w1" in on_w
    for k in on_w:
        np.testing.assert_allclose(on_w[k], off_w[k], rtol=1e-5, atol=1e-6, err_msg=k)


def test_fixed_length_learning_is_vectorized_over_t() -> None:
    """The acting loop keeps only the recurrence (policy forward, sampling, env step, obs);
    the critic, GAE, the loss and its gradient run once per iteration over all t."""
    pdg = lower_example(ppo.build_fixed, ppo.Args(num_envs=2, num_steps=8, iterations=2), lambda v, p: None)
    t = next(s for s, _ in pdg.dims if s.name == "t")
    per_t = [n for n in pdg if t in n.domain]
    vec = [n for n in pdg if t in n.batch_dims]
    mms_per_t = [n for n in per_t if n.op.kind is OpKind.MATMUL]
    assert len(mms_per_t) == 3  # the actor's three layers, to sample the action
    assert len(vec) > 3 * len(per_t)
    # GAE, a backward recurrence over t, is one scan (scan_lift) whose rows are a view
    assert not any(n.name == "adv" for n in per_t)
    assert any(n.op.kind is OpKind.LINEAR_SCAN and n.op.attr("reverse") for n in pdg)


@pytest.mark.parametrize("backend", ["jax", "torch"])
@pytest.mark.parametrize("fixed", [False, True])
def test_dealloc_on_equals_off(backend: str, fixed: bool) -> None:
    """Frees placed by isl (``dealloc=True``), episodic PPO with 2 epochs x 2 minibatches and
    fixed rollouts: the same sunk values bit for bit, a lower store peak."""
    runs = []
    for flag in (False, True):
        got: list[tuple[int, bytes]] = []
        if fixed:
            args = ppo.Args(backend=backend, iterations=2, num_envs=3, num_steps=8, num_minibatches=2, seed=5)
            ex = ppo.build_fixed(args, lambda v, p, got=got: got.append((p["i"], v.tobytes())), dealloc=flag)
        else:
            args = ppo.Args(
                backend=backend,
                iterations=2,
                num_envs=2,
                hidden=8,
                seed=5,
                update_epochs=2,
                num_minibatches=2,
            )
            ex = ppo.build(args, lambda v, p, got=got: got.append((p["i"], v.tobytes())), dealloc=flag)
        ex.execute()
        runs.append((sorted(got), ex.memory_stats().peak_bytes))
    (r_off, p_off), (r_on, p_on) = runs
    assert r_on and r_on == r_off
    assert p_on < p_off
