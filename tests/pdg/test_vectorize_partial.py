"""The PDG optimisation passes — ``vectorize_partial`` (t on the nodes outside recurrences),
``contract`` (summed outer products as one matmul), ``scan_lift`` (linear recurrences as one
scan), ``cse`` and ``simplify`` — give the same
values with and without each, on random programs and both backends, and the compiled program
equals the reference evaluator on the optimised PDG."""

from __future__ import annotations

import numpy as np
import pytest
from random_programs import build, outputs

import timerl as trl
from timerl.backends import get_backend
from timerl.compile import CompileOptions, build_pdg
from timerl.pdg.ops import OpKind
from timerl.runtime.reference import reference_evaluate
from timerl.symbolic import TRUE

SEEDS = range(12)


def _close(a: list, b: list, tol: float) -> None:
    assert [(r[0], r[1]) for r in a] == [(r[0], r[1]) for r in b]
    for x, y in zip(a, b, strict=True):
        np.testing.assert_allclose(x[2], y[2], rtol=tol, atol=tol, err_msg=f"sink {x[0]} at {x[1]}")


PASSES = ("simplify", "broadcast", "cse", "contract", "scan_lift", "vectorize_time")
ALONE_ON_JAX = frozenset({0, 1, 2, 3, 6, 7})  # the programs whose passes alone run on JAX


@pytest.mark.parametrize("backend", ["torch", "jax"])
@pytest.mark.parametrize("seed", SEEDS)
def test_same_values_with_and_without(backend: str, seed: int) -> None:
    """All passes together against all of them off, on both backends; every pass alone on
    one backend per program (each backend sees every pass alone on half of the programs,
    batched and not; the largest programs, 10 and 11, on torch, where their unvectorized
    loops run 5x faster than JAX's per-point compiles)."""
    batch = seed % 2 == 1
    off = {p: False for p in PASSES}
    base = outputs(seed, batch, backend, **off)
    assert base
    if backend == ("jax" if seed in ALONE_ON_JAX else "torch"):
        for p in PASSES:
            _close(outputs(seed, batch, backend, **{**off, p: True}), base, 1e-5)
    _close(outputs(seed, batch, backend), base, 1e-5)


@pytest.mark.parametrize("backend", ["torch", "jax"])
@pytest.mark.parametrize("seed", [0, 3, 7])
def test_reference_evaluator_on_the_vectorized_pdg(backend: str, seed: int) -> None:
    compiled = outputs(seed, True, backend)
    ctx, bounds, out = build(seed, True)
    pdg = build_pdg(ctx, bounds, CompileOptions())
    reference_evaluate(pdg, get_backend(backend))
    _close(sorted(out, key=lambda r: (r[0], r[1])), compiled, 1e-5)


def test_recurrence_stays_and_the_rest_is_vectorized() -> None:
    """x[t + 1] = f(x[t]) keeps t; a loss and its gradient over x do not."""
    ctx = trl.Context(dims=("i", "t"))
    with ctx as ((i, I), (t, T)):
        w = trl.param(np.ones(2, np.float32), domain=(i,), name="w")
        x = trl.empty((2,), domain=(i, t), name="x")
        x[i, 0] = w * 1.0
        x[i, t + 1] = x * 0.5
        y = (x * w).tanh()
        y.sum().backward()
        w[i + 1] = w - 0.1 * w.grad
    pdg = build_pdg(ctx, {I: 2, T: 4}, CompileOptions())
    by_name = {n.name: n for n in pdg if n.name}
    t_sym = next(s for s, _ in pdg.dims if s.name == "t")
    assert t_sym in by_name["x"].domain  # the recurrence
    tanh = [n for n in pdg if n.op.kind is OpKind.TANH]
    assert tanh and all(t_sym not in n.domain and n.batch == (4,) for n in tanh)


def test_outer_product_sum_becomes_one_matmul() -> None:
    ctx = trl.Context(dims=("b", "t"))
    with ctx as ((b, B), (t, T)):
        w = trl.param(np.ones((4, 3), np.float32), name="w")
        x = trl.rand((4,), domain=(b, t))
        (x @ w).sum().backward()
        w.grad.sink(lambda v, p: None)
    on = build_pdg(ctx, {B: 5, T: 3}, CompileOptions(vectorize_time=False))
    off = build_pdg(ctx, {B: 5, T: 3}, CompileOptions(vectorize_time=False, contract=False))
    assert _outer_products(off)  # without the pass: a (4, 3) outer product per point
    assert not _outer_products(on)


