"""Fused regions spanning statements (``plan/regions.py``): cheap host statements move up,
pure ops join the latest region they can, reads through static batch layouts stay inside a
region; values equal the unfused interpreter's and the reference evaluator's."""

from __future__ import annotations

import numpy as np
import pytest

import timerl as trl
from timerl.pdg.ir import Edge, Node
from timerl.pdg.ops import Op, OpKind
from timerl.plan.regions import FusedExec, may_read
from timerl.schedule.ast import Exec, Seq, walk
from timerl.symbolic import Slice, Sym
from timerl.symbolic.expr import lift

i, t, c0, c1 = Sym("i"), Sym("t"), Sym("_c0"), Sym("_c1")


def _edge(phi) -> Edge:
    return Edge(sink=1, src=0, iid=0, oid=0, phi=tuple(phi))


def _sink() -> Node:
    return Node(1, Op(OpKind.IDENTITY), (i, t), (), 1)


@pytest.mark.parametrize(
    ("phi", "src_point", "expect"),
    [
        ((i, t - 1), (c0, c1), False),  # the previous step: written before this instance
        ((i, t), (c0, c1), True),
        ((i - 1, t), (c0, c1), False),
        ((i, Slice(lift(0), t)), (c0, c1), False),  # 0:t excludes t
        ((i, Slice(lift(0), t + 1)), (c0, c1), True),
        ((i, t * 2), (c0, c1), True),  # not provably another point
    ],
)
def test_may_read(phi, src_point, expect) -> None:
    assert may_read(_edge(phi), _sink(), (c0, c1), src_point) is expect


def _program(out: list):
    """Adam with an annealed lr (an EVAL_SYMBOL) and the moments' MERGEs between pure ops,
    a loss over the whole t-vectorized rollout (reads ``batch[t=0:T]``)."""
    ctx = trl.Context(dims=("i", "t"))
    with ctx as ((i, I), (t, T)):
        w = trl.param(np.array([0.5, -0.25, 0.1], np.float32), domain=(i,), name="w")
        v = trl.param(np.array([0.3, 0.2, -0.4], np.float32), domain=(i,), name="v")
        x = (trl.as_tensor(t) * 0.25 + 1.0) * w
        y = (x * v).tanh() - x.exp() * 0.05
        loss = (y[i, 0:T] * y[i, 0:T]).sum() + (v * v).sum() * 0.01
        loss.backward()
        lr = 0.05 * (1.0 - trl.as_tensor(i) / 8.0)
        trl.optim.Adam([w, v], lr=lr).step()
        loss.sink(lambda a, p: out.append((p["i"], np.array(a))))
        w.sink(lambda a, p: out.append((p["i"], np.array(a))))
    return ctx, {I: 4, T: 6}


def _regions(prog) -> list[FusedExec]:
    return prog.plan.regions()


def _consecutive_runs(prog) -> list[int]:
    """The sizes of the regions over ``(i,)`` that fusing only consecutive statements made
    (the earlier rule)."""
    from timerl.plan.fusable import fusable

    pdg, sizes = prog.pdg, []
    for s in walk(prog.schedule.ast):
        if isinstance(s, Seq):
            run = 0
            for c in (*s.children, None):
                if type(c) is Exec and fusable(pdg.nodes[c.node]) and pdg.nodes[c.node].domain == (i,):
                    run += 1
                    continue
                if run >= 2:
                    sizes.append(run)
                run = 0
    return sizes


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_regions_span_statements_and_keep_values(backend: str) -> None:
    from timerl.runtime.reference import reference_evaluate

    runs = {}
    for fuse in (False, True):
        out: list = []
        ctx, bounds = _program(out)
        prog = ctx.compile(bounds, backend=backend, fuse=fuse)
        prog.execute()
        runs[fuse] = out
    for (pa, a), (pb, b) in zip(runs[False], runs[True], strict=True):
        assert pa == pb
        np.testing.assert_allclose(a, b, rtol=2e-6, atol=1e-7)
    ref: list = []
    ctx, bounds = _program(ref)
    prog = ctx.compile(bounds, backend=backend)
    reference_evaluate(prog.pdg, prog.backend, seed=0)
    for (pa, a), (pb, b) in zip(runs[True], ref, strict=True):
        assert pa == pb
        np.testing.assert_allclose(a, b, rtol=2e-6, atol=1e-7)


