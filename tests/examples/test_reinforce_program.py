"""The REINFORCE programs of ``examples/``: schedule shape and short training runs."""

from __future__ import annotations

import math

import numpy as np
import pytest
from example_pdg import lower_example, reinforce

from timerl.pdg.ops import OpKind
from timerl.schedule.ast import Exec, Loop, walk
from timerl.schedule.scheduler import schedule_pdg


def _pdg(n: int):
    return lower_example(reinforce.build, reinforce.Args(n=n, iterations=3, num_envs=2), lambda v, p: None)


def _inner_loop_of(ast, nid):
    loops = [
        n
        for n in walk(ast)
        if isinstance(n, Loop) and any(isinstance(x, Exec) and x.node == nid for x in walk(n.body))
    ]
    return loops[-1]


@pytest.mark.parametrize("n", [0, 5])
def test_schedule_shape(n: int) -> None:
    """MC acts for the whole episode, then learns; n-step learns inside the acting loop."""
    pdg = _pdg(n)
    sched = schedule_pdg(pdg)
    step = next(x.id for x in pdg if x.op.kind is OpKind.UDF and x.domain and len(x.domain) == 2)
    # Monte-Carlo: the returns of every t are one suffix sum (pdg/passes/suffix_scan.py)
    learn = next(x.id for x in pdg if x.op.kind in (OpKind.DISCOUNTED_SUM, OpKind.SUFFIX_SUM))
    act_loop, learn_loop = _inner_loop_of(sched.ast, step), _inner_loop_of(sched.ast, learn)
    if n == 0:  # the returns after the episode's acting loop, outside it
        assert act_loop is not learn_loop
        assert not any(isinstance(x, Exec) and x.node == learn for x in walk(act_loop.body))
        order = [x for x in walk(sched.ast) if x is act_loop or (isinstance(x, Exec) and x.node == learn)]
        assert order[0] is act_loop and len(order) == 2
    else:
        assert act_loop is learn_loop


@pytest.mark.parametrize("backend", ["jax", "torch"])
@pytest.mark.parametrize("n", [0, 3])
def test_short_training_run(backend: str, n: int, capsys) -> None:
    means = reinforce.main(reinforce.Args(backend=backend, n=n, iterations=3, num_envs=4, seed=1))
    assert len(means) == 3 and all(math.isfinite(m) and 8 <= m <= 500 for m in means)
    out = capsys.readouterr().out
    assert "iter    2  mean return" in out


@pytest.mark.parametrize("backend", ["jax", "torch"])
@pytest.mark.parametrize("n", [0, 3])
def test_compiled_equals_reference_evaluator(backend: str, n: int) -> None:
    """The whole REINFORCE program (env UDFs, autodiff, Adam) against the schedule-free evaluator."""
    from timerl.backends import get_backend
    from timerl.runtime.reference import reference_evaluate

    got: list[tuple[int, int, float]] = []
    args = reinforce.Args(backend=backend, n=n, iterations=2, num_envs=3, seed=2)
    sink = lambda v, p: got.append((p["i"], p["b"], float(v)))  # noqa: E731
    reinforce.build(args, sink).execute()
    compiled = sorted(got)
    got.clear()
    pdg = lower_example(reinforce.build, args, sink, seed=args.seed)
    reference_evaluate(pdg, get_backend(backend), seed=args.seed)
    assert len(compiled) == 6
    assert sorted(got) == compiled  # episode returns: integers, equal iff the same actions


def test_cli_checkpoint_and_resume(tmp_path) -> None:
    """--checkpoint-every / --resume: iterations after the resume point match a straight run."""
    base = dict(backend="torch", iterations=3, num_envs=3, seed=4, checkpoint_every=2)
    straight = reinforce.main(reinforce.Args(**base, checkpoint_dir=str(tmp_path / "a")))
    first = reinforce.main(reinforce.Args(**{**base, "iterations": 2}, checkpoint_dir=str(tmp_path / "b")))
    assert (tmp_path / "b" / "ckpt_1.json").exists()
    rest = reinforce.main(reinforce.Args(**{**base, "checkpoint_every": 0}, resume=str(tmp_path / "b")))
    assert first == straight[:2]
    assert rest == straight[2:]


def test_checkpoint_and_resume_with_agents(tmp_path) -> None:
    """--num-seeds 2 with --checkpoint-every: one file set for both agents (a request is per
    iteration, not per agent), and resuming from it continues as the straight run."""
    base = dict(backend="torch", iterations=3, num_envs=3, seed=4, checkpoint_every=2, num_seeds=2)
    straight = reinforce.main(reinforce.Args(**base, checkpoint_dir=str(tmp_path / "a")))
    assert sorted(f.name for f in (tmp_path / "a").glob("ckpt_*")) == [
        "ckpt_1.envs.pkl",
        "ckpt_1.json",
        "ckpt_1.npz",
    ]
    first = reinforce.main(reinforce.Args(**{**base, "iterations": 2}, checkpoint_dir=str(tmp_path / "b")))
    rest = reinforce.main(reinforce.Args(**{**base, "checkpoint_every": 0}, resume=str(tmp_path / "b")))
    assert first == straight[:2]
    assert rest == straight[2:]