@pytest.mark.parametrize("seed", SEEDS)
def test_random_programs_do_get_vectorized(seed: int) -> None:
    """The differential test above is not vacuous: every program has nodes vectorized over t
    and keeps its recurrence per point."""
    ctx, bounds, _ = build(seed, True)
    pdg = build_pdg(ctx, bounds, CompileOptions())
    vec = [n for n in pdg if any(s.name == "t" for s in n.batch_dims)]
    per_t = [n for n in pdg if any(s.name == "t" for s in n.domain)]
    assert vec and per_t


def test_cse_and_simplify_remove_duplicates_and_copies() -> None:
    """Two equal expressions become one; a detach (a copy) and a product with one are bypassed."""
    out: list = []
    ctx = trl.Context(dims=("t",))
    with ctx as ((t, T),):
        x = trl.rand((3,), domain=(t,))
        a = (x * 2.0).tanh()
        b = (x * 2.0).tanh()
        ((a + b).detach() * 1.0).sink(lambda v, p: out.append(v))
    kinds = {}
    for opts in ({"cse": False, "simplify": False}, {}):
        pdg = build_pdg(ctx, {T: 3}, CompileOptions(**opts, vectorize_time=False))
        kinds[bool(opts)] = [n.op.kind for n in pdg]
    off, on = kinds[True], kinds[False]
    assert off.count(OpKind.TANH) == 2 and on.count(OpKind.TANH) == 1
    assert OpKind.IDENTITY in off and OpKind.IDENTITY not in on
    assert off.count(OpKind.MUL) == 3 and on.count(OpKind.MUL) == 1


def test_linear_recurrences_are_lifted() -> None:
    """Both directions of ``y = x + c * y[t -/+ 1]`` become one LINEAR_SCAN each, and the
    recurrence's row reads become views (no node over t is left)."""
    ctx = trl.Context(dims=("i", "t"))
    with ctx as ((i, I), (t, T)):
        x = trl.rand((2,), domain=(i, t))
        back = trl.empty((2,), domain=(i, t), name="back")
        back[i, T - 1] = x[i, T - 1]
        back[i, t] = x + (x * 0.9) * back[i, t + 1]
        fwd = trl.empty((2,), domain=(i, t), name="fwd")
        fwd[i, 0] = x[i, 0]
        fwd[i, t] = x + (x * 0.5) * fwd[i, t - 1]
        (back + fwd)[i, 0:T].sum(0).sink(lambda v, p: None)
    pdg = build_pdg(ctx, {I: 2, T: 5}, CompileOptions())
    scans = [n for n in pdg if n.op.kind is OpKind.LINEAR_SCAN]
    assert sorted(n.op.attr("reverse") for n in scans) == [False, True]
    t_sym = next(s for s, _ in pdg.dims if s.name == "t")
    over_t = [n for n in pdg if t_sym in n.domain]
    # left per step: the draw, and the coefficients restricted to where their branch is
    # taken (restrict_to_demand: t + 1 < T, t > 0), which vectorize_time keeps per point
    assert OpKind.MERGE not in [n.op.kind for n in over_t]
    assert all(
        n.op.kind is OpKind.RAND_UNIFORM or (n.op.kind is OpKind.MUL and n.cond is not TRUE) for n in over_t
    )


