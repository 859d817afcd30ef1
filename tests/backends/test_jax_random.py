"""The JAX backend's draws (Philox4x32-10, ``timerl.backends.jax_random``): the generator's
published answers, the draws' distributions, and how they are keyed."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from timerl.backends import jax_random
from timerl.backends.jax_backend import JaxBackend
from timerl.pdg.ops import DType, Op, OpKind

# Random123's known-answer vectors for philox4x32_10 (kat_vectors): key, counter, output.
_KAT = [
    ((0, 0), (0, 0, 0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 2, (0xFFFFFFFF,) * 4, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    (
        (0xA4093822, 0x299F31D0),
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
]


@pytest.mark.parametrize(("key", "counter", "expected"), _KAT)
def test_philox_gives_the_published_answers(key, counter, expected) -> None:
    words = jax_random.philox4x32(
        [jnp.asarray(k, jnp.uint32) for k in key], [jnp.asarray(c, jnp.uint32) for c in counter]
    )
    assert [int(w) for w in np.asarray(words)] == list(expected)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_uniform_draws_are_uniform_on_the_open_interval(dtype) -> None:
    u = np.asarray(jax_random.draw(jnp.arange(50, dtype=jnp.int32), (997,), dtype, False))
    assert u.shape == (50, 997) and u.dtype == dtype
    assert 0.0 < u.min() and u.max() < 1.0
    assert stats.kstest(u.ravel(), "uniform").pvalue > 1e-4
    # neighbours in a draw and the same element under neighbouring seeds are uncorrelated
    assert abs(np.corrcoef(u[:, :-1].ravel(), u[:, 1:].ravel())[0, 1]) < 0.02
    assert abs(np.corrcoef(u[:-1].ravel(), u[1:].ravel())[0, 1]) < 0.02
    # float64 draws use 53 bits: far more distinct values than float32's 2**24 steps allow
    if dtype == jnp.float64:
        assert np.any(np.modf(u.ravel() * 2**24)[0] > 0.5 + 1e-9)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_normal_draws_are_standard_normal(dtype) -> None:
    z = np.asarray(jax_random.draw(jnp.arange(40, dtype=jnp.int32), (25, 40), dtype, True))
    assert z.shape == (40, 25, 40) and np.isfinite(z).all()
    assert stats.kstest(z.ravel(), "norm").pvalue > 1e-4
    assert abs(z.mean()) < 0.02 and abs(z.std() - 1) < 0.02


def test_a_draw_depends_on_its_seed_alone() -> None:
    one = np.asarray(jax_random.draw(jnp.asarray(7), (3, 5), jnp.float32, False))
    rows = np.asarray(jax_random.draw(jnp.asarray([3, 7, 7]), (3, 5), jnp.float32, False))
    np.testing.assert_array_equal(rows[1], one)
    np.testing.assert_array_equal(rows[2], one)
    assert not np.array_equal(rows[0], one)
    # the first elements of a longer draw are the shorter draw's
    longer = np.asarray(jax_random.draw(jnp.asarray(7), (16,), jnp.float32, False))
    np.testing.assert_array_equal(longer[:15], one.ravel())


def test_the_backend_keys_each_draw_by_its_seed_and_a_stream_after_it() -> None:
    be = JaxBackend(seed=0)
    op = Op.make(OpKind.RAND_UNIFORM, shape=(4,), dtype=DType.float32)

    def draw(seed: int | None = None) -> np.ndarray:
        if seed is not None:
            be.seed(seed)
        return np.asarray(be.run(op, [], (), (), {}))

    first = draw(11)
    np.testing.assert_array_equal(first, draw(11))
    after = [draw(), draw()]
    assert not np.array_equal(after[0], after[1])
    assert not any(np.array_equal(a, first) for a in after)
    draw(11)  # a seed restarts the stream after it
    np.testing.assert_array_equal(draw(), after[0])
    np.testing.assert_array_equal(np.asarray(be.random_points([11, 5], (4,), DType.float32, False))[0], first)
