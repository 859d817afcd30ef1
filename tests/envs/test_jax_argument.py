"""``envs.common.jax_argument``: how a JAX env's jitted step receives actions."""

from __future__ import annotations

import jax
import numpy as np
import torch

from timerl.envs.common import jax_argument


def test_a_committed_array_on_the_device_goes_as_it_is() -> None:
    dev = jax.devices()[0]
    a = jax.device_put(np.arange(4, dtype=np.int32), dev)
    assert jax_argument(a, dev) is a


def test_an_uncommitted_array_is_placed_on_the_device() -> None:
    dev = jax.devices()[0]
    a = jax.numpy.arange(4)
    out = jax_argument(a, dev)
    assert out.committed and out.devices() == {dev}
    np.testing.assert_array_equal(np.asarray(out), np.arange(4))


def test_a_torch_tensor_on_the_host_goes_as_a_numpy_view_of_its_buffer() -> None:
    dev = jax.devices()[0]
    t = torch.tensor([1, 0, 1], dtype=torch.int64)
    out = jax_argument(t, dev)
    assert isinstance(out, np.ndarray) and out.dtype == np.int64
    assert out.__array_interface__["data"][0] == t.data_ptr()
    step = jax.jit(lambda a: a * 2)
    np.testing.assert_array_equal(np.asarray(step(out)), [2, 0, 2])
