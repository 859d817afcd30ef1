"""The JAX backend: kernels on ``jax.Array`` values, ``jax.jit`` for fused regions.

Importing this module enables ``jax_enable_x64`` (process-wide) so that int64/float64
values keep their dtype; every kernel passes dtypes explicitly so float32 stays float32.
It also limits glibc's malloc arenas before XLA's threads start (process-wide too;
:mod:`timerl.backends.malloc`, ``TIMERL_MALLOC_ARENAS=0`` keeps glibc's default).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, final

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from timerl.backends import base, jax_random
from timerl.backends.base import AbstractBackend, Kernel, accumulate_dtype
from timerl.backends.malloc import limit_malloc_arenas
from timerl.errors import BackendError
from timerl.pdg.ops import DType, OpKind

limit_malloc_arenas()
jax.config.update("jax_enable_x64", True)

_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"  # XLA's compile of one program
_compiled_seconds = [0.0]


def _count_compile(event: str, seconds: float, **_: Any) -> None:
    if event == _COMPILE_EVENT:
        _compiled_seconds[0] += seconds


jax.monitoring.register_event_duration_secs_listener(_count_compile)


@functools.cache
def _device_sharding() -> jax.sharding.Sharding:
    return jax.sharding.SingleDeviceSharding(jax.devices()[0])


def jit(fn: Callable[..., Any] | None = None, **kw: Any) -> Any:
    """``jax.jit(fn, **kw)`` with every argument placed on the default device.

    ``jax.jit`` compiles once per placement of its arguments: a value made from NumPy is
    uncommitted, one that an environment's step returns (it commits its arguments) or that a
    call computed from committed inputs is committed, and the same program with one argument
    of each kind compiles again (PPO's rollout scan and learner, 8 envs x 1,000 steps: 3.5 s
    and 1.3 s a second time in the second iteration). With ``in_shardings`` every argument
    goes to the one device and the outputs are committed there: one compilation per shape.
    Used as ``@jit`` or ``@functools.partial(jit, static_argnums=...)``; the ``jax.jit``
    object is made at the first call (the device is not looked up at import)."""
    if fn is None:
        return functools.partial(jit, **kw)
    made: list[Any] = []

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        if not made:
            made.append(jax.jit(fn, in_shardings=_device_sharding(), **kw))
        return made[0](*args, **kwargs)

    return call


_SMALL_HOST_COPY = 1 << 16
"""Bytes up to which :func:`_host_copies` stages a copy through one jitted identity call (a
``device_put`` adopts a larger fresh copy without copying it again)."""


@functools.cache
def _stage() -> Callable[..., Any]:
    """A jitted identity: the cheapest way found to make ``jax.Array`` values of small host
    arrays (one core, three arrays of 512 x 4 / 512 float32 and 512 bool: 53 us in one call,
    against 71-79 us per array through ``jnp.asarray`` and 93-146 us through ``device_put``)."""
    return jax.jit(lambda *xs: xs, in_shardings=_device_sharding())


_HOST_ALIGN = 64
"""Byte alignment from which XLA's CPU client adopts a host buffer in ``device_put`` instead of
copying it. NumPy's large arrays start 16 bytes into a page: 32 MB (250 rows of (512, 64)
float32) took 12-13 ms more to ``device_put`` than the same array 64-byte aligned (5 ms,
the stacking itself)."""


def host_empty(shape: Sequence[int], dtype: Any, zero: bool = False) -> np.ndarray:
    """An uninitialised (``zero``: zeroed) C-ordered NumPy array whose data is
    :data:`_HOST_ALIGN`-byte aligned, for a fresh host array that ``device_put`` then adopts."""
    dt = np.dtype(dtype)
    n = math.prod(shape) * dt.itemsize
    buf = (np.zeros if zero else np.empty)(n + _HOST_ALIGN, np.uint8)
    off = -buf.ctypes.data % _HOST_ALIGN
    return buf[off : off + n].view(dt).reshape(tuple(shape))


def _adopt(a: np.ndarray) -> jax.Array:
    """``device_put`` of a fresh host array (nobody else writes it): adopted without a copy."""
    return jax.device_put(a)


def _host_copies(arrays: Sequence[Any]) -> list[jax.Array]:
    """``jax.Array`` values holding copies of the host arrays, taken before returning.

    ``jnp.array(a, copy=True)`` is not that on CPU: for arrays of ~0.3 MB and more its copy
    runs asynchronously, and a write to ``a`` right after the call reached the new array in
    27 of 2,000 tries (70,000 float32) and 50 of 300 (10**6) here; an env that reuses its
    observation buffer, or a host block row overwritten later, would corrupt stored values.
    NumPy copies synchronously, and the fresh copy is owned by nobody else: small ones are
    staged together (:func:`_stage`), a large one is adopted by ``device_put``."""
    copies = [_fresh_copy(np.asarray(a)) for a in arrays]
    small = [k for k, c in enumerate(copies) if c.nbytes <= _SMALL_HOST_COPY]
    out: list[Any] = [c if c.nbytes <= _SMALL_HOST_COPY else _adopt(c) for c in copies]
    if small:
        for k, x in zip(small, _stage()(*(copies[k] for k in small)), strict=True):
            out[k] = x
    return out


def _fresh_copy(a: np.ndarray) -> np.ndarray:
    """A C-ordered copy of ``a`` (aligned with :func:`host_empty` when large)."""
    if a.nbytes <= _SMALL_HOST_COPY:
        return np.array(a, copy=True, order="C")
    out = host_empty(a.shape, a.dtype)
    np.copyto(out, a)
    return out


def _host_copy(a: Any) -> jax.Array:
    """One array through :func:`_host_copies`."""
    return _host_copies((a,))[0]


_DTYPES: dict[DType, Any] = {
    DType.float32: jnp.float32,
    DType.float64: jnp.float64,
    DType.int32: jnp.int32,
    DType.int64: jnp.int64,
    DType.bool_: jnp.bool_,
}


def _sum(x: jax.Array, axes: tuple[int, ...], keepdim: bool) -> jax.Array:
    dt = _DTYPES[accumulate_dtype(DType.from_numpy(x.dtype))]
    return jnp.sum(x, axis=axes, keepdims=keepdim, dtype=dt)


def _cumsum(x: jax.Array, axis: int) -> jax.Array:
    return jnp.cumsum(x, axis=axis, dtype=_DTYPES[accumulate_dtype(DType.from_numpy(x.dtype))])


def _pad(x: jax.Array, axis: int, before: int, after: int) -> jax.Array:
    widths = [(0, 0)] * x.ndim
    widths[axis] = (before, after)
    return jnp.pad(x, widths)


@functools.partial(jit, static_argnums=(1, 2, 3))
def _draw(seeds: jax.Array, shape: tuple[int, ...], dtype: Any, normal: bool) -> Any:
    """One draw of ``shape`` per seed (:func:`timerl.backends.jax_random.draw`), one dispatch."""
    return jax_random.draw(seeds, shape, dtype, normal)


@functools.partial(jit, static_argnums=(1,))
def _take(x: jax.Array, axis: int, index: jax.Array) -> jax.Array:
    return lax.dynamic_index_in_dim(x, index, axis, keepdims=False)


@functools.partial(jit, static_argnums=(1,))
def _mask_rows(x: jax.Array, axis: int, stop: jax.Array) -> jax.Array:
    rows = lax.broadcasted_iota(jnp.int32, x.shape, axis)
    return jnp.where(rows < stop, x, jnp.zeros((), x.dtype))


def _random(be: AbstractBackend, shape: tuple[int, ...], dtype: DType, normal: bool) -> jax.Array:
    assert isinstance(be, JaxBackend)
    seed, be._pending_seed = be._pending_seed, -1
    if isinstance(seed, jax.core.Tracer):  # inside a compiled iteration: the seed of its point
        return jax_random.draw(seed, shape, _DTYPES[dtype], normal)
    if seed < 0:
        seed = be.unseeded()
    return _draw(np.int64(seed), shape, _DTYPES[dtype], normal)


def _one_hot(be: AbstractBackend, c: base.KernelCall, xs: Sequence[Any]) -> jax.Array:
    return jax.nn.one_hot(xs[0], int(c.attr("num_classes")), dtype=_DTYPES[c.dtype_attr()])


def _linear_scan(x: jax.Array, c: jax.Array, y0: jax.Array, reverse: bool) -> jax.Array:
    """``y[k] = x + c * y[k +/- 1]`` along axis 0 (``lax.scan``) from ``y0`` at the last/first
    row (``x``, ``c``: one row fewer than ``y``; see ``OpKind.LINEAR_SCAN``)."""
    y0 = y0.astype(x.dtype)

    def step(y: jax.Array, xc: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        y = xc[0] + xc[1] * y
        return y, y

    _, ys = jax.lax.scan(step, y0, (x, c), reverse=reverse)
    return jnp.concatenate([ys, y0[None]]) if reverse else jnp.concatenate([y0[None], ys])


def _shift_rows(y: jax.Array, axis: int, s: int) -> jax.Array:
    """Rows ``s ..`` of ``y`` along ``axis``, then ``s`` zero rows (``SUFFIX_SUM``)."""
    tail = jax.lax.slice_in_dim(y, s, y.shape[axis], axis=axis)
    widths = [(0, 0)] * y.ndim
    widths[axis] = (0, s)
    return jnp.pad(tail, widths)


def _index_add(g: jax.Array, idx: jax.Array, a: int, n: int) -> jax.Array:
    out = jnp.zeros(g.shape[:a] + (n,) + g.shape[a + 1 :], g.dtype)
    return out.at[(slice(None),) * a + (idx,)].add(g)


def _index_add_batched(g: jax.Array, idx: jax.Array, n: int) -> jax.Array:
    out = jnp.zeros((g.shape[0], n) + g.shape[2:], g.dtype)
    return out.at[jnp.arange(g.shape[0])[:, None], idx].add(g)


_KERNELS: dict[OpKind, Kernel] = {
    **base.shared_kernels(),
    OpKind.RAND_UNIFORM: base.random(lambda be, s, dt: _random(be, s, dt, False)),
    OpKind.RAND_NORMAL: base.random(lambda be, s, dt: _random(be, s, dt, True)),
    # elementwise unary
    OpKind.NEG: base.unary(jnp.negative),
    OpKind.EXP: base.unary(jnp.exp),
    OpKind.LOG: base.unary(jnp.log),
    OpKind.SQRT: base.unary(jnp.sqrt),
    OpKind.TANH: base.unary(jnp.tanh),
    OpKind.ABS: base.unary(jnp.abs),
    OpKind.RELU: base.unary(jax.nn.relu),
    OpKind.SIGMOID: base.unary(jax.nn.sigmoid),
    OpKind.SIGN: base.unary(jnp.sign),
    OpKind.LOGICAL_NOT: base.unary(jnp.logical_not),
    OpKind.CAST: lambda be, c, xs: xs[0].astype(_DTYPES[c.dtype_attr()]),
    # elementwise binary / ternary
    OpKind.ADD: base.elementwise(jnp.add),
    OpKind.SUB: base.elementwise(jnp.subtract),
    OpKind.MUL: base.elementwise(jnp.multiply),
    OpKind.DIV: base.elementwise(jnp.divide),
    OpKind.POW: base.elementwise(jnp.power),
    OpKind.TANH_GRAD: base.elementwise(lambda g, y: g * (1 - y * y)),
    OpKind.MAXIMUM: base.elementwise(jnp.maximum),
    OpKind.MINIMUM: base.elementwise(jnp.minimum),
    OpKind.LT: base.elementwise(jnp.less),
    OpKind.LE: base.elementwise(jnp.less_equal),
    OpKind.GT: base.elementwise(jnp.greater),
    OpKind.GE: base.elementwise(jnp.greater_equal),
    OpKind.EQ: base.elementwise(jnp.equal),
    OpKind.NE: base.elementwise(jnp.not_equal),
    OpKind.LOGICAL_AND: base.elementwise(jnp.logical_and),
    OpKind.LOGICAL_OR: base.elementwise(jnp.logical_or),
    OpKind.WHERE: base.elementwise(jnp.where),
    # reductions / scans
    OpKind.SUM: base.reduction(_sum),
    OpKind.MAX: base.reduction(lambda x, a, k: jnp.max(x, axis=a, keepdims=k)),
    OpKind.MIN: base.reduction(lambda x, a, k: jnp.min(x, axis=a, keepdims=k)),
    OpKind.ARGMAX: base.along_dim(lambda x, a: jnp.argmax(x, axis=a).astype(jnp.int64)),
    OpKind.CUMSUM: base.along_dim(_cumsum),
    OpKind.DISCOUNTED_SUM: base.discounted_sum(lambda x, a: jnp.sum(x, axis=a, dtype=x.dtype)),
    OpKind.LINEAR_SCAN: base.linear_scan(_linear_scan),
    OpKind.SUFFIX_SUM: base.suffix_sum(_shift_rows),
    OpKind.LOG_SOFTMAX: base.along_dim(lambda x, a: jax.nn.log_softmax(x, axis=a)),
    OpKind.SOFTMAX: base.along_dim(lambda x, a: jax.nn.softmax(x, axis=a)),
    # layout / indexing
    OpKind.PERMUTE: base.permute(jnp.transpose),
    OpKind.SQUEEZE: base.along_dim(lambda x, a: jnp.squeeze(x, axis=a)),
    OpKind.UNSQUEEZE: base.along_dim(jnp.expand_dims),
    OpKind.CAT: base.multi_along_dim(lambda xs, a: jnp.concatenate(xs, axis=a)),
    OpKind.STACK: base.multi_along_dim(lambda xs, a: jnp.stack(xs, axis=a)),
    OpKind.PAD_SLICE: base.pad_slice(_pad),
    OpKind.GATHER: base.gather(lambda x, i: jnp.take_along_axis(x, i[..., None], axis=-1)[..., 0]),
    OpKind.ONE_HOT: _one_hot,
    OpKind.TAKE: base.take_rows(
        # out-of-range rows read as NaN (floats), never clamped to a valid row
        lambda x, i, a: jnp.take(x, i, axis=a, mode="fill"),
        lambda x, i: x.at[jnp.arange(x.shape[0])[:, None], i].get(mode="fill"),
    ),
    OpKind.INDEX_ADD: base.index_add_rows(_index_add, _index_add_batched),
    OpKind.ARGSORT: base.along_dim(lambda x, a: jnp.argsort(x, axis=a).astype(jnp.int64)),
    OpKind.MATMUL: base.matmul(lambda a, b: _matmul(a, b), lambda a, b: _matmul_tn(a, b)),
}

_NARROW_ROWS = 4096
"""Rows from which a product with at most :data:`_NARROW_K` contracted columns is computed as
broadcast multiply-adds on a CPU (XLA's dot: ``(128000, 4) @ (4, 64)`` 4.1 ms, ``K = 2`` 3.9
ms; multiply-adds 1.75 / 0.96 ms; at 512 rows the two are within 20 %)."""
_NARROW_K = 8
_LONG_K = 1024
"""Contracted rows from which ``X^T @ Y`` (``X`` row-major ``(K, m)``, ``Y`` with ``n <= 4``
columns, ``m * n <= 512``) is computed as ``n`` column sums of ``X * Y[:, j]`` on a CPU: XLA's
dot with its left operand contracted over its major dim took 8.2 / 10.8 / 11.1 ms for
``K = 128000, m = 64, n = 1 / 2 / 4`` where the sums take 0.86 / 1.96 / 3.5 ms (``K = 1024``:
60 -> 25 us; ``m = 256, n = 4`` at ``K = 128000``: 54 -> 62 ms, hence the ``m * n`` bound)."""


@functools.cache
def _cpu() -> bool:
    return jax.devices()[0].platform == "cpu"  # the device every call places its arguments on


def _matmul(a: Any, b: Any) -> Any:
    """``a @ b`` (aligned ranks); on a CPU, a long product with few contracted columns as
    multiply-adds of ``a``'s columns and ``b``'s rows (:data:`_NARROW_ROWS`). The rows are all
    of ``a``'s when ``b`` is one matrix, else those of one of ``a``'s matrices (so a product
    batched over agents takes the same path as one agent's)."""
    if a.ndim == b.ndim > 2 and base.partly_broadcast(a.shape[:-2], b.shape[:-2]):
        return base.matmul_broadcast(functools.partial(jnp.einsum, precision=matmul_precision()), a, b)
    k = a.shape[-1]
    rows = math.prod(a.shape[:-1]) if math.prod(b.shape[:-2]) == 1 else a.shape[-2]
    if 1 <= k <= _NARROW_K and rows >= _NARROW_ROWS and _cpu():
        out = a[..., :, 0:1] * b[..., 0:1, :]
        for j in range(1, k):
            out = out + a[..., :, j : j + 1] * b[..., j : j + 1, :]
        return out
    return jnp.matmul(a, b, precision=matmul_precision())


def _matmul_tn(a: Any, b: Any) -> Any:
    """``a @ b`` where ``a`` is a transpose of a row-major ``(K, m)`` array in the same trace
    (``lhs_transposed``); on a CPU, few output columns as column sums (:data:`_LONG_K`)."""
    m, k = a.shape[-2:]
    n = b.shape[-1]
    traced = isinstance(a, jax.core.Tracer)  # else the transpose was materialised: row-major (m, K)
    if traced and k >= _LONG_K and n <= 4 and m * n <= 512 and _cpu():
        x = jnp.swapaxes(a, -1, -2)  # the row-major (K, m) array again
        return jnp.stack([jnp.sum(x * b[..., :, j : j + 1], axis=-2) for j in range(n)], axis=-1)
    return _matmul(a, b)


def matmul_precision() -> lax.Precision | None:
    """The precision of the backend's matrix products: ``HIGHEST`` (full float32, as NumPy and
    the Torch backend compute them) unless the user set ``jax_default_matmul_precision``, which
    is then followed (``None``). JAX's own default on a GPU rounds float32 operands to
    TensorFloat-32 (10-bit mantissa): measured on an H200, 2x64 tanh MLP products then differ
    from NumPy by up to 1e-3 and the JAX and Torch backends stop agreeing."""
    return None if jax.config.jax_default_matmul_precision is not None else lax.Precision.HIGHEST


def _on_cpu(xs: Sequence[Any]) -> bool:
    """Whether every array of ``xs`` is on the CPU (False for tracers: a compiled iteration's
    trace, runtime/iteration.py)."""
    return (
        bool(xs)
        and not any(isinstance(x, jax.core.Tracer) for x in xs)
        and all(d.platform == "cpu" for x in xs for d in x.devices())
    )


# Block buffers (see AbstractBackend.block_*): compiled once per buffer shape; the write
# donates the buffer, so XLA updates it in place.
@functools.partial(jit, donate_argnums=0)
def _block_write(buf: jax.Array, x: jax.Array, index: jax.Array) -> jax.Array:
    return lax.dynamic_update_index_in_dim(buf, x.astype(buf.dtype), index, 0)


@functools.partial(jit, donate_argnums=0, static_argnums=(2,))
def _block_write_rows(
    buf: jax.Array, xs: jax.Array, axis: int, dst: jax.Array, src: jax.Array, count: jax.Array
) -> jax.Array:
    rows = jnp.moveaxis(xs, axis, 0).astype(buf.dtype)
    at = jnp.arange(buf.shape[0])
    got = jnp.take(rows, jnp.clip(at - dst + src, 0, rows.shape[0] - 1), axis=0)
    keep = ((at >= dst) & (at < dst + count)).reshape((-1,) + (1,) * (buf.ndim - 1))
    return jnp.where(keep, got, buf)


@jit
def _block_row(buf: jax.Array, index: jax.Array) -> jax.Array:
    return lax.dynamic_index_in_dim(buf, index, 0, keepdims=False)


@final
class JaxBackend(AbstractBackend):
    """Runs ops with ``jax.numpy``. ``RAND_*`` ops draw with Philox keyed by the seed set
    before them (:mod:`timerl.backends.jax_random`); a UDF's keys are ``jax.random`` keys
    split from one key (:meth:`next_key`)."""

    name: ClassVar[str] = "jax"
    kernels: ClassVar[Mapping[OpKind, Kernel]] = _KERNELS
    static_shapes: ClassVar[bool] = True
    donates: ClassVar[bool] = True
    scans: ClassVar[str] = "compiled"

    def __init__(self, seed: int = 0, host_blocks: bool = False) -> None:
        super().__init__()
        self._key = jax.random.key(seed)
        self._pending_seed = -1  # a seed set by seed() and not used yet
        self._stream = (seed, 0)  # the last seed set, and the draws made without one since
        self.host_blocks = host_blocks

    def seed(self, seed: int) -> None:
        """Key the next draw (and :meth:`next_key`'s next key) by ``seed`` (``>= 0``)."""
        if isinstance(seed, jax.core.Tracer):
            self._pending_seed = seed
        else:
            self._pending_seed = int(seed)
            self._stream = (int(seed), 0)

    def unseeded(self) -> int:
        """The key of a draw made without :meth:`seed`: the ``k``-th since the last seed ``s``,
        apart from every seed a point can have (those are below ``2**31``)."""
        base, k = self._stream
        self._stream = (base, k + 1)
        return ((0x40000000 | (base & 0x3FFFFFFF)) << 32) | (k & 0xFFFFFFFF)

    def random_points(self, seeds: Sequence[int], shape: tuple[int, ...], dtype: DType, normal: bool) -> Any:
        """One dispatch for all the draws (the values of one draw per seed)."""
        if isinstance(seeds, jax.core.Tracer):
            return jax_random.draw(seeds, tuple(shape), _DTYPES[dtype], normal)
        return _draw(jnp.asarray(np.asarray(seeds, np.int32)), tuple(shape), _DTYPES[dtype], normal)

    def compile_seconds(self) -> float:
        """XLA's compile time in this process so far (JAX's ``backend_compile_duration`` events)."""
        return _compiled_seconds[0]

    def next_key(self) -> jax.Array:
        """Split the PRNG key: keep one half, return the other."""
        if self._pending_seed >= 0:
            self._key, self._pending_seed = jax.random.key(self._pending_seed), -1
        self._key, sub = jax.random.split(self._key)
        return sub

    def from_numpy(self, a: np.ndarray) -> jax.Array:
        """Copy into a ``jax.Array`` with the same dtype (see :func:`_host_copies`)."""
        return _host_copy(a)

    def from_numpy_all(self, arrays: Sequence[np.ndarray]) -> list[jax.Array]:
        """Copies of several host arrays, the small ones in one call (:func:`_host_copies`)."""
        return _host_copies(arrays)

    def to_numpy(self, x: Any) -> np.ndarray:
        """A read-only NumPy view (or copy) of ``x``."""
        return np.asarray(x)

    def stack(self, xs: Sequence[Any], axis: int) -> jax.Array:
        """Stack on the host for CPU arrays (``jnp.stack`` compiles once per list length). The
        stacked NumPy array is fresh and aligned, so ``device_put`` adopts its buffer
        (:func:`host_empty`): 250 (512, 64) float32 rows took 5 ms this way, 18 ms unaligned
        and 34.7 ms through ``jnp.asarray`` (a second copy)."""
        if _on_cpu(xs):
            rows = [np.asarray(x) for x in xs]
            shape = rows[0].shape[:axis] + (len(rows),) + rows[0].shape[axis:]
            out = host_empty(shape, np.result_type(*rows))
            return _adopt(np.stack(rows, axis=axis, out=out))
        return jnp.stack(list(xs), axis=axis)

    def restack(self, rows: Any, start: int, stop: int, axis: int) -> jax.Array:
        """The rows themselves for the whole range; a part of them on the host for CPU arrays
        (one copy, no compilation per shape, and the same kind of array for the compiled
        regions that read it)."""
        if (start, stop) == (0, rows.shape[axis]) or not _on_cpu([rows]):
            return super().restack(rows, start, stop, axis)
        a = np.asarray(rows)[(slice(None),) * axis + (slice(start, stop),)]
        return _adopt(_fresh_copy(a))

    def unstack(self, rows: Any, axis: int = 0) -> list[Any]:
        """On the host for CPU arrays: a NumPy view of the buffer and one ``device_put`` per
        row (a jitted unstack of 249 rows compiled for 7-8 s and ~0.4 GB per shape)."""
        if not _on_cpu([rows]):
            return super().unstack(rows, axis)
        a = np.asarray(rows)
        return [
            _adopt(_fresh_copy(a[(slice(None),) * axis + (k,)]))  # 0-d rows stay 0-d
            for k in range(a.shape[axis])
        ]

    def restack_padded(self, rows: Any, start: int, stop: int, axis: int, size: int) -> jax.Array:
        """On the host for CPU arrays: one zero array, the rows copied in (nothing compiled per
        length)."""
        if not _on_cpu([rows]):
            return super().restack_padded(rows, start, stop, axis, size)
        a = np.asarray(rows)
        lead = (slice(None),) * axis
        shape = a.shape[:axis] + (size,) + a.shape[axis + 1 :]
        out = host_empty(shape, a.dtype, zero=True)
        out[lead + (slice(0, stop - start),)] = a[lead + (slice(start, stop),)]
        return _adopt(out)

    def stack_padded(self, xs: Sequence[Any], axis: int, size: int) -> jax.Array:
        """Stack and zero-pad on the host for CPU arrays (no compilation per length)."""
        if not _on_cpu(xs):
            return super().stack_padded(xs, axis, size)
        first = np.asarray(xs[0])
        out = host_empty(first.shape[:axis] + (size,) + first.shape[axis:], first.dtype, zero=True)
        for k, x in enumerate(xs):
            out[(slice(None),) * axis + (k,)] = np.asarray(x)
        return _adopt(out)  # fresh and aligned: adopted (see ``stack``)

    def concat(self, xs: Sequence[Any], axis: int) -> jax.Array:
        """``jnp.concatenate``."""
        return jnp.concatenate(list(xs), axis=axis)

    def take(self, x: Any, axis: int, index: int) -> jax.Array:
        """``x`` at ``index`` along ``axis`` (axis removed): one jitted dispatch with the index
        traced (compiled once per shape and axis; 10-40 us here against 80-185 us for
        ``x[:, k]``, which dispatches a slice and a reshape). Out-of-range indices raise."""
        n = x.shape[axis]
        k = index + n if index < 0 else index
        if not 0 <= k < n:
            raise BackendError(f"index {index} is out of range for axis {axis} of size {n}")
        return _take(x, axis, np.int64(k))

    def mask_rows(self, x: Any, axis: int, stop: int) -> jax.Array:
        """Rows ``stop ..`` along ``axis`` zeroed: one jitted dispatch with ``stop`` traced
        (compiled once per shape and axis, not per ``stop``)."""
        return _mask_rows(x, axis, np.int32(stop))

    def permute_axes(self, x: Any, perm: tuple[int, ...]) -> jax.Array:
        """``jnp.transpose``."""
        return jnp.transpose(x, perm)

    def zeros(self, shape: tuple[int, ...], dtype: DType) -> jax.Array:
        """``jnp.zeros``."""
        return jnp.zeros(shape, dtype=_DTYPES[dtype])

    def cast_like(self, x: Any, like: Any) -> jax.Array:
        """``x.astype(like.dtype)``."""
        return x.astype(like.dtype)

    def broadcast_to(self, x: Any, shape: tuple[int, ...]) -> jax.Array:
        """``jnp.broadcast_to``."""
        return jnp.broadcast_to(x, shape)

    # Block buffers live on the device (``host_blocks=False``: jitted updates that donate the
    # buffer, in place) or in host NumPy arrays (``host_blocks=True``: a write is a NumPy copy
    # of the value, which waits for it). See ``runtime/block_store.py``.
    def block_alloc(self, rows: int, like: Any) -> Any:
        """``zeros((rows,) + like.shape)`` (NumPy with ``host_blocks``)."""
        shape = (rows,) + tuple(like.shape)
        if self.host_blocks:
            return np.zeros(shape, dtype=np.dtype(like.dtype))
        return jnp.zeros(shape, dtype=like.dtype)

    def block_copy(self, buf: Any) -> Any:
        """A copy (on the host for CPU arrays: ``jnp.array(copy=True)`` compiles once per shape)."""
        if isinstance(buf, np.ndarray):
            return buf.copy()
        return _host_copy(np.asarray(buf)) if _on_cpu([buf]) else jnp.array(buf, copy=True)

    def block_write(self, buf: Any, index: int, x: Any) -> Any:
        """A jitted ``dynamic_update_index_in_dim`` donating ``buf`` (compiled once per buffer
        shape; in place on CPU and GPU), or a NumPy row assignment."""
        if isinstance(buf, np.ndarray):
            buf[index] = np.asarray(x)
            return buf
        return _block_write(buf, x, index)

    def block_write_rows(self, buf: Any, dst: int, xs: Any, axis: int, src: int, count: int) -> Any:
        """One jitted masked update donating ``buf`` (compiled once per buffer and rows shape,
        not per count), or a NumPy slice assignment."""
        if isinstance(buf, np.ndarray):
            buf[dst : dst + count] = np.moveaxis(np.asarray(xs), axis, 0)[src : src + count]
            return buf
        return _block_write_rows(buf, xs, axis, dst, src, count)

    def block_row(self, buf: Any, index: int) -> jax.Array:
        """A jitted ``dynamic_index_in_dim`` (a new array), or a copy of the host row."""
        if isinstance(buf, np.ndarray):
            return _host_copy(buf[index])  # the row is overwritten later: copy it now
        return _block_row(buf, index)

    def block_rows(self, pieces: Sequence[tuple[Any, int, int]], axis: int, size: int) -> jax.Array:
        """CPU and host buffers: one host copy of the rows (nothing compiled per read length).
        Accelerator buffers: ``jnp.concatenate`` of the slices, then a zero pad."""
        if all(isinstance(b, np.ndarray) or _on_cpu([b]) for b, _, _ in pieces):
            parts = [np.moveaxis(np.asarray(b)[lo:hi], 0, axis) for b, lo, hi in pieces]  # views
            n = sum(p.shape[axis] for p in parts)
            shape = list(parts[0].shape)
            shape[axis] = size
            out = host_empty(shape, parts[0].dtype, zero=size > n)
            lead, k = (slice(None),) * axis, 0
            for p in parts:  # a fresh copy: the result must not alias a buffer later writes update
                out[lead + (slice(k, k + p.shape[axis]),)] = p
                k += p.shape[axis]
            return _adopt(out)  # fresh and aligned: adopted (see ``stack``)
        x = jnp.concatenate([b[lo:hi] for b, lo, hi in pieces], axis=0)
        if size > x.shape[0]:
            x = jnp.concatenate([x, jnp.zeros((size - x.shape[0],) + x.shape[1:], x.dtype)], axis=0)
        return jnp.moveaxis(x, 0, axis)

    def any_true(self, x: Any) -> bool:
        """``bool(jnp.any(x))``."""
        return bool(jnp.any(x))

    def all_true(self, x: Any) -> bool:
        """``bool(jnp.all(x))``."""
        return bool(jnp.all(x))

    def to_dlpack(self, x: Any) -> Any:
        """A ``jax.Array`` exports itself through ``__dlpack__``."""
        return x

    def from_dlpack(self, obj: Any) -> jax.Array:
        """``jax.dlpack.from_dlpack`` (zero-copy for aligned CPU buffers; int64/float64 kept)."""
        if isinstance(obj, jax.Array):  # already ours: skip the ~75 us DLPack round trip
            return obj
        try:
            return jax.dlpack.from_dlpack(obj)
        except (TypeError, BufferError, RuntimeError) as e:
            raise BackendError(
                f"jax cannot import {type(obj).__name__} through DLPack ({e}); pass an object with "
                "__dlpack__ (e.g. from TorchBackend.to_dlpack), not a capsule"
            ) from e

    def compile(self, fn: Callable[..., Any], donate: tuple[int, ...] = ()) -> Callable[..., Any]:
        """``jax.jit`` (every argument on the device: :func:`jit`), with ``donate_argnums=donate``."""
        return jit(fn, donate_argnums=donate) if donate else jit(fn)

    def nbytes(self, x: Any) -> int:
        """``itemsize * prod(shape)`` (``x.nbytes`` is ~5x slower on a jax Array, and the
        store asks for it at every put and free)."""
        return x.dtype.itemsize * math.prod(x.shape)
