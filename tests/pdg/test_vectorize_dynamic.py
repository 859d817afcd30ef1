"""``vectorize_partial`` over a dim with a dynamic bound (``vectorize_dynamic``): nodes run
once per episode with their batch axis padded to ``bucket(T)``; the padding never reaches a
read value. Checked with the pass on and off, on both backends, and against the reference
evaluator on the vectorized PDG, with padded rows that are ``-inf`` before masking."""

from __future__ import annotations

import numpy as np
import pytest

import timerl as trl
from timerl.backends import get_backend
from timerl.compile import CompileOptions, build_pdg
from timerl.pdg.ops import OpKind
from timerl.pdg.sizes import bucket
from timerl.plan.layout import input_layout
from timerl.runtime.reference import reference_evaluate
from timerl.symbolic import Sym

LENGTHS = [3, 5, 8, 2, 6]  # episode lengths per iteration: buckets 4, 8, 8, 2, 8


def program(sunk: dict[str, dict]) -> tuple[trl.Context, dict]:
    ctx = trl.Context(dims=("i", "t"))
    with ctx as ((i, I), (t, T)):
        w = trl.param(np.array([[0.3, -0.2, 0.1], [0.5, 0.4, -0.6]], np.float32), domain=(i,), name="w")
        x = trl.empty((2,), domain=(i, t), name="x")
        x[i, 0] = trl.const(np.array([1.0, 2.0], np.float32)) + trl.as_tensor(i) * 0.25
        x[i, t + 1] = x * 0.9 + 0.1  # a recurrence: stays per point
        n = trl.const(np.array(LENGTHS, np.int64))[i]
        done = trl.as_tensor(t) + 1 >= n
        a = x.abs().log()  # -inf on zero-padded rows: a leak of padding shows up
        z = (a @ w).tanh()  # its weight gradient is a contraction over t
        step = (z * z).sum() + (a * 0.5).sum()
        loss = step[i, 0:T].sum(0)
        loss.backward()
        w[i + 1] = w - 0.1 * w.grad
        loss.sink(lambda v, p: sunk["loss"].__setitem__(p["i"], np.array(v)))
        step[i, T - 1].sink(lambda v, p: sunk["last"].__setitem__(p["i"], np.array(v)))
        w.sink(lambda v, p: sunk["w"].__setitem__(p["i"], np.array(v)))
    return ctx, {I: len(LENGTHS), T: done}


def run(backend: str, **options: object) -> dict[str, dict]:
    sunk: dict[str, dict] = {"loss": {}, "last": {}, "w": {}}
    ctx, bounds = program(sunk)
    ctx.compile(bounds, backend=backend, **options).execute()
    return sunk


