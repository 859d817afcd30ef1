"""Matrix products computed another way for shapes a backend's own kernel runs slowly on a CPU
(``jax_backend._matmul`` / ``_matmul_tn``, ``torch_backend._matmul``): the same values as
NumPy, whether the other way is taken or not, and in a program (the weight gradients of
policy and value heads, ``contract``'s ``X^T @ Y`` over many rows) the same parameters as
the reference evaluator and as op-by-op execution, with the transposed-left path traced."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import timerl as trl
from timerl.backends import get_backend, jax_backend
from timerl.compile import CompileOptions, build_pdg
from timerl.pdg.ops import Op, OpKind
from timerl.runtime.reference import reference_evaluate

RNG = np.random.default_rng(7)


def _f32(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def _close(out: object, a: np.ndarray, b: np.ndarray) -> None:
    want = np.matmul(a.astype(np.float64), b.astype(np.float64))
    np.testing.assert_allclose(np.asarray(out), want, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ((5000, 4), (4, 64)),  # few contracted columns, many rows: multiply-adds
        ((3, 2000, 2), (2, 8)),  # the same with a batch of three
        ((5000, 1), (1, 16)),
        ((100, 4), (4, 64)),  # few rows: XLA's dot
        ((5000, 16), (16, 4)),  # 16 contracted columns: XLA's dot
    ],
)
def test_jax_products_with_few_contracted_columns(a: tuple[int, ...], b: tuple[int, ...]) -> None:
    x, y = _f32(*a), _f32(*b)
    _close(jax.jit(jax_backend._matmul)(x, y), x, y)
    _close(jax_backend._matmul(jnp.asarray(x), jnp.asarray(y)), x, y)


@pytest.mark.parametrize(
    ("rows", "m", "n"),
    [(3000, 64, 1), (3000, 64, 2), (1500, 64, 4), (3000, 256, 2), (3000, 256, 4), (500, 64, 2), (3000, 8, 8)],
)
def test_jax_transposed_left_products(rows: int, m: int, n: int) -> None:
    """``X^T @ Y`` with ``X`` row-major ``(rows, m)``: column sums when traced (rows >= 1,024,
    n <= 4, m * n <= 512), XLA's dot otherwise and for a materialised transpose."""
    x, y = _f32(rows, m), _f32(rows, n)
    _close(jax.jit(lambda x, y: jax_backend._matmul_tn(x.T, y))(x, y), x.T, y)
    _close(jax_backend._matmul_tn(jnp.asarray(x).T, jnp.asarray(y)), x.T, y)
    batched = _f32(2, rows, m)
    got = jax.jit(lambda x, y: jax_backend._matmul_tn(jnp.swapaxes(x, -1, -2), y))(batched, y)
    _close(got, np.swapaxes(batched, -1, -2), y)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ((64, 3000), (3000, 2)),
        ((600, 64), (64, 3)),
        ((2, 600, 64), (64, 8)),
        ((600, 64), (64, 16)),
        ((8, 64), (64, 2)),
    ],
)
def test_torch_products_with_few_output_columns(a: tuple[int, ...], b: tuple[int, ...]) -> None:
    be = get_backend("torch")
    x, y = _f32(*a), _f32(*b)
    out = be.run(Op.make(OpKind.MATMUL), [be.from_numpy(x), be.from_numpy(y)], (), [False] * 2, {})
    _close(be.to_numpy(out), x, y)


def _heads_program(out: list):
    """A 4-feature input over ``B * T = 4,400`` rows (a stacked rollout), a tanh layer and
    policy (2 columns) and value (1 column) heads trained by SGD: the weight gradients
    contract the rows (``X^T @ G``), the backward products have 1-2 contracted columns."""
    ctx = trl.Context(dims=("b", "i", "t"))
    rng = np.random.default_rng(3)
    with ctx as ((b, B), (i, I), (t, T)):
        w1 = trl.param(rng.normal(0, 0.5, (4, 16)).astype(np.float32), domain=(i,), name="w1")
        wp = trl.param(rng.normal(0, 0.5, (16, 2)).astype(np.float32), domain=(i,), name="wp")
        wv = trl.param(rng.normal(0, 0.5, (16, 1)).astype(np.float32), domain=(i,), name="wv")
        o = trl.const(rng.normal(0, 1, (4, 1100, 4)).astype(np.float32))[b, t] + trl.as_tensor(i) * 0.01
        h = (o @ w1).tanh()
        loss = ((h @ wp).tanh() ** 2).sum() + ((h @ wv) ** 2).sum()
        loss.backward()
        trl.optim.SGD([w1, wp, wv], lr=1e-4).step()
        for name, w in (("w1", w1), ("wp", wp), ("wv", wv)):
            w.sink(lambda v, p, name=name: out.append((name, p["i"], np.array(v))))
    return ctx, {B: 4, I: 2, T: 1100}, out


def _params(backend: str, reference: bool = False, **options: object) -> dict:
    out: list = []
    ctx, bounds, _ = _heads_program(out)
    if reference:
        reference_evaluate(build_pdg(ctx, bounds, CompileOptions()), get_backend(backend))
    else:
        ctx.compile(bounds, backend=backend, **options).execute()
    return {(name, i): v for name, i, v in out}


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_head_gradients_over_many_rows_match_the_reference(
    backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    traced: list[tuple[int, ...]] = []
    real = jax_backend._matmul_tn

    def spy(a, b):
        traced.append(tuple(a.shape))
        return real(a, b)

    monkeypatch.setattr(jax_backend, "_matmul_tn", spy)
    fused = _params(backend)
    assert len(fused) == 6
    for other in (_params(backend, fuse=False), _params(backend, reference=True)):
        assert other.keys() == fused.keys()
        for k, v in fused.items():
            np.testing.assert_allclose(v, other[k], rtol=2e-4, atol=2e-5, err_msg=str(k))
    if backend == "jax":  # the heads' weight gradients contract >= 1,100 rows in a compiled region
        assert any(s[-1] >= 1100 for s in traced), traced


@pytest.mark.parametrize("backend", ["jax", "torch"])
@pytest.mark.parametrize(
    ("a", "b"),
    [
        ((4, 16, 6, 1, 8), (1, 16, 1, 8, 8)),  # a per-point row times one matrix per agent
        ((4, 1, 6, 3, 8), (1, 5, 1, 8, 2)),  # each side varies along its own batch dims
        ((1, 16, 1, 2, 8), (4, 16, 6, 8, 8)),
        ((4, 16, 6, 1, 8), (4, 16, 6, 8, 8)),  # the same batch: a plain batched product
    ],
)
def test_products_with_partly_broadcast_batches(backend: str, a: tuple[int, ...], b: tuple[int, ...]) -> None:
    """The operands of a product batched over (b, s, t) whose weights vary over s alone reach
    the kernel with size-1 batch dims (``plan/layout``'s expand step for a ``MATMUL``)."""
    be = get_backend(backend)
    x, y = _f32(*a), _f32(*b)
    batch = tuple(max(p, q) for p, q in zip(a[:3], b[:3], strict=True))
    out = be.run(Op.make(OpKind.MATMUL), [be.from_numpy(x), be.from_numpy(y)], batch, [True, True], {})
    assert tuple(out.shape) == batch + (a[-2], b[-1])
    _close(be.to_numpy(out), x, y)
