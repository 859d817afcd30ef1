"""Differential tests of every backend kernel against a NumPy per-point reference.

Each case is run (a) unbatched against the NumPy reference and (b) with batch dims, for
mixes of batched and unbatched inputs, against a Python loop over the batch indices that
calls the per-point reference.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from timerl.backends import AbstractBackend, get_backend
from timerl.errors import BackendError
from timerl.pdg.ops import DType, Op, OpKind
from timerl.symbolic import Sym

BACKENDS = ["jax", "torch"]
T = Sym("t")
N = Sym("N", is_bound=True)


# ---------------------------------------------------------------------------------------
# NumPy per-point reference
# ---------------------------------------------------------------------------------------


def _ev(v: Any, env: dict[Sym, int]) -> int:
    from timerl.symbolic import Expr, evaluate

    return int(evaluate(v, env)) if isinstance(v, Expr) else int(v)


def _acc(x: np.ndarray) -> Any:
    return x.dtype if x.dtype.kind == "f" else np.int64


def _log_softmax(x: np.ndarray, a: int) -> np.ndarray:
    m = x.max(axis=a, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=a, keepdims=True))


def _gather(x: np.ndarray, idx: np.ndarray) -> np.ndarray:
    lead = np.broadcast_shapes(x.shape[:-1], idx.shape)
    xb = np.broadcast_to(x, lead + x.shape[-1:])
    ib = np.broadcast_to(idx, lead)
    return np.take_along_axis(xb, ib[..., None], -1)[..., 0]


def _index_add(g: np.ndarray, idx: np.ndarray, n: int) -> np.ndarray:
    out = np.zeros((n,) + g.shape[1:], g.dtype)
    np.add.at(out, idx, g)
    return out


def _pad_slice(op: Op, x: np.ndarray, env: dict[Sym, int]) -> np.ndarray:
    d, start, size = op.attr("dim"), _ev(op.attr("start"), env), _ev(op.attr("size"), env)
    shape = list(x.shape)
    shape[d] = size
    out = np.zeros(shape, x.dtype)
    out[(slice(None),) * d + (slice(start, start + x.shape[d]),)] = x
    return out


def _discount_weights(op: Op, g: np.ndarray, x: np.ndarray) -> np.ndarray:
    w = op.attr("gamma") ** np.arange(x.shape[0], dtype=np.float64)
    out = w.reshape((-1,) + (1,) * g.ndim) * g[None].astype(np.float64)
    return np.broadcast_to(out, x.shape).astype(g.dtype)


def _suffix_sum(op: Op, x: np.ndarray) -> np.ndarray:
    out = np.zeros_like(x)
    y = np.zeros_like(x[0])
    for k in range(x.shape[0] - 1, -1, -1):
        y = x[k] + op.attr("gamma") * y
        out[k] = y
    return out


def _linear_scan(op: Op, x: np.ndarray, c: np.ndarray, y0: np.ndarray) -> np.ndarray:
    m = x.shape[0]
    out = np.empty((m + 1,) + x.shape[1:], dtype=x.dtype)
    y = y0
    if op.attr("reverse"):
        out[m] = y
        for k in range(m - 1, -1, -1):
            y = x[k] + c[k] * y
            out[k] = y
    else:
        out[0] = y
        for k in range(m):
            y = x[k] + c[k] * y
            out[k + 1] = y
    return out


def _discounted_sum(op: Op, x: np.ndarray) -> np.ndarray:
    w = op.attr("gamma") ** np.arange(x.shape[0], dtype=np.float64)
    return np.tensordot(w, x.astype(np.float64), axes=(0, 0)).astype(x.dtype)


Ref = Callable[[Op, Sequence[np.ndarray], dict[Sym, int]], np.ndarray]

REF: dict[OpKind, Ref] = {
    OpKind.CONST: lambda op, xs, env: np.asarray(op.attr("value")),
    OpKind.NEG: lambda op, xs, env: -xs[0],
    OpKind.EXP: lambda op, xs, env: np.exp(xs[0]),
    OpKind.LOG: lambda op, xs, env: np.log(xs[0]),
    OpKind.SQRT: lambda op, xs, env: np.sqrt(xs[0]),
    OpKind.TANH: lambda op, xs, env: np.tanh(xs[0]),
    OpKind.ABS: lambda op, xs, env: np.abs(xs[0]),
    OpKind.RELU: lambda op, xs, env: np.maximum(xs[0], 0),
    OpKind.SIGMOID: lambda op, xs, env: 1 / (1 + np.exp(-xs[0])),
    OpKind.SIGN: lambda op, xs, env: np.sign(xs[0]),
    OpKind.LOGICAL_NOT: lambda op, xs, env: np.logical_not(xs[0]),
    OpKind.CAST: lambda op, xs, env: xs[0].astype(op.attr("dtype").numpy),
    OpKind.IDENTITY: lambda op, xs, env: xs[0],
    OpKind.ADD: lambda op, xs, env: xs[0] + xs[1],
    OpKind.SUB: lambda op, xs, env: xs[0] - xs[1],
    OpKind.MUL: lambda op, xs, env: xs[0] * xs[1],
    OpKind.DIV: lambda op, xs, env: xs[0] / xs[1],
    OpKind.POW: lambda op, xs, env: np.power(xs[0], xs[1]),
    OpKind.TANH_GRAD: lambda op, xs, env: xs[0] * (1 - xs[1] * xs[1]),
    OpKind.MAXIMUM: lambda op, xs, env: np.maximum(xs[0], xs[1]),
    OpKind.MINIMUM: lambda op, xs, env: np.minimum(xs[0], xs[1]),
    OpKind.LT: lambda op, xs, env: xs[0] < xs[1],
    OpKind.LE: lambda op, xs, env: xs[0] <= xs[1],
    OpKind.GT: lambda op, xs, env: xs[0] > xs[1],
    OpKind.GE: lambda op, xs, env: xs[0] >= xs[1],
    OpKind.EQ: lambda op, xs, env: xs[0] == xs[1],
    OpKind.NE: lambda op, xs, env: xs[0] != xs[1],
    OpKind.LOGICAL_AND: lambda op, xs, env: np.logical_and(xs[0], xs[1]),
    OpKind.LOGICAL_OR: lambda op, xs, env: np.logical_or(xs[0], xs[1]),
    OpKind.WHERE: lambda op, xs, env: np.where(xs[0], xs[1], xs[2]),
    OpKind.SUM: lambda op, xs, env: np.sum(
        xs[0], axis=tuple(op.attr("dims")), keepdims=op.attr("keepdim"), dtype=_acc(xs[0])
    ),
    OpKind.MAX: lambda op, xs, env: np.max(xs[0], axis=tuple(op.attr("dims")), keepdims=op.attr("keepdim")),
    OpKind.MIN: lambda op, xs, env: np.min(xs[0], axis=tuple(op.attr("dims")), keepdims=op.attr("keepdim")),
    OpKind.ARGMAX: lambda op, xs, env: np.argmax(xs[0], axis=op.attr("dim")).astype(np.int64),
    OpKind.CUMSUM: lambda op, xs, env: np.cumsum(xs[0], axis=op.attr("dim"), dtype=_acc(xs[0])),
    OpKind.DISCOUNTED_SUM: lambda op, xs, env: _discounted_sum(op, xs[0]),
    OpKind.DISCOUNT_WEIGHTS: lambda op, xs, env: _discount_weights(op, xs[0], xs[1]),
    OpKind.LINEAR_SCAN: lambda op, xs, env: _linear_scan(op, *xs),
    OpKind.SUFFIX_SUM: lambda op, xs, env: _suffix_sum(op, xs[0]),
    OpKind.LOG_SOFTMAX: lambda op, xs, env: _log_softmax(xs[0], op.attr("dim")),
    OpKind.SOFTMAX: lambda op, xs, env: np.exp(_log_softmax(xs[0], op.attr("dim"))),
    OpKind.RESHAPE: lambda op, xs, env: xs[0].reshape(tuple(_ev(s, env) for s in op.attr("shape"))),
    OpKind.PERMUTE: lambda op, xs, env: np.transpose(xs[0], op.attr("dims")),
    OpKind.EXPAND: lambda op, xs, env: np.broadcast_to(xs[0], tuple(_ev(s, env) for s in op.attr("shape"))),
    OpKind.SQUEEZE: lambda op, xs, env: np.squeeze(xs[0], op.attr("dim")),
    OpKind.UNSQUEEZE: lambda op, xs, env: np.expand_dims(xs[0], op.attr("dim")),
    OpKind.CAT: lambda op, xs, env: np.concatenate(xs, axis=op.attr("dim")),
    OpKind.STACK: lambda op, xs, env: np.stack(xs, axis=op.attr("dim")),
    OpKind.SLICE: lambda op, xs, env: xs[0][
        (slice(None),) * op.attr("dim") + (slice(_ev(op.attr("start"), env), _ev(op.attr("stop"), env)),)
    ],
    OpKind.PAD_SLICE: lambda op, xs, env: _pad_slice(op, xs[0], env),
    OpKind.INDEX: lambda op, xs, env: xs[0][(slice(None),) * op.attr("dim") + (_ev(op.attr("index"), env),)],
    OpKind.GATHER: lambda op, xs, env: _gather(xs[0], xs[1]),
    OpKind.ONE_HOT: lambda op, xs, env: np.eye(op.attr("num_classes"), dtype=op.attr("dtype").numpy)[xs[0]],
    OpKind.TAKE: lambda op, xs, env: xs[0][xs[1]],
    OpKind.INDEX_ADD: lambda op, xs, env: _index_add(xs[0], xs[1], op.attr("size")),
    OpKind.ARGSORT: lambda op, xs, env: np.argsort(xs[0], axis=op.attr("dim"), kind="stable"),
    OpKind.MATMUL: lambda op, xs, env: np.matmul(xs[0], xs[1]),
}


# ---------------------------------------------------------------------------------------
# Cases
# ---------------------------------------------------------------------------------------


@dataclass
class Case:
    """An op and the per-point shapes/kinds of its inputs.

    Input kinds: ``f`` float32 normal, ``p`` positive float32, ``d`` float64, ``b`` bool,
    ``i<n>`` int64 in ``[0, n)``, ``j<n>`` int32 in ``[0, n)``.
    """

    name: str
    op: Op
    inputs: list[tuple[tuple[int, ...], str]]
    env: dict[Sym, int] = field(default_factory=dict)


def _make(rng: np.random.Generator, shape: tuple[int, ...], kind: str) -> np.ndarray:
    if kind == "f":
        return rng.standard_normal(shape).astype(np.float32)
    if kind == "p":
        return rng.uniform(0.5, 2.0, shape).astype(np.float32)
    if kind == "d":
        return rng.standard_normal(shape)
    if kind == "b":
        return rng.random(shape) < 0.5
    if kind[0] in "ij":
        dt = np.int64 if kind[0] == "i" else np.int32
        return rng.integers(0, int(kind[1:]), shape).astype(dt)
    raise AssertionError(kind)


M = Op.make
F34, F4, F0 = ((3, 4), "f"), ((4,), "f"), ((), "f")

CASES: list[Case] = [
    Case("const", M(OpKind.CONST, value=np.arange(6, dtype=np.float32).reshape(2, 3)), []),
    *(Case(k.name.lower(), M(k), [F34]) for k in (OpKind.NEG, OpKind.EXP, OpKind.TANH, OpKind.ABS)),
    *(Case(k.name.lower(), M(k), [F34]) for k in (OpKind.RELU, OpKind.SIGMOID, OpKind.SIGN, OpKind.IDENTITY)),
    Case("log", M(OpKind.LOG), [((3, 4), "p")]),
    Case("sqrt", M(OpKind.SQRT), [((3, 4), "p")]),
    Case("logical_not", M(OpKind.LOGICAL_NOT), [((3,), "b")]),
    Case("cast_f32_i32", M(OpKind.CAST, dtype=DType.int32), [F34]),
    Case("cast_i64_f32", M(OpKind.CAST, dtype=DType.float32), [((4,), "i9")]),
    Case("cast_f32_f64", M(OpKind.CAST, dtype=DType.float64), [F4]),
    Case("cast_f_bool", M(OpKind.CAST, dtype=DType.bool_), [((4,), "i2")]),
    *(
        Case(f"{k.name.lower()}_{i}", M(k), shapes)
        for k in (OpKind.ADD, OpKind.SUB, OpKind.MUL, OpKind.MAXIMUM, OpKind.MINIMUM)
        for i, shapes in enumerate([[F34, F4], [F0, ((2, 3), "f")], [F4, F34]])
    ),
    Case("add_f64", M(OpKind.ADD), [((3,), "d"), ((3,), "d")]),
    Case("add_i32", M(OpKind.ADD), [((3,), "j5"), ((3,), "j5")]),
    Case("div", M(OpKind.DIV), [F34, ((4,), "p")]),
    Case("pow", M(OpKind.POW), [((3, 4), "p"), F4]),
    Case("tanh_grad", M(OpKind.TANH_GRAD), [F34, F34]),
    Case("tanh_grad_bcast", M(OpKind.TANH_GRAD), [F34, F4]),
    *(
        Case(k.name.lower(), M(k), [F34, F4])
        for k in (OpKind.LT, OpKind.LE, OpKind.GT, OpKind.GE, OpKind.EQ, OpKind.NE)
    ),
    Case("eq_int", M(OpKind.EQ), [((5,), "i3"), ((), "i3")]),
    Case("logical_and", M(OpKind.LOGICAL_AND), [((3, 4), "b"), ((4,), "b")]),
    Case("logical_or", M(OpKind.LOGICAL_OR), [((4,), "b"), ((3, 4), "b")]),
    Case("where", M(OpKind.WHERE), [((3, 4), "b"), F4, F0]),
    Case("where_2", M(OpKind.WHERE), [((4,), "b"), ((2, 1, 4), "f"), ((3, 1), "f")]),
    Case("sum_0", M(OpKind.SUM, dims=(0,), keepdim=False), [F34]),
    Case("sum_02_keep", M(OpKind.SUM, dims=(0, 2), keepdim=True), [((2, 3, 4), "f")]),
    Case("sum_none", M(OpKind.SUM, dims=(), keepdim=False), [F34]),
    Case("sum_i32", M(OpKind.SUM, dims=(1,), keepdim=False), [((3, 4), "j7")]),
    Case("sum_bool", M(OpKind.SUM, dims=(0,), keepdim=False), [((5,), "b")]),
    Case("max", M(OpKind.MAX, dims=(1,), keepdim=False), [F34]),
    Case("min_keep", M(OpKind.MIN, dims=(0, 1), keepdim=True), [F34]),
    Case("argmax", M(OpKind.ARGMAX, dim=1), [F34]),
    Case("argmax_0", M(OpKind.ARGMAX, dim=0), [F4]),
    Case("cumsum", M(OpKind.CUMSUM, dim=0), [F34]),
    Case("cumsum_i32", M(OpKind.CUMSUM, dim=1), [((3, 4), "j5")]),
    Case("discounted_sum", M(OpKind.DISCOUNTED_SUM, gamma=0.9), [((5,), "f")]),
    Case("linear_scan_rev", M(OpKind.LINEAR_SCAN, reverse=True), [((6, 2), "f"), ((6, 2), "f"), ((2,), "f")]),
    Case("linear_scan_fwd", M(OpKind.LINEAR_SCAN, reverse=False), [((5,), "f"), ((5,), "f"), ((), "f")]),
    Case("suffix_sum", M(OpKind.SUFFIX_SUM, gamma=0.9), [((7,), "f")]),
    Case("suffix_sum_2d", M(OpKind.SUFFIX_SUM, gamma=0.5), [((8, 3), "f")]),
    Case("suffix_sum_1row", M(OpKind.SUFFIX_SUM, gamma=0.99), [((1, 2), "f")]),
    Case("suffix_sum_plain", M(OpKind.SUFFIX_SUM, gamma=1.0), [((5, 2), "f")]),
    Case("discounted_sum_2d", M(OpKind.DISCOUNTED_SUM, gamma=0.5), [((5, 3), "f")]),
    Case("discount_weights", M(OpKind.DISCOUNT_WEIGHTS, gamma=0.9), [((3,), "f"), ((5, 3), "f")]),
    Case("discount_weights_0d", M(OpKind.DISCOUNT_WEIGHTS, gamma=0.9), [F0, ((5,), "f")]),
    Case("log_softmax", M(OpKind.LOG_SOFTMAX, dim=1), [F34]),
    Case("softmax", M(OpKind.SOFTMAX, dim=0), [F34]),
    Case("reshape", M(OpKind.RESHAPE, shape=(4, 3)), [F34]),
    Case("reshape_neg", M(OpKind.RESHAPE, shape=(-1,)), [((2, 3, 2), "f")]),
    Case("reshape_sym", M(OpKind.RESHAPE, shape=(N, 2)), [F34], {N: 6}),
    Case("permute", M(OpKind.PERMUTE, dims=(1, 2, 0)), [((2, 3, 4), "f")]),
    Case("expand", M(OpKind.EXPAND, shape=(2, 3, 4)), [((3, 1), "f")]),
    Case("expand_sym", M(OpKind.EXPAND, shape=(N, 4)), [F4], {N: 2}),
    Case("squeeze", M(OpKind.SQUEEZE, dim=1), [((3, 1, 4), "f")]),
    Case("unsqueeze", M(OpKind.UNSQUEEZE, dim=1), [F34]),
    Case("unsqueeze_end", M(OpKind.UNSQUEEZE, dim=2), [F34]),
    Case("cat", M(OpKind.CAT, dim=1), [((2, 3), "f"), ((2, 4), "f")]),
    Case("cat3", M(OpKind.CAT, dim=0), [((1, 3), "f"), ((2, 3), "f"), ((1, 3), "f")]),
    Case("stack", M(OpKind.STACK, dim=0), [((2, 3), "f")] * 3),
    Case("stack_last", M(OpKind.STACK, dim=2), [((2, 3), "f")] * 2),
    Case("slice", M(OpKind.SLICE, dim=1, start=T, stop=T + 2), [((3, 5), "f")], {T: 1}),
    Case("slice_0", M(OpKind.SLICE, dim=0, start=0, stop=T + 1), [((5,), "f")], {T: 3}),
    Case("pad_slice", M(OpKind.PAD_SLICE, dim=0, start=T, size=N), [((2, 3), "f")], {T: 1, N: 6}),
    Case("pad_slice_1", M(OpKind.PAD_SLICE, dim=1, start=0, size=4), [((2, 3), "f")]),
    Case("index", M(OpKind.INDEX, dim=1, index=T), [((3, 5), "f")], {T: 4}),
    Case("index_0", M(OpKind.INDEX, dim=0, index=T - 1), [((5,), "f")], {T: 1}),
    Case("gather", M(OpKind.GATHER), [((4, 5), "f"), ((4,), "i5")]),
    Case("gather_0d", M(OpKind.GATHER), [((5,), "f"), ((), "i5")]),
    Case("gather_bcast", M(OpKind.GATHER), [((2, 1, 5), "f"), ((3,), "j5")]),
    Case("take", M(OpKind.TAKE), [((5, 3), "f"), ((4,), "i5")]),
    Case("take_1d", M(OpKind.TAKE), [((5,), "f"), ((7,), "i5")]),
    Case("take_int", M(OpKind.TAKE), [((5, 2), "i5"), ((3,), "i5")]),
    Case("index_add", M(OpKind.INDEX_ADD, size=5), [((6, 3), "f"), ((6,), "i5")]),
    Case("index_add_1d", M(OpKind.INDEX_ADD, size=4), [((7,), "f"), ((7,), "i4")]),
    Case("argsort", M(OpKind.ARGSORT, dim=0), [((6,), "f")]),
    Case("argsort_last", M(OpKind.ARGSORT, dim=1), [((3, 5), "f")]),
    Case("one_hot", M(OpKind.ONE_HOT, num_classes=5, dtype=DType.float32), [((4,), "i5")]),
    Case("one_hot_0d", M(OpKind.ONE_HOT, num_classes=3, dtype=DType.int64), [((), "i3")]),
    *(
        Case(
            f"matmul_{'x'.join(map(str, a))}_{'x'.join(map(str, b))}", M(OpKind.MATMUL), [(a, "f"), (b, "f")]
        )
        for a, b in [
            ((3,), (3, 4)),
            ((2, 3), (3,)),
            ((3,), (3,)),
            ((2, 3), (3, 4)),
            ((5, 2, 3), (3, 4)),
            ((2, 3), (5, 3, 4)),
            ((6, 64), (64, 2)),  # few output columns, long inner dim: torch computes (b^T a^T)^T
        ]
    ),
]


def _check(out: np.ndarray, ref: np.ndarray, what: str) -> None:
    assert out.dtype == ref.dtype, f"{what}: dtype {out.dtype} != reference {ref.dtype}"
    assert out.shape == ref.shape, f"{what}: shape {out.shape} != reference {ref.shape}"
    if ref.dtype.kind == "f":
        tol = 1e-5 if ref.dtype == np.float32 else 1e-12
        np.testing.assert_allclose(out, ref, rtol=tol, atol=tol, err_msg=what)
    else:
        np.testing.assert_array_equal(out, ref, err_msg=what)


def _loop_ref(
    op: Op, xs: list[np.ndarray], batch: tuple[int, ...], batched: Sequence[bool], env: dict[Sym, int]
) -> np.ndarray:
    outs = [
        REF[op.kind](op, [x[idx] if b else x for x, b in zip(xs, batched, strict=True)], env)
        for idx in np.ndindex(*batch)
    ]
    return np.stack(outs).reshape(batch + outs[0].shape)


def _run(
    be: AbstractBackend,
    op: Op,
    xs: list[np.ndarray],
    batch: tuple[int, ...],
    batched: Sequence[bool],
    env: dict[Sym, int],
) -> np.ndarray:
    return be.to_numpy(be.run(op, [be.from_numpy(x) for x in xs], batch, batched, env))


def _batch_flags(n: int, batch: tuple[int, ...]) -> list[tuple[bool, ...]]:
    combos = list(itertools.product([False, True], repeat=n))
    if len(batch) > 1:  # fewer combos for the 2-d batch: all, none, and alternating
        combos = list(dict.fromkeys([(True,) * n, (False,) * n, tuple(k % 2 == 0 for k in range(n))]))
    return combos


@pytest.fixture(params=BACKENDS)
def be(request: pytest.FixtureRequest) -> AbstractBackend:
    return get_backend(request.param)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_kernel_matches_numpy(be: AbstractBackend, case: Case) -> None:
    """Unbatched vs NumPy; batched (3,) and (2, 3) vs a loop of per-point references."""
    rng = np.random.default_rng(0)
    pp = [_make(rng, s, k) for s, k in case.inputs]
    _check(
        _run(be, case.op, pp, (), [False] * len(pp), case.env),
        REF[case.op.kind](case.op, pp, case.env),
        "unbatched",
    )
    for batch in [(3,), (2, 3)]:
        for flags in _batch_flags(len(pp), batch):
            xs = [
                _make(rng, batch + s, k) if b else x
                for (s, k), b, x in zip(case.inputs, flags, pp, strict=True)
            ]
            ref = _loop_ref(case.op, xs, batch, flags, case.env)
            _check(_run(be, case.op, xs, batch, flags, case.env), ref, f"batch={batch} batched={flags}")


def test_every_kernel_is_covered() -> None:
    """Every OpKind except the runtime's own has a kernel in both backends and a test case."""
    runtime = {OpKind.MERGE, OpKind.SET_SYMBOL, OpKind.UDF, OpKind.SINK, OpKind.EVAL_SYMBOL}
    rand = {OpKind.RAND_UNIFORM, OpKind.RAND_NORMAL}
    expected = set(OpKind) - runtime
    for name in BACKENDS:
        assert set(type(get_backend(name)).kernels) == expected
    assert {c.op.kind for c in CASES} | rand == expected