def _close(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert sorted(a[name]) == sorted(b[name]), name
        for k in a[name]:
            assert np.all(np.isfinite(a[name][k])), (name, k)
            np.testing.assert_allclose(a[name][k], b[name][k], rtol=1e-5, atol=1e-6, err_msg=f"{name}[{k}]")


def _padded(pdg) -> list:
    return [n for n in pdg if any(isinstance(x, Sym) for x in n.batch)]


def test_nodes_that_wait_for_the_episode_end_are_padded_to_buckets() -> None:
    """The loss's gradient needs ``step[i, 0:T]``, and nothing needs the forward values
    before the episode ends: all of them are vectorized; the recurrence is not."""
    ctx, bounds = program({"loss": {}, "last": {}, "w": {}})
    pdg = build_pdg(ctx, bounds, CompileOptions())
    padded = _padded(pdg)
    kinds = {n.op.kind for n in padded}
    assert {OpKind.LOG, OpKind.TANH, OpKind.TANH_GRAD, OpKind.MATMUL} <= kinds
    t = next(s for s, _ in pdg.dims if s.name == "t")
    assert all(t not in n.domain for n in padded)
    x = next(n for n in pdg if n.name == "x")
    assert t in x.domain and not any(isinstance(b, Sym) for b in x.batch)  # the recurrence stays
    off = build_pdg(ctx, bounds, CompileOptions(vectorize_dynamic=False))
    assert not _padded(off)


def _window_program(n: int | None) -> tuple[trl.Context, dict]:
    """Returns over ``r[t:min(t + n, T)]`` (or ``r[t:T]`` when ``n`` is None), their sum sunk
    per step; the env steps until ``t + 1 == 7``."""
    ctx = trl.Context(dims=("i", "t"))
    with ctx as ((i, I), (t, T)):
        o = trl.empty((4,), domain=(i, t), name="obs")
        o[i, 0] = trl.zeros((4,))
        o[i, t + 1] = o * 0.5 + 1.0
        r = (o * o).sum()
        done = trl.as_tensor(t) + 1 >= 7
        g = (r[i, t:T] if n is None else r[i, t : trl.min(t + n, T)]).discounted_sum(0.9)
        (o.sum() * g).exp().sink(lambda v, p: None)
    return ctx, {I: 2, T: done}


def test_a_window_that_needs_no_end_is_not_delayed() -> None:
    """An n-step window is known ``n`` steps later, not at the episode's end: its readers
    run per point while the episode goes on, keeping O(n) values live (TimeRL §8.4). With
    Monte-Carlo returns (``r[t:T]``) the same readers wait for the end and are vectorized."""
    window = build_pdg(*_window_program(3), CompileOptions())
    assert not _padded(window)
    mc = build_pdg(*_window_program(None), CompileOptions())
    assert {OpKind.MUL, OpKind.EXP} <= {n.op.kind for n in _padded(mc)}  # the sink takes rows


def test_sums_over_padded_rows_read_them_masked() -> None:
    """The sum over ``0:T`` and the contraction's row reshapes read the padded axis with its
    padding zeroed (one shape per bucket); other readers take rows below ``T``."""
    ctx, bounds = program({"loss": {}, "last": {}, "w": {}})
    pdg = build_pdg(ctx, bounds, CompileOptions())
    steps = {}
    for e in pdg.edges:
        src, sink = pdg.nodes[e.src], pdg.nodes[e.sink]
        if e.order_only or not any(isinstance(b, Sym) for b in src.batch):
            continue
        for kind, _ in input_layout(src, sink, e).steps:
            steps.setdefault(kind, set()).add(sink.op.kind)
    assert OpKind.SUM in steps.get("mask", set())
    assert OpKind.RESHAPE in steps.get("mask", set())
    assert "narrow" not in steps  # every slice of the padded axis here is summed


@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_same_values_with_and_without(backend: str) -> None:
    on = run(backend)
    off = run(backend, vectorize_dynamic=False)
    _close(on, off)
    assert sorted(on["loss"]) == list(range(len(LENGTHS)))


@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_reference_evaluator_on_the_padded_pdg(backend: str) -> None:
    sunk: dict[str, dict] = {"loss": {}, "last": {}, "w": {}}
    ctx, bounds = program(sunk)
    pdg = build_pdg(ctx, bounds, CompileOptions())
    assert _padded(pdg)
    reference_evaluate(pdg, get_backend(backend))
    _close(sunk, run(backend))


def test_buckets_are_powers_of_two() -> None:
    assert [bucket(n) for n in (1, 2, 3, 4, 5, 8, 9, 500)] == [1, 2, 4, 4, 8, 8, 16, 512]


def test_swapping_keeps_learning_per_step() -> None:
    """``swap=True``: learning fetches the swapped episode one step at a time, so the dynamic
    dim is not vectorized (a vectorized reader would read the episode whole)."""
    ctx, bounds = program({"loss": {}, "last": {}, "w": {}})
    assert not _padded(build_pdg(ctx, bounds, CompileOptions(swap=True)))
    assert _padded(build_pdg(ctx, bounds, CompileOptions(swap=False)))
