"""Broadcast removal (``timerl/pdg/passes/broadcast.py``): elementwise readers of an
``EXPAND`` read its operand when their other operands still give the output its shape;
values are the same with the pass on and off, compiled and in the reference evaluator, on
both backends (the fuzz tests flip it too: ``broadcast`` is a compile switch)."""

from __future__ import annotations

import numpy as np
import pytest

import timerl as trl
from timerl.backends import get_backend
from timerl.compile import CompileOptions, build_pdg
from timerl.pdg.ops import OpKind
from timerl.runtime.reference import reference_evaluate

V = np.array([0.5, -1.0, 2.0], np.float32)


def _program() -> tuple[trl.Context, dict, list]:
    out: list = []

    def sink(tag: str):
        return lambda v, p: out.append((tag, tuple(sorted(p.items())), np.array(v, np.float64)))

    ctx = trl.Context(dims=("i", "t"))
    with ctx as ((i, I), (t, T)):
        s = trl.as_tensor(t) * 0.5 + trl.as_tensor(i)  # a scalar per point
        e = s.expand(3)
        v = trl.const(V)
        (e * v + e).sink(sink("y"), name="y")  # both reads can take s itself
        (e + 1.0).sink(sink("z"), name="z")  # e gives the (3,) shape: kept
        n = trl.empty((3,), domain=(i, t), name="n")
        n[i, T - 1] = trl.zeros((3,))
        n[i, t] = s[i, t + 1]  # a scalar into a (3,) branch: an implicit expand
        (n * v).sink(sink("n"), name="nv")
    return ctx, {I: 2, T: 4}, out


def _run(backend: str, **options: bool) -> list:
    ctx, bounds, out = _program()
    ctx.compile(bounds, backend=backend, **options).execute()
    return sorted(out, key=lambda r: (r[0], r[1]))


def _readers_of_expand(pdg) -> list[str]:
    exp = {n.id for n in pdg if n.op.kind is OpKind.EXPAND}
    return sorted(pdg.nodes[e.sink].op.kind.name for e in pdg.edges if e.src in exp and not e.order_only)


def test_elementwise_readers_skip_the_expand_unless_it_gives_the_shape() -> None:
    ctx, bounds, _ = _program()
    off = build_pdg(ctx, bounds, CompileOptions(broadcast=False, vectorize_time=False))
    on = build_pdg(ctx, bounds, CompileOptions(vectorize_time=False))
    before, after = _readers_of_expand(off), _readers_of_expand(on)
    assert before.count("ADD") >= 2 and "MUL" in before
    # `e * v` and `(...) + e` read s now; `e + 1.0` still needs the expand
    assert after.count("ADD") == before.count("ADD") - 1
    assert after.count("MUL") < before.count("MUL")
    assert "ADD" in after


@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_same_values_on_and_off_and_in_the_reference_evaluator(backend: str) -> None:
    on = _run(backend)
    off = _run(backend, broadcast=False)
    want = {
        "y": lambda i, t: (t * 0.5 + i) * V + (t * 0.5 + i),
        "z": lambda i, t: np.full(3, t * 0.5 + i + 1.0),
    }
    assert [r[:2] for r in on] == [r[:2] for r in off]
    for a, b in zip(on, off, strict=True):
        np.testing.assert_allclose(a[2], b[2], rtol=1e-6)
        assert a[2].shape == b[2].shape == (3,), a[0]
        if a[0] in want:
            p = dict(a[1])
            np.testing.assert_allclose(a[2], want[a[0]](p["i"], p["t"]), rtol=1e-6)
    ctx, bounds, out = _program()
    reference_evaluate(build_pdg(ctx, bounds, CompileOptions()), get_backend(backend))
    ref = sorted(out, key=lambda r: (r[0], r[1]))
    assert [r[:2] for r in ref] == [r[:2] for r in on]
    for a, b in zip(ref, on, strict=True):
        np.testing.assert_allclose(a[2], b[2], rtol=1e-6)