# ---------------------------------------------------------------------------------------
# RNG
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", [OpKind.RAND_UNIFORM, OpKind.RAND_NORMAL])
def test_random_shapes_dtypes_and_seeding(be: AbstractBackend, kind: OpKind) -> None:
    op = M(kind, shape=(N, 2), dtype=DType.float32)
    env = {N: 4}
    be.seed(7)
    a = be.to_numpy(be.run(op, [], (), [], env))
    b = be.to_numpy(be.run(op, [], (3,), [], env))
    assert a.shape == (4, 2) and a.dtype == np.float32
    assert b.shape == (3, 4, 2) and b.dtype == np.float32
    assert not np.allclose(b[0], b[1])  # independent samples per batch index
    assert not np.allclose(a, b[0])  # the state advances between calls
    be.seed(7)
    np.testing.assert_array_equal(be.to_numpy(be.run(op, [], (), [], env)), a)
    np.testing.assert_array_equal(be.to_numpy(be.run(op, [], (3,), [], env)), b)
    big = be.to_numpy(be.run(M(kind, shape=(20000,), dtype=DType.float64), [], (), [], {}))
    assert big.dtype == np.float64
    if kind is OpKind.RAND_UNIFORM:
        assert big.min() >= 0 and big.max() < 1 and abs(big.mean() - 0.5) < 0.02
    else:
        assert abs(big.mean()) < 0.05 and abs(big.std() - 1) < 0.05


