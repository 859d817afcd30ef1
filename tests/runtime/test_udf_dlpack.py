"""UDFs with ``array_io = "dlpack"``: backend tensors in, DLPack objects out (interpreter and reference).

The programs compile with the default options: a UDF is batched only over its declared
``batch_dims``, so these order-free UDFs are called once per point of ``i``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import timerl as trl
from timerl.backends import get_backend
from timerl.compile import CompileOptions, build_pdg
from timerl.errors import RuntimeExecutionError
from timerl.pdg.ops import DType
from timerl.rt.udf import UDFFn
from timerl.runtime.reference import reference_evaluate


class _Twice(UDFFn):
    """``[2x, x + 1]`` computed in JAX; the second output comes back as int32 (declared float32)."""

    array_io = "dlpack"

    def __init__(self, seen: list[type]) -> None:
        super().__init__(self._call, "twice")
        self.seen = seen

    def _call(self, inputs: list, point: dict[str, int]) -> list:
        (x,) = inputs
        self.seen.append(type(x))
        xj = x if isinstance(x, jax.Array) else jax.dlpack.from_dlpack(x)
        return [xj * 2, (xj + 1).astype(jnp.int32)]


def _program(seen: list[type], out: list[tuple[int, float, float]]) -> tuple[trl.Context, dict]:
    ctx = trl.Context(dims=("i",))
    with ctx as ((i, I),):
        x = trl.as_tensor(i)
        y, z = trl.udf(_Twice(seen), [((), DType.float32), ((), DType.float32)], (i,), [x], name="twice")
        (y + z * 0).sink(lambda v, pt: out.append((pt["i"], float(v), 0.0)))
        z.sink(lambda v, pt: out.append((pt["i"], float(v), 1.0)))
    return ctx, {I: 3}


OPTS: dict = {}


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_dlpack_udf_gets_backend_tensors(backend: str) -> None:
    seen: list[type] = []
    out: list[tuple[int, float, float]] = []
    ctx, bounds = _program(seen, out)
    ctx.compile(bounds, backend=backend, **OPTS).execute()
    assert seen and all(issubclass(s, jax.Array if backend == "jax" else torch.Tensor) for s in seen)
    assert sorted(out) == sorted(
        [(k, 2.0 * k, 0.0) for k in range(3)] + [(k, k + 1.0, 1.0) for k in range(3)]
    )


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_dlpack_udf_in_reference_evaluator(backend: str) -> None:
    seen: list[type] = []
    out: list[tuple[int, float, float]] = []
    ctx, bounds = _program(seen, out)
    reference_evaluate(build_pdg(ctx, bounds, CompileOptions(**OPTS)), get_backend(backend))
    assert sorted(out) == sorted(
        [(k, 2.0 * k, 0.0) for k in range(3)] + [(k, k + 1.0, 1.0) for k in range(3)]
    )


def test_dlpack_udf_must_return_dlpack_objects() -> None:
    class Bad(UDFFn):
        array_io = "dlpack"

    ctx = trl.Context(dims=("i",))
    with ctx as ((i, I),):
        (y,) = trl.udf(Bad(lambda ins, pt: [[1.0]], "bad"), [((), DType.float32)], (i,))
        y.sink(lambda v, pt: None)
    with pytest.raises(RuntimeExecutionError, match="__dlpack__"):
        ctx.compile({I: 1}, backend="torch", **OPTS).execute()


def test_numpy_udf_unchanged() -> None:
    got: list[float] = []
    ctx = trl.Context(dims=("i",))
    with ctx as ((i, I),):
        (y,) = trl.udf(lambda ins, pt: [np.float32(pt["i"] * 3)], [((), DType.float32)], (i,), name="plain")
        y.sink(lambda v, pt: got.append(float(v)))
    ctx.compile({I: 2}, backend="jax", **OPTS).execute()
    assert sorted(got) == [0.0, 3.0]


class _Keeps(UDFFn):
    """Returns a fresh tensor per point and keeps it (as a JAX env keeps its last observation)."""

    array_io = "dlpack"

    def __init__(self) -> None:
        super().__init__(self._call, "keeps")
        self.kept: list[tuple[int, torch.Tensor]] = []

    def _call(self, inputs: list, point: dict[str, int]) -> list:
        x = torch.full((4,), float(point["i"]))
        self.kept.append((point["i"], x))
        return [x]


def test_a_dlpack_udf_output_is_never_donated() -> None:
    """A region that is the last reader of a DLPack UDF's output must not write into its
    buffer: the UDF may still hold it."""
    udf = _Keeps()
    got: list[tuple[int, list[float]]] = []
    ctx = trl.Context(dims=("i",))
    with ctx as ((i, I),):
        w = trl.empty((4,), domain=(i,), name="w")
        w[0] = trl.zeros((4,))
        (y,) = trl.udf(udf, [((4,), DType.float32)], (i,), [w[i]], name="keeps")
        w[i + 1] = y * 3.0 + 1.0  # one region, the last reader of y[i], storing a (4,) float32
        w[i].sink(lambda v, pt: got.append((pt["i"], v.tolist())))
    ctx.compile({I: 3}, backend="torch", **OPTS).execute()
    assert sorted(got) == [(0, [0.0] * 4), (1, [1.0] * 4), (2, [4.0] * 4)]
    assert [(k, x.tolist()) for k, x in udf.kept] == [(k, [float(k)] * 4) for k in range(3)]
