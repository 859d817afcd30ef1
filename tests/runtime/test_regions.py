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