def test_random_needs_float_dtype(be: AbstractBackend) -> None:
    with pytest.raises(BackendError, match="float dtype"):
        be.run(M(OpKind.RAND_UNIFORM, shape=(2,), dtype=DType.int64), [], (), [], {})


# ---------------------------------------------------------------------------------------
# Layout helpers, conversion, errors
# ---------------------------------------------------------------------------------------


def test_layout_helpers(be: AbstractBackend) -> None:
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((2, 3)).astype(np.float32), rng.standard_normal((2, 3)).astype(np.float32)
    ta, tb = be.from_numpy(a), be.from_numpy(b)
    _check(be.to_numpy(be.stack([ta, tb], 1)), np.stack([a, b], 1), "stack")
    _check(be.to_numpy(be.concat([ta, tb], 0)), np.concatenate([a, b], 0), "concat")
    _check(be.to_numpy(be.take(ta, 1, 2)), a[:, 2], "take")
    _check(be.to_numpy(be.take(ta, 1, -1)), a[:, -1], "take -1")
    _check(be.to_numpy(be.take(ta, 0, 1)), a[1], "take axis 0")
    with pytest.raises((BackendError, IndexError)):
        be.take(ta, 1, 3)  # never a clamped read
    for dt in DType:
        _check(be.to_numpy(be.zeros((2, 1), dt)), np.zeros((2, 1), dt.numpy), f"zeros {dt}")
    _check(be.to_numpy(be.broadcast_batch(ta, (4,))), np.broadcast_to(a, (4, 2, 3)), "broadcast_batch")
    _check(be.to_numpy(be.broadcast_batch(ta, ())), a, "broadcast_batch ()")
    assert be.any_true(be.from_numpy(np.array([False, True]))) is True
    assert be.all_true(be.from_numpy(np.array([False, True]))) is False
    assert be.all_true(be.from_numpy(np.array([True, True]))) is True
    assert be.any_true(be.from_numpy(np.zeros((0,), bool))) is False
    assert be.nbytes(ta) == a.nbytes