PASSES_OFF = dict(
    vectorize_time=False, simplify=False, cse=False, contract=False, scan_lift=False, fuse=False
)


@pytest.mark.parametrize("backend", ["jax", "torch"])
@pytest.mark.parametrize("n", [0, 3])
def test_passes_on_equal_off(backend: str, n: int) -> None:
    """Every optimising pass on and every one off: the same episode returns (the same actions)
    and parameters within float rounding after 3 iterations."""
    runs = []
    for options in ({"dealloc": False}, {**PASSES_OFF, "dealloc": False}):  # parameters read after the run
        got: list[tuple[int, int, float]] = []
        args = reinforce.Args(backend=backend, n=n, iterations=3, num_envs=3, seed=5)
        ex = reinforce.build(args, lambda v, p, got=got: got.append((p["i"], p["b"], float(v))), **options)
        ex.execute()
        params = {
            x.name: x.id for x in ex.pdg if x.name and x.name.startswith("dnn.") and "adam" not in x.name
        }
        runs.append((sorted(got), {k: ex._interp.value(nid, (2,)) for k, nid in params.items()}))
    (r_on, w_on), (r_off, w_off) = runs
    assert len(r_on) == 9 and r_on == r_off
    assert w_on.keys() == w_off.keys() and w_on
    for k in w_on:
        np.testing.assert_allclose(w_on[k], w_off[k], rtol=1e-5, atol=1e-6, err_msg=k)


@pytest.mark.parametrize("backend", ["jax", "torch"])
@pytest.mark.parametrize("n", [0, 8])
def test_dealloc_on_equals_off(backend: str, n: int) -> None:
    """Frees placed by isl (``dealloc=True``): the same episode returns, bit for bit, with
    fewer bytes held at the end and at the peak."""
    runs = []
    for flag in (False, True):
        got: list[tuple[int, int, float]] = []
        args = reinforce.Args(backend=backend, n=n, iterations=3, num_envs=3, seed=5)
        ex = reinforce.build(args, lambda v, p, got=got: got.append((p["i"], p["b"], float(v))), dealloc=flag)
        ex.execute()
        runs.append((sorted(got), ex.memory_stats()))
    (r_off, m_off), (r_on, m_on) = runs
    assert len(r_on) == 9 and r_on == r_off
    assert m_on.live_bytes < m_off.live_bytes / 4 and m_on.peak_bytes < m_off.peak_bytes


def test_dealloc_checkpoint_and_resume(tmp_path) -> None:
    """With frees, checkpoints still hold the carried values (kept from frees) and a resumed
    run continues like a straight one."""

    def returns(**kw) -> list[tuple[int, int, float]]:
        got: list[tuple[int, int, float]] = []
        args = reinforce.Args(backend="torch", num_envs=3, seed=4, **kw)
        reinforce.build(args, lambda v, p: got.append((p["i"], p["b"], float(v))), dealloc=True).execute()
        return sorted(got)

    straight = returns(iterations=3, checkpoint_every=0)
    first = returns(iterations=2, checkpoint_every=2, checkpoint_dir=str(tmp_path / "b"))
    assert (tmp_path / "b" / "ckpt_1.json").exists()
    rest = returns(iterations=3, checkpoint_every=0, resume=str(tmp_path / "b"))
    assert first == straight[:6] and rest == straight[6:]


def _returns_per_agent(args: reinforce.Args) -> dict:
    """Each env's episode return per (agent, iteration); agent None in a one-agent run."""
    got: dict = {}
    reinforce.build(args, lambda v, p: got.setdefault((p.get("s"), p["i"]), []).append(float(v))).execute()
    return got


@pytest.mark.parametrize(("backend", "n"), [("jax", 0), ("torch", 5)])
def test_num_seeds_agent_k_equals_the_run_with_its_seed(backend: str, n: int) -> None:
    """``--num-seeds 3``: three agents in one program (episodes over a dynamic ``T``, the
    longest of every agent's envs: a finished env adds zero reward and zero gradient); agent
    ``k``'s episode returns equal the one-agent run with ``--seed SEED + k``."""

    base = dict(num_envs=4, iterations=3, backend=backend, seed=2, n=n, quiet=True)
    many = _returns_per_agent(reinforce.Args(**base, num_seeds=3))
    for k in range(3):
        one = _returns_per_agent(reinforce.Args(**{**base, "seed": 2 + k}))
        for i in range(3):
            assert many[(k, i)] == one[(None, i)]


def test_sweep_gives_each_agent_its_learning_rate() -> None:
    """``--sweep lr=1e-2,3e-2``: agent k has the k-th learning rate and seed ``SEED + k``."""

    base = dict(num_envs=4, iterations=3, backend="torch", seed=5, quiet=True)
    many = _returns_per_agent(reinforce.Args(**base, sweep=("lr=1e-2,3e-2",)))
    for k, lr in enumerate((1e-2, 3e-2)):
        one = _returns_per_agent(reinforce.Args(**{**base, "seed": 5 + k, "lr": lr}))
        for i in range(3):
            assert many[(k, i)] == one[(None, i)]