@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_contraction_folds_the_sum_over_envs(backend: str) -> None:
    """A weight gradient summed over t per env, then over envs, over iterations i: without
    ``contract`` an outer product per point; with it one matmul of (4, B * T) by (B * T, 3) per
    iteration (no per-env matmul left), and the same values, also on the reference evaluator."""
    outs = {}
    bounds_of = {}
    for contract in (False, True):
        got: list = []
        ctx = trl.Context(dims=("b", "i", "t"))
        with ctx as ((b, B), (i, I), (t, T)):
            w = trl.param(np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3), domain=(i,), name="w")
            x = trl.rand((4,), domain=(b, i, t))
            (x @ w).tanh().sum().backward()
            w.grad.sink(lambda v, p, got=got: got.append(v.copy()))
            w[i + 1] = w - 0.5 * w.grad
        bounds_of = {B: 5, I: 2, T: 3}
        pdg = build_pdg(ctx, bounds_of, CompileOptions(contract=contract))
        assert bool(_outer_products(pdg)) != contract
        if contract:
            shapes = [
                [tuple(pdg.nodes[e.src].outputs[e.oid].shape) for e in pdg.data_in_edges(n.id)]
                for n in pdg
                if n.op.kind is OpKind.MATMUL and not n.batch
            ]
            assert shapes == [[(4, 15), (15, 3)]], shapes
            assert not [
                n for n in pdg if n.op.kind is OpKind.MATMUL and n.batch and n.outputs[0].shape == (4, 3)
            ]
            reference_evaluate(pdg, get_backend(backend))
            outs["reference"] = np.stack(got)
            got.clear()
        ctx.compile(bounds_of, backend=backend, contract=contract).execute()
        outs[contract] = np.stack(got)
    assert outs[True].shape == (2, 4, 3)
    # the second iteration's gradients (~1e-4) come from weights of magnitude ~3 after an
    # update of magnitude ~6: float32 rounding of those (~1e-6 absolute) bounds the atol
    np.testing.assert_allclose(outs[True], outs[False], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(outs["reference"], outs[False], rtol=1e-5, atol=1e-5)


def _outer_products(pdg) -> list:
    """Matmuls of a (4, 1) column by a (1, 3) row: an outer product per point."""
    return [
        n
        for n in pdg
        if n.op.kind is OpKind.MATMUL
        and [tuple(pdg.nodes[e.src].outputs[e.oid].shape) for e in pdg.data_in_edges(n.id)]
        == [(4, 1), (1, 3)]
    ]


@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_random_draws_vectorized_keep_their_per_point_values(backend: str) -> None:
    """A uniform and a normal draw over (b, i, t) (b batched by the env vectorization, t by
    ``vectorize_time``) become one call per i whose rows are the per-point draws: the same
    values as with the pass off, and as the reference evaluator."""

    def run(**options: bool) -> tuple[dict, object]:
        seen: dict = {}
        ctx = trl.Context(dims=("b", "i", "t"))
        with ctx as ((b, B), (i, I), (t, T)):
            u = trl.rand((3,), domain=(b, i, t), name="u")
            z = trl.rand((), domain=(i, t), normal=True, name="z")
            y = u.sum() * 2.0 + z
            y[0:B, i, 0:T].sink(lambda v, p: seen.__setitem__(p["i"], np.array(v)))
        ex = ctx.compile({B: 4, I: 2, T: 5}, backend=backend, **options)
        ex.execute()
        return seen, ex

    on, ex = run()
    off, _ = run(vectorize_time=False)
    rand_nodes = [n for n in ex.pdg if n.op.kind in (OpKind.RAND_UNIFORM, OpKind.RAND_NORMAL)]
    assert len(rand_nodes) == 2 and all(n.op.attr("point_dims", ()) for n in rand_nodes)
    assert all(n.batch[-1] == 5 for n in rand_nodes) and sorted(on) == sorted(off) == [0, 1]
    for k in on:
        assert on[k].shape == (4, 5)
        np.testing.assert_array_equal(on[k], off[k])
    assert not np.array_equal(on[0], on[1])
    ref: dict = {}
    ctx = trl.Context(dims=("b", "i", "t"))
    with ctx as ((b, B), (i, I), (t, T)):
        u = trl.rand((3,), domain=(b, i, t), name="u")
        z = trl.rand((), domain=(i, t), normal=True, name="z")
        (u.sum() * 2.0 + z)[0:B, i, 0:T].sink(lambda v, p: ref.__setitem__(p["i"], np.array(v)))
    reference_evaluate(build_pdg(ctx, {B: 4, I: 2, T: 5}, CompileOptions()), get_backend(backend))
    for k in on:
        np.testing.assert_allclose(ref[k], on[k], rtol=1e-6)


@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_a_read_of_all_rows_behind_another_slice(backend: str) -> None:
    """The gradient of ``x[min(i + 1, I - 1), max(t - 1, 0)]`` (``x`` a recurrence over t)
    reads all of its incoming gradient, ``g[0:I, 0:T]``, in a node over (i, t): with ``g``
    vectorized over t, the slice of t, which becomes the first stacked dim, is not the first
    slice of the read. ``g`` stays per point (it made an (I, T, 2) IDENTITY receive
    (T, I, 2): PDGError, fuzz seed 517300100), and ``w.grad`` is the same as with the pass off."""

    def run(**options: bool) -> list:
        got: list = []
        ctx = trl.Context(dims=("i", "t"))
        with ctx as ((i, I), (t, T)):
            w = trl.param(np.array([0.3, -0.2], np.float32), name="w")
            x = trl.empty((2,), domain=(i, t), name="x")
            x[i, T - 1] = w * 1.0
            x[i, t] = x[i, t + 1] * 0.5 + w
            y = x[trl.min(i + 1, I - 1), trl.max(t - 1, 0)]
            (y * w * (trl.as_tensor(t).cast(trl.float32) + 1.0)).sum().backward()
            w.grad.sink(lambda v, p: got.append(np.array(v)))
        ctx.compile({I: 2, T: 4}, backend=backend, **options).execute()
        return got

    on, off = run(), run(vectorize_time=False)
    assert len(on) == len(off) == 1
    np.testing.assert_allclose(on[0], off[0], rtol=1e-6)