@pytest.mark.parametrize("dtype", list(DType))
def test_numpy_round_trip_keeps_dtype(be: AbstractBackend, dtype: DType) -> None:
    a = np.arange(6).reshape(2, 3).astype(dtype.numpy)
    out = be.to_numpy(be.from_numpy(a))
    assert out.dtype == a.dtype
    np.testing.assert_array_equal(out, a)


def test_from_numpy_copy_is_taken_before_it_returns(be: AbstractBackend) -> None:
    """A write to the source right after the call must not reach the tensor. ``jnp.array(a,
    copy=True)`` copies large CPU arrays asynchronously: 50 of 300 such writes reached it
    (4 MB arrays), so 40 tries catch that with probability > 0.999."""
    for _ in range(40):
        a = np.zeros(1_000_000, np.float32)
        x = be.from_numpy(a)
        a[0] = 1.0
        assert be.to_numpy(x)[0] == 0.0


@pytest.mark.parametrize("n", [3, 70_000])  # JAX copies small and large arrays differently
def test_from_numpy_copies(be: AbstractBackend, n: int) -> None:
    a = np.zeros(n, np.float32)
    x = be.from_numpy(a)
    a[0] = 1
    assert be.to_numpy(x)[0] == 0
    strided = np.arange(2 * n, dtype=np.int64)[::2]
    y = be.from_numpy(strided)
    assert be.to_numpy(y).dtype == np.int64
    np.testing.assert_array_equal(be.to_numpy(y), strided)
    ro = np.ones(n, np.float32)
    ro.flags.writeable = False
    np.testing.assert_array_equal(be.to_numpy(be.from_numpy(ro)), ro)


