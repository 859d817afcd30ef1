"""``timerl/pdg/passes/vectorize.py``: the value of a vectorized dim, ``as_tensor(b)``."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import timerl as trl
from timerl.backends import get_backend
from timerl.compile import CompileOptions, build_pdg
from timerl.pdg.ops import OpKind
from timerl.runtime.reference import reference_evaluate


def _actors(inputs: list[np.ndarray], point: dict[str, int]) -> list[np.ndarray]:
    """An 'environment' batched over b: 10 + 10 * t for every actor."""
    return [np.full(3, 10.0 + 10.0 * point["t"], np.float32)]


def _program(sink: Any) -> tuple[trl.Context, dict[Any, int]]:
    """x[b, t] = env[b, t] + 0.5 ** (1 + b): a per-actor value as with APEX's epsilons."""
    ctx = trl.Context(dims=("b", "t"))
    with ctx as ((b, B), (t, T)):
        (env,) = trl.udf(_actors, [((), trl.float32)], domain=(b, t), batch_dims=(b,), name="actors")
        (env + 0.5 ** (1.0 + trl.as_tensor(b))).sink(sink)
    return ctx, {B: 3, T: 2}


WANT = [(bb, tt, 10.0 + 10.0 * tt + 0.5 ** (1 + bb)) for bb in range(3) for tt in range(2)]


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_dim_value_of_a_udf_batch_dim_is_vectorized_as_arange(backend: str) -> None:
    """as_tensor(b) no longer stops an env's batch dim from being vectorized (it used to be a
    compile error); compiled and reference values are those of the per-point program."""
    out: list[tuple[int, int, float]] = []
    ctx, bounds = _program(lambda v, p: out.append((p["b"], p["t"], float(v))))
    ctx.compile(bounds, backend=backend).execute()
    assert sorted(out) == WANT  # exact: sums of small powers of two

    ref: list[tuple[int, int, float]] = []
    ctx, bounds = _program(lambda v, p: ref.append((p["b"], p["t"], float(v))))
    pdg = build_pdg(ctx, bounds, CompileOptions())
    reference_evaluate(pdg, get_backend(backend))
    assert sorted(ref) == WANT

    assert all(s.name != "b" for n in pdg for s in n.domain)
    consts = [n for n in pdg if n.op.kind is OpKind.CONST and n.batch == (3,)]
    assert len(consts) == 1 and np.array_equal(consts[0].op.attr("value"), np.arange(3, dtype=np.float32))


def test_dim_value_of_other_dims_keeps_them_symbolic() -> None:
    """Without a UDF batching over it, a dim whose value is used stays symbolic (as before),
    and so does a batch dim used in any other expression (as_tensor(b + t))."""
    ctx = trl.Context(dims=("b", "t"))
    with ctx as ((b, B), (t, T)):
        trl.as_tensor(b).sink(lambda v, p: None)
    pdg = build_pdg(ctx, {B: 3, T: 2}, CompileOptions())
    assert any(s.name == "b" for n in pdg for s in n.domain)

    ctx = trl.Context(dims=("b", "t"))
    with ctx as ((b, B), (t, T)):
        (env,) = trl.udf(_actors, [((), trl.float32)], domain=(b, t), batch_dims=(b,), name="actors")
        (env + trl.as_tensor(b + t)).sink(lambda v, p: None)
    with pytest.raises(trl.RTDefinitionError, match="must be vectorized"):
        build_pdg(ctx, {B: 3, T: 2}, CompileOptions())
