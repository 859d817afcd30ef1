"""``timerl.agents.ppo`` (through ``examples/ppo.py``, which trains it): activations reused by
learning (TimeRL Fig. 4), short training runs."""

from __future__ import annotations

import math

import numpy as np
import pytest
from example_pdg import lower_example, ppo

import timerl as trl
from timerl.agents.ppo import minibatch_loss
from timerl.errors import EnvNotResetError
from timerl.pdg.ops import OpKind
from timerl.schedule.ast import Exec, Loop, walk
from timerl.schedule.cluster import LAYOUT_KINDS
from timerl.schedule.scheduler import schedule_pdg
from timerl.symbolic import Sym


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
    # per (i, t): over both dims, or vectorized over the episode's t (a batch axis padded to
    # a bucket of the dynamic T: vectorize_dynamic); per (i,): the summed outer products
    over_t = [n for n in mms if len(n.domain) == 2 or any(isinstance(b, Sym) for b in n.batch)]
    per_iteration = [n for n in mms if n not in over_t]
    assert len(over_t) == 6 + 2 * 2 and len(per_iteration) == 6
    # the policy's forward pass runs per step (the env needs its action); the critic's waits
    # for the episode's end with the rest of learning and runs once over the padded episode
    per_step = sorted(param_read(n) for n in over_t if len(n.domain) == 2)
    assert per_step == ["dnn.w0", "dnn.w1", "dnn.w2"]


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