def test_float32_stays_float32(be: AbstractBackend) -> None:
    """Chains of ops on float32 never promote (no Python-scalar or x64 promotion)."""
    x = be.from_numpy(np.linspace(0.1, 1, 5, dtype=np.float32))
    for op in [M(OpKind.DISCOUNTED_SUM, gamma=0.99), M(OpKind.SIGMOID), M(OpKind.LOG_SOFTMAX, dim=0)]:
        assert be.to_numpy(be.run(op, [x], (), [False], {})).dtype == np.float32
    y = be.run(
        M(OpKind.DISCOUNT_WEIGHTS, gamma=0.99),
        [be.from_numpy(np.float32(1.0).reshape(())), x],
        (),
        [False, False],
        {},
    )
    assert be.to_numpy(y).dtype == np.float32


@pytest.mark.parametrize(
    "kind", [OpKind.MERGE, OpKind.SET_SYMBOL, OpKind.UDF, OpKind.SINK, OpKind.EVAL_SYMBOL]
)
def test_runtime_ops_raise(be: AbstractBackend, kind: OpKind) -> None:
    with pytest.raises(BackendError, match=f"{kind.name}.*executed by the runtime"):
        be.run(M(kind), [], (), [], {})


def test_native_failure_is_wrapped(be: AbstractBackend) -> None:
    x, y = be.from_numpy(np.ones((2, 3), np.float32)), be.from_numpy(np.ones((4,), np.float32))
    with pytest.raises(BackendError, match=r"ADD.*input shapes \[\(2, 3\), \(4,\)\]"):
        be.run(M(OpKind.ADD), [x, y], (), [False, False], {})