def test_learning_phase_is_few_regions() -> None:
    out: list = []
    ctx, bounds = _program(out)
    prog = ctx.compile(bounds, backend="jax")
    # the i-level learning phase: Adam's MERGEs and the lr's EVAL_SYMBOL no longer split it
    at_i = [len(r.members) for r in _regions(prog) if prog.pdg.nodes[r.members[0]].domain == (i,)]
    before = _consecutive_runs(prog)
    assert len(at_i) < len(before)
    assert max(at_i) > max(before)


def test_a_linear_scan_read_as_batch_stays_in_its_region() -> None:
    """PPO's learner is one region: the lifted GAE recurrence (``LINEAR_SCAN``, per-point
    rows ``0:T``) is read by the vectorized advantages through ``to_batch`` at its own point,
    a point-independent layout, so the region does not split there (it did: the learner ran
    as two regions with every value crossing between them stored and freed)."""
    from timerl.agents.ppo import PPOArgs, build_fixed

    args = PPOArgs(
        env_id="gymnax.CartPole-v1", num_envs=4, num_steps=16, iterations=2, update_epochs=1,
        num_minibatches=1, backend="jax", checkpoint_every=0,
    )  # fmt: skip
    ex = build_fixed(args, lambda *_: None)
    pdg = ex.pdg
    scans = [n.id for n in pdg.nodes.values() if n.op.kind is OpKind.LINEAR_SCAN]
    assert scans
    for r in ex.plan.regions():
        if any(m in scans for m in r.members):
            readers = {e.sink for s in scans for e in pdg.out_edges(s) if e.to_batch is not None}
            assert readers and readers <= set(r.members)


def test_no_frees_of_unstored_members_and_a_fallback_frees_them_itself(monkeypatch) -> None:
    """The Plan has no frees of region members that are never stored (``plan/unstored.py``);
    a region that fails at run time runs its members one by one and then frees the members
    the region would not have stored, so the store ends as it does with the region."""
    from timerl.backends.jax_backend import JaxBackend
    from timerl.plan.fusable import stored_members
    from timerl.schedule.ast import Dealloc

    def run(fail: bool) -> tuple[list, object, object]:
        out: list = []
        ctx, bounds = _program(out)
        ex = ctx.compile(bounds, backend="jax")
        if fail:
            real = JaxBackend.compile

            def broken(self, fn, *a, **k):
                compiled = real(self, fn, *a, **k)

                def call(*args):
                    if len(args) > 1:  # regions (of two or more inputs) fail
                        raise RuntimeError("injected compile failure")
                    return compiled(*args)

                return call

            monkeypatch.setattr(JaxBackend, "compile", broken)
        ex.execute()
        monkeypatch.undo()
        return out, ex, ex._interp.store

    good, ex, store_ok = run(False)
    freed = {s.node for s in walk(ex.plan.ast) if isinstance(s, Dealloc)}
    unstored = []
    for r in ex.plan.regions():
        nodes = [ex.pdg.nodes[m] for m in r.members]
        kept = {r.members[k] for k in stored_members(nodes, ex.pdg)}
        if ex.pdg.nodes[r.members[0]].domain == (i,):  # in the iteration loop only
            unstored += [m for m in r.members if m not in kept]
    assert unstored and not freed & set(unstored)
    bad, _, store_bad = run(True)
    for a, b in zip(good, bad, strict=True):
        assert a[0] == b[0]
        np.testing.assert_allclose(a[1], b[1], rtol=1e-5, atol=1e-5)
    assert store_bad.live_points == store_ok.live_points