def test_num_seeds_episodic_logs_each_agent(tmp_path, capsys) -> None:
    """``examples/ppo.py --num-seeds 2`` in its default episodic mode: 2 agents in one program,
    metrics.csv has one row per agent and iteration (an ``agent`` column), TensorBoard one run
    per agent, and ``main`` returns the mean over the agents per iteration."""
    import csv

    args = ppo.Args(
        backend="torch",
        iterations=2,
        num_envs=2,
        hidden=8,
        seed=1,
        num_seeds=2,
        out_dir=str(tmp_path),
        quiet=True,
    )
    means = ppo.main(args)
    with open(tmp_path / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert sorted((int(float(r["iteration"])), int(float(r["agent"]))) for r in rows) == [
        (0, 0),
        (0, 1),
        (1, 0),
        (1, 1),
    ]
    per = {(int(float(r["iteration"])), int(float(r["agent"]))): float(r["mean_return"]) for r in rows}
    assert len(means) == 2 and all(8 <= m <= 500 for m in means)
    assert means == pytest.approx([(per[(i, 0)] + per[(i, 1)]) / 2 for i in range(2)])
    assert (tmp_path / "agent_0").is_dir() and (tmp_path / "agent_1").is_dir()
    assert "over 2 agents" in capsys.readouterr().out


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


@pytest.mark.parametrize(
    "backend,env_id,num_steps,seeds",
    [
        ("torch", "CartPole-v1", 0, 1),
        ("torch", "CartPole-v1", 0, 2),
        ("torch", "CartPole-v1", 6, 1),
        ("torch", "CartPole-v1", 6, 2),
        ("jax", "gymnax.CartPole-v1", 6, 2),
    ],
)
def test_checkpoint_and_resume(tmp_path, backend: str, env_id: str, num_steps: int, seeds: int) -> None:
    """--checkpoint-every, episodic and fixed-length rollouts (episodes continue across
    iterations in the env's own state, saved beside the values), one agent or two: one file
    set for every agent after iteration 1, and the iterations after it, resumed, log what the
    straight run logged."""
    base = dict(
        backend=backend,
        env_id=env_id,
        iterations=4,
        num_envs=2,
        hidden=8,
        seed=3,
        num_steps=num_steps,
        num_seeds=seeds,
        quiet=True,
    )
    logged: dict[str, dict] = {"a": {}, "b": {}}
    for name in ("a", "b"):
        args = ppo.Args(**base, checkpoint_every=2, checkpoint_dir=str(tmp_path / name))
        if name == "b":
            args.resume, args.checkpoint_every = str(tmp_path / "a" / "ckpt_1.json"), 0
        build = ppo.build_fixed if num_steps else ppo.build
        got = logged[name]
        build(args, lambda v, p, got=got: got.__setitem__(tuple(sorted(p.items())), np.array(v))).execute()
    files = sorted(f.name for f in (tmp_path / "a").glob("ckpt_1.*"))
    assert files == ["ckpt_1.envs.pkl", "ckpt_1.json", "ckpt_1.npz"]
    later = {p: v for p, v in logged["a"].items() if dict(p)["i"] >= 2}
    assert later and sorted(logged["b"]) == sorted(later)
    for p, v in later.items():  # returns and steps (episodic), rewards and dones (fixed): bit for bit
        assert np.array_equal(logged["b"][p], v), p


def test_resume_that_steps_an_env_without_its_state_says_why(tmp_path, monkeypatch) -> None:
    """An env whose state is not saved (here: a checkpoint written without it) and whose
    episodes continue across iterations: the resume fails naming the checkpoint and what resumes."""
    import os

    base = dict(backend="torch", iterations=3, num_envs=2, hidden=8, seed=3, num_steps=6, quiet=True)
    ppo.main(
        ppo.Args(**base, checkpoint_every=2, checkpoint_dir=str(tmp_path / "a"), out_dir=str(tmp_path / "oa"))
    )
    os.remove(tmp_path / "a" / "ckpt_1.envs.pkl")
    ck = tmp_path / "a" / "ckpt_1.json"
    ck.write_text(ck.read_text().replace('"env_states"', '"env_states_removed"'))
    with pytest.raises(EnvNotResetError, match=r"(?s)step before reset.*resumed from .*ckpt_1.*episodic"):
        ppo.main(ppo.Args(**base, resume=str(tmp_path / "a"), out_dir=str(tmp_path / "ob")))


def _fixed_run(backend: str, epochs: int = 1, **options) -> tuple[list, dict[str, np.ndarray]]:
    """Fixed-length PPO (4 envs x 8 steps x 3 iterations, ``epochs`` epochs x 2 minibatches
    when ``epochs > 1``): the rewards/dones of every env each iteration and the final parameters."""
    mbs = 2 if epochs > 1 else 1
    args = ppo.Args(
        backend=backend,
        num_envs=4,
        num_steps=8,
        iterations=3,
        seed=2,
        ent_coef=0.01,
        update_epochs=epochs,
        num_minibatches=mbs,
    )
    got: list = []
    options.setdefault("dealloc", False)  # the final parameters are read from the store after the run
    ex = ppo.build_fixed(args, lambda v, p: got.append((p["i"], v.copy())), **options)
    ex.execute()
    params = {n.name: n.id for n in ex.pdg if n.name and n.name.startswith("dnn.")}
    last_pt = (args.iterations - 1,) if epochs == 1 else (args.iterations - 1, epochs - 1, mbs - 1)
    last = {k: ex._interp.value(nid, last_pt) for k, nid in params.items()}
    return sorted(got, key=lambda x: x[0]), last


@pytest.mark.parametrize("backend", ["jax", "torch"])
@pytest.mark.parametrize("epochs", [1, 2])
def test_fixed_length_passes_on_equal_off(backend: str, epochs: int) -> None:
    """--num-steps: every optimising pass on and every one off (vectorizing t, contraction,
    scan lifting, CSE, simplification, fusion) change no return and move the parameters by
    float rounding only (sums in another order)."""
    on_log, on_w = _fixed_run(backend, epochs)
    off_log, off_w = _fixed_run(
        backend,
        epochs,
        vectorize_time=False,
        contract=False,
        scan_lift=False,
        cse=False,
        simplify=False,
        fuse=False,
    )
    assert len(on_log) == 3 and on_log[0][1].shape == (2, 4, 8)
    for (i1, x), (i2, y) in zip(on_log, off_log, strict=True):
        assert i1 == i2 and np.array_equal(x, y)
    assert on_w.keys() == off_w.keys() and "dnn.w1" in on_w
    for k in on_w:
        np.testing.assert_allclose(on_w[k], off_w[k], rtol=1e-5, atol=1e-6, err_msg=k)


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_fixed_length_incrementalized_over_t(backend: str) -> None:
    """``incrementalize=256`` bytes: the weight gradients' contractions over the rollout's rows
    (and the bias gradients' sums) run in blocks of ``t``, the chain above them copied per
    block; the same rollouts, and parameters equal up to float summation order."""
    on_log, on_w = _fixed_run(backend, 1, incrementalize=256)
    off_log, off_w = _fixed_run(backend, 1)
    for (i1, x), (i2, y) in zip(on_log, off_log, strict=True):
        assert i1 == i2 and np.array_equal(x, y)
    for k in on_w:
        np.testing.assert_allclose(on_w[k], off_w[k], rtol=1e-5, atol=1e-6, err_msg=k)
    pdg = lower_example(
        ppo.build_fixed,
        ppo.Args(num_envs=4, num_steps=8, iterations=3),
        lambda v, p: None,
        incrementalize=256,
    )
    t = next(s for s, _ in pdg.dims if s.name == "t")
    rows = [n for n in pdg if n.op.kind is OpKind.RESHAPE and n.op.attr("contracted_rows", False)]
    assert rows and all(any(d.name.startswith("di") for d in n.domain) for n in rows)
    assert any(t in n.batch_dims and n.batch[n.batch_dims.index(t)] < 8 for n in pdg)


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


def test_gae_is_one_scan_with_epochs_and_minibatches() -> None:
    """With (e, m) update dims the acting weights are read at (i, 0, 0): the branch of their
    updates within an iteration is never taken there, so GAE's inputs do not depend on the
    advantages of the same iteration, and it is lifted as with one update."""
    args = ppo.Args(num_envs=2, num_steps=8, iterations=2, update_epochs=2, num_minibatches=2)
    pdg = lower_example(ppo.build_fixed, args, lambda v, p: None)
    assert any(n.op.kind is OpKind.LINEAR_SCAN and n.op.attr("reverse") for n in pdg)


def test_no_duplicates_left_after_the_passes() -> None:
    """CSE runs again after ``contract``: the actor's and the critic's first-layer weight
    gradients contract the same observations, and their row reshapes (and transposes) are
    one node each, not two (image observations held them twice: 96 MiB each at 16 x 128)."""
    from timerl.pdg.passes.cse import eliminate_common_subexpressions

    pdg = lower_example(ppo.build_fixed, ppo.Args(num_envs=2, num_steps=8, iterations=2), lambda v, p: None)
    assert eliminate_common_subexpressions(pdg) is pdg
    obs_rows = [
        n
        for n in pdg
        if n.op.kind is OpKind.RESHAPE and n.op.attr("contracted_rows") and n.outputs[0].shape[-1] == 4
    ]
    assert len(obs_rows) == 1


def test_transposes_run_next_to_their_matmuls() -> None:
    """The weight gradients' transposes (``contract``: ``MATMUL(PERMUTE(rows), rows)``) run
    just before their matmul, in its statement (``LAYOUT_KINDS`` in the clusterer): the
    runtime then compiles both into one region and the transpose is never stored. Before,
    the clusterer put four of them with the rollout, each a stored ``(B * T, 64)`` copy
    (131 MB of PPO's 276 MB store peak at 512 x 250)."""
    pdg = lower_example(ppo.build_fixed, ppo.Args(num_envs=2, num_steps=8, iterations=2), lambda v, p: None)
    transposes: dict[int, set[int]] = {}
    for e in pdg.edges:
        if pdg.nodes[e.src].op.kind is OpKind.PERMUTE and pdg.nodes[e.sink].op.kind is OpKind.MATMUL:
            transposes.setdefault(e.src, set()).add(e.sink)
    assert len(transposes) >= 4
    sched = schedule_pdg(pdg)
    seen = 0
    for node in walk(sched.ast):
        children = getattr(node, "children", ())
        for k, a in enumerate(children):
            if isinstance(a, Exec) and a.node in transposes:
                # only layout ops (the matmul's other operand) may come in between
                rest = iter(children[k + 1 :])
                b = next(rest)
                while isinstance(b, Exec) and pdg.nodes[b.node].op.kind in LAYOUT_KINDS:
                    b = next(rest)
                assert isinstance(b, Exec) and b.node in transposes[a.node], (a, b)
                seen += 1
    assert seen == len(transposes)


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_minibatch_loss_matches_cleanrl_on_the_same_rows(backend: str) -> None:
    """``minibatch_loss`` (rollout shuffled per epoch, rows taken, advantages normalised per
    minibatch, clipped value loss) against CleanRL's loss written in eager PyTorch on the same
    rows and parameters: the loss and every parameter gradient, for each minibatch; the
    minibatches of an epoch partition the rollout."""
    import gymnasium as gym
    import torch

    Bn, Tn, M = 2, 6, 3
    rng = np.random.default_rng(4)
    obs = rng.normal(size=(Bn, 1, Tn, 4)).astype(np.float32)
    act = rng.integers(0, 2, size=(Bn, 1, Tn)).astype(np.int64)
    logp_old = rng.normal(-0.7, 0.1, size=(Bn, 1, Tn)).astype(np.float32)
    v_old = rng.normal(size=(Bn, 1, Tn)).astype(np.float32)
    adv = rng.normal(size=(Bn, 1, Tn)).astype(np.float32)
    ret = (adv + v_old + rng.normal(0, 0.5, size=adv.shape)).astype(np.float32)
    args = ppo.Args(num_envs=Bn, num_steps=Tn, num_minibatches=M, hidden=5, ent_coef=0.01, clip_coef=0.2)

    class Spaces:
        obs_space = gym.spaces.Box(-1, 1, (4,), np.float32)
        action_space = gym.spaces.Discrete(2)

    seen: dict[str, dict] = {"idx": {}, "loss": {}}
    ctx = trl.Context(dims=("b", "i", "e", "m", "t"))
    with ctx as ((b, B), (i, I), (e, E), (m, _), (t, T)):
        dnn = trl.DNNBuilder(domain=(i, e, m), seed=1).from_env(Spaces(), hidden=[5, 5], critic=True).build()
        rt = [trl.const(x)[b, i, t] for x in (obs, act, logp_old, v_old, adv, ret)]
        loss, idx = minibatch_loss(args, dnn, B, T, i, e, m, *rt)
        loss.backward()
        idx.sink(lambda v, p: seen["idx"].__setitem__(p["m"], np.array(v)))
        loss.sink(lambda v, p: seen["loss"].__setitem__(p["m"], float(v)))
        for p in dnn.params:
            seen[p.name] = {}
            seen[p.name + ".grad"] = {}
            p.sink(lambda v, pt, n=p.name: seen[n].__setitem__(pt["m"], np.array(v)))
            p.grad.sink(lambda v, pt, n=p.name: seen[n + ".grad"].__setitem__(pt["m"], np.array(v)))
        trl.optim.SGD(dnn.params, lr=0.1).step()
    ctx.compile({B: Bn, I: 1, E: 1, ctx.dims[3][1]: M, T: Tn}, backend=backend).execute()

    mb = Bn * Tn // M
    assert sorted(np.concatenate([seen["idx"][k] for k in range(M)]).tolist()) == list(range(Bn * Tn))
    flat = [torch.from_numpy(x.reshape(Bn * Tn, *x.shape[3:])) for x in (obs, act, logp_old, v_old, adv, ret)]
    names = [p.name for p in dnn.params]
    for k in range(M):
        rows = torch.from_numpy(seen["idx"][k])
        o, a, lp0, v0, ad, rt_ = (x[rows] for x in flat)
        w = {n: torch.tensor(seen[n][k], requires_grad=True) for n in names}

        def mlp(x, pre, w=w):
            h = torch.tanh(x @ w[f"dnn.{pre}w0"] + w[f"dnn.{pre}b0"])
            h = torch.tanh(h @ w[f"dnn.{pre}w1"] + w[f"dnn.{pre}b1"])
            return h @ w[f"dnn.{pre}w2"] + w[f"dnn.{pre}b2"]

        logits, value = mlp(o, ""), mlp(o, "v").squeeze(-1)
        lsm = torch.log_softmax(logits, -1)
        newlogp = lsm.gather(-1, a[:, None]).squeeze(-1)
        entropy = -(lsm.exp() * lsm).sum(-1)
        ratio = (newlogp - lp0).exp()
        ad = (ad - ad.mean()) / (ad.std() + 1e-8)
        pg = torch.max(-ad * ratio, -ad * torch.clamp(ratio, 0.8, 1.2)).mean()
        v_clipped = v0 + torch.clamp(value - v0, -0.2, 0.2)
        v_loss = 0.5 * torch.max((value - rt_) ** 2, (v_clipped - rt_) ** 2).mean()
        want = pg - 0.01 * entropy.mean() + 0.5 * v_loss
        want.backward()
        assert len(rows) == mb
        np.testing.assert_allclose(seen["loss"][k], want.item(), rtol=1e-5, atol=1e-6)
        for n in names:
            np.testing.assert_allclose(
                seen[n + ".grad"][k], w[n].grad.numpy(), rtol=1e-4, atol=1e-6, err_msg=n
            )


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_fixed_length_minibatches_match_the_reference(backend: str) -> None:
    """Shuffled minibatches (2 epochs x 2): the compiled program against the schedule-free
    evaluator; the rollouts (rewards and dones of every env) are equal iff the same actions
    were taken, which after the first iteration depends on every update."""
    from timerl.backends import get_backend
    from timerl.runtime.reference import reference_evaluate

    args = ppo.Args(
        backend=backend, num_envs=4, num_steps=8, iterations=3, seed=2, update_epochs=2, num_minibatches=2
    )
    compiled: list = []
    ppo.build_fixed(args, lambda v, p: compiled.append((p["i"], v.copy()))).execute()
    ref: list = []
    pdg = lower_example(ppo.build_fixed, args, lambda v, p: ref.append((p["i"], v.copy())), seed=args.seed)
    reference_evaluate(pdg, get_backend(backend), seed=args.seed)
    assert [k for k, _ in compiled] == [k for k, _ in ref] == [0, 1, 2]
    for (_, x), (_, y) in zip(compiled, ref, strict=True):
        np.testing.assert_array_equal(x, y)


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


def test_finished_returns_matches_a_loop_over_the_steps() -> None:
    """The example's episode returns (vectorized) equal a step-by-step account, across rollouts."""
    rng = np.random.default_rng(3)
    for _ in range(50):
        envs, steps = int(rng.integers(1, 6)), int(rng.integers(1, 40))
        loop_running = rng.random(envs)
        running = loop_running.copy()
        for _ in range(3):  # consecutive rollouts carry the unfinished episodes
            rewards = rng.random((envs, steps))
            dones = rng.random((envs, steps)) < rng.random()
            expected: list[float] = []
            for k in range(steps):
                loop_running += rewards[:, k]
                expected.extend(loop_running[dones[:, k]].tolist())
                loop_running[dones[:, k]] = 0.0
            got = ppo.finished_returns(running, rewards, dones)
            np.testing.assert_allclose(sorted(got), sorted(expected))
            np.testing.assert_allclose(running, loop_running)


def test_finished_returns_after_a_resume_leave_out_episodes_begun_before_it() -> None:
    """After a resume an env's first finished episode began before the checkpoint (its return
    is unknown): it is left out, the later ones counted."""
    rewards = np.ones((2, 6))
    dones = np.zeros((2, 6), dtype=bool)
    dones[0, [1, 4]] = True  # env 0: an episode begun before the resume ends at step 1, one more at 4
    dones[1, 5] = True  # env 1: only the episode begun before
    known = np.zeros(2, dtype=bool)
    running = np.zeros(2)
    assert ppo.finished_returns(running, rewards, dones, known) == [3.0]
    assert known.tolist() == [True, True] and running.tolist() == [1.0, 0.0]
    ends = np.ones((2, 2), dtype=bool)
    assert ppo.finished_returns(running, rewards[:, :2], ends, known) == [2.0, 1.0, 1.0, 1.0]
