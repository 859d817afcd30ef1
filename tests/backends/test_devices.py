"""Backends on accelerators: what the GPU run of ``benchmarks/gpu_check.sh`` found.

* JAX rounds float32 matrix products to TensorFloat-32 on a GPU by default (up to 1e-3 off
  NumPy on an H200): the JAX backend asks for full precision unless the user chose one.
* A JAX env on a GPU hands the Torch backend CUDA tensors through DLPack while the backend
  computes on the CPU: they are copied to the backend's device (a warning says so once).

The precision checks read the traced program, so they run on any machine; the DLPack copy
needs a CUDA device and is skipped without one (it ran on the device machine).
"""

from __future__ import annotations

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from timerl.backends import get_backend
from timerl.pdg.ops import Op, OpKind


def _dot_precisions(be_name: str = "jax") -> list[object]:
    be = get_backend(be_name)
    op = Op.make(OpKind.MATMUL)
    a, b = jnp.ones((3, 4), jnp.float32), jnp.ones((4, 2), jnp.float32)
    jaxpr = jax.make_jaxpr(lambda x, y: be.run(op, [x, y], (), [False, False], {}))(a, b)
    return [e.params["precision"] for e in jaxpr.jaxpr.eqns if e.primitive.name == "dot_general"]


def test_jax_matmul_asks_for_full_float32_precision() -> None:
    precisions = _dot_precisions()
    assert precisions, "the matmul kernel traced no dot_general"
    highest = jax.lax.Precision.HIGHEST
    assert all(p == (highest, highest) for p in precisions), precisions


def test_jax_matmul_follows_the_users_precision_setting() -> None:
    with jax.default_matmul_precision("tensorfloat32"):  # JAX traces it as Precision.HIGH
        precisions = _dot_precisions()
    high = jax.lax.Precision.HIGH
    assert precisions and all(p == (high, high) for p in precisions), precisions


def test_jax_matmul_matches_numpy_in_float32() -> None:
    be = get_backend("jax")
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((64, 64), np.float32), rng.standard_normal((64, 8), np.float32)
    out = be.to_numpy(
        be.run(Op.make(OpKind.MATMUL), [be.from_numpy(a), be.from_numpy(b)], (), [False] * 2, {})
    )
    np.testing.assert_allclose(out, a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)


def test_torch_backend_computes_on_the_cpu() -> None:
    import torch

    be = get_backend("torch")
    assert be.device == torch.device("cpu")
    assert be.from_dlpack(torch.ones(3)).device == be.device


@pytest.mark.skipif(
    not any(d.platform == "gpu" for d in jax.devices()), reason="needs JAX on a CUDA device (GPU runs only)"
)
def test_torch_backend_copies_gpu_imports_to_its_device(caplog: pytest.LogCaptureFixture) -> None:
    be = get_backend("torch")
    x = jax.device_put(jnp.arange(4.0), jax.devices("gpu")[0])
    with caplog.at_level(logging.WARNING, logger="timerl.backends.torch_backend"):
        y, z = be.from_dlpack(x), be.from_dlpack(x)
    assert y.device == z.device == be.device
    np.testing.assert_array_equal(y.numpy(), np.arange(4.0, dtype=np.float32))
    assert sum("copied there at every step" in r.getMessage() for r in caplog.records) == 1


def test_import_backend_reports_the_seconds_once_and_checks_the_name() -> None:
    from timerl.backends import import_backend
    from timerl.errors import BackendError

    import_backend("jax")  # imported by this module already or now
    assert import_backend("jax") == 0.0
    with pytest.raises(BackendError, match="unknown backend 'tf'"):
        import_backend("tf")
