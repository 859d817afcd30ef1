"""The JAX backend's host-side stacking on a CPU: fresh arrays 64-byte aligned (so XLA's CPU
client adopts them in ``device_put`` instead of copying), with the values of NumPy's
operations, and never aliasing an input a later write may change."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from timerl.backends import get_backend
from timerl.backends.jax_backend import host_empty


@pytest.mark.parametrize("shape", [(), (3,), (512, 250, 64), (7, 0, 3)])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.bool_, np.float64])
def test_host_empty_is_aligned_and_c_ordered(shape: tuple[int, ...], dtype: type) -> None:
    for zero in (False, True):
        a = host_empty(shape, dtype, zero=zero)
        assert a.shape == shape and a.dtype == np.dtype(dtype) and a.flags.c_contiguous
        assert a.ctypes.data % 64 == 0 or a.size == 0
        if zero:
            assert not a.any()


def test_stacks_equal_numpys_and_do_not_alias_their_inputs() -> None:
    be = get_backend("jax")
    rng = np.random.default_rng(0)
    host = [rng.standard_normal((512, 64)).astype(np.float32) for _ in range(40)]
    rows = [jnp.asarray(r) for r in host]
    for axis in (0, 1):
        want = np.stack(host, axis=axis)
        got = be.stack(rows, axis)
        np.testing.assert_array_equal(np.asarray(got), want)
        padded = be.stack_padded(rows, axis, 64)
        assert padded.shape[axis] == 64
        np.testing.assert_array_equal(np.take(np.asarray(padded), range(40), axis=axis), want)
        assert not np.take(np.asarray(padded), range(40, 64), axis=axis).any()
        part = be.restack(got, 3, 17, axis)
        np.testing.assert_array_equal(np.asarray(part), np.take(want, range(3, 17), axis=axis))
        part_pad = be.restack_padded(got, 3, 17, axis, 32)
        np.testing.assert_array_equal(
            np.take(np.asarray(part_pad), range(14), axis=axis), np.take(want, range(3, 17), axis=axis)
        )
        assert not np.take(np.asarray(part_pad), range(14, 32), axis=axis).any()
        back = be.unstack(got, axis)
        assert len(back) == 40 and all(
            np.array_equal(np.asarray(b), h) for b, h in zip(back, host, strict=True)
        )
    big = rng.standard_normal((300, 300)).astype(np.float32)  # above the staged-copy size
    (copy,) = be.from_numpy_all([big])
    big[:] = 0.0  # a later write to the host array does not reach the copy
    assert np.asarray(copy).any()