def test_slice_out_of_bounds_raises(be: AbstractBackend) -> None:
    x = be.from_numpy(np.ones((3,), np.float32))
    with pytest.raises(BackendError, match="outside the per-point dim"):
        be.run(M(OpKind.SLICE, dim=0, start=T - 1, stop=T + 1), [x], (), [False], {T: 0})


def test_unknown_backend_name() -> None:
    with pytest.raises(BackendError, match="valid names: jax, torch"):
        get_backend("tensorflow")


def test_const_is_cached_per_op(be: AbstractBackend) -> None:
    op = M(OpKind.CONST, value=np.ones(3, np.float32))
    assert be.run(op, [], (), [], {}) is be.run(op, [], (), [], {})


def test_compile(be: AbstractBackend) -> None:
    f = be.compile(lambda x: be.run(M(OpKind.EXP), [x], (), [False], {}))
    out = be.to_numpy(f(be.from_numpy(np.zeros(2, np.float32))))
    np.testing.assert_array_equal(out, np.ones(2, np.float32))


# ---------------------------------------------------------------------------------------
# DLPack
# ---------------------------------------------------------------------------------------


def _ptr(name: str, x: Any) -> int:
    if name == "jax":
        return x.unsafe_buffer_pointer()
    return x.data_ptr()


@pytest.mark.parametrize("src,dst", [("jax", "torch"), ("torch", "jax")])
@pytest.mark.parametrize("dtype", [DType.float32, DType.int64, DType.float64, DType.bool_])
def test_dlpack_round_trip_zero_copy(src: str, dst: str, dtype: DType) -> None:
    s, d = get_backend(src), get_backend(dst)
    a = np.arange(12).reshape(3, 4).astype(dtype.numpy)
    x = s.from_numpy(a)
    y = d.from_dlpack(s.to_dlpack(x))
    np.testing.assert_array_equal(d.to_numpy(y), a)
    assert d.to_numpy(y).dtype == a.dtype
    if src == "jax" and any(dv.platform != "cpu" for dv in x.devices()):
        # JAX on a GPU: the Torch backend computes on the CPU, so the import is a copy there
        assert y.device == d.device
        return
    assert _ptr(src, x) == _ptr(dst, y), "DLPack import copied the buffer"
    back = s.from_dlpack(d.to_dlpack(y))
    assert _ptr(src, back) == _ptr(src, x)


def test_dlpack_torch_requires_grad_is_detached() -> None:
    import torch

    t = torch.ones(3, requires_grad=True)
    j = get_backend("jax").from_dlpack(get_backend("torch").to_dlpack(t))
    assert np.asarray(j).tolist() == [1.0, 1.0, 1.0]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_tanh_is_accurate_over_the_whole_range(be: AbstractBackend, dtype: type) -> None:
    """Torch's tanh kernel runs NumPy's ufunc on CPU floats (faster at every size measured):
    relative error within 4 ulp of the float64 tanh everywhere, also for tiny and huge inputs;
    a non-contiguous input (a transposed view) and a negated view give the same values."""
    mag = np.logspace(-30, 2.5, 20001)
    x = np.concatenate([mag, -mag, np.random.default_rng(0).normal(0, 3, 20001), [0.0, np.inf, -np.inf]])
    x = x.astype(dtype)
    got = np.asarray(_run(be, Op.make(OpKind.TANH), [x], (), [False], {}), np.float64)
    want = np.tanh(x.astype(np.float64))
    rel = np.abs(got - want) / np.maximum(np.abs(want), np.finfo(np.float64).tiny)
    assert rel.max() <= 4 * np.finfo(dtype).eps, rel.max()  # XLA float64: 3.5 ulp
    nan = _run(be, Op.make(OpKind.TANH), [np.array([np.nan], dtype)], (), [False], {})
    assert np.isnan(nan).all()


def test_torch_tanh_of_views_equals_tanh_of_copies() -> None:
    import torch

    from timerl.backends import native
    from timerl.backends.torch_backend import _tanh

    for shape in ((7, 5), (131, 67)):  # below and above the size where torch.tanh is kept
        x = torch.from_numpy(np.random.default_rng(1).normal(0, 2, shape).astype(np.float32))
        for view in (x.T, x[:, ::2], torch._neg_view(x), x.expand(3, *shape)):
            got = _tanh(view)
            assert got.shape == view.shape
            np.testing.assert_array_equal(got.numpy(), _tanh(view.contiguous().resolve_neg()).numpy())
            want = np.tanh(view.resolve_neg().numpy().astype(np.float64))
            ulp = native.MAX_ULP * np.finfo(np.float32).eps  # the native kernel's bound, checked when built
            np.testing.assert_allclose(got.numpy(), want, rtol=ulp, atol=0)
