"""The PyTorch backend: kernels on ``torch.Tensor`` values (eager by default).

Tensors are treated as immutable: kernels never write into inputs, and ``IDENTITY``
returns its input. ``torch.compile`` is used only when asked for (``use_compile=True``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, final

import numpy as np
import torch

from timerl.backends import base, native
from timerl.backends.base import AbstractBackend, Kernel, accumulate_dtype
from timerl.errors import BackendError
from timerl.pdg.ops import DType, OpKind

log = logging.getLogger(__name__)

_DTYPES: dict[DType, torch.dtype] = {
    DType.float32: torch.float32,
    DType.float64: torch.float64,
    DType.int32: torch.int32,
    DType.int64: torch.int64,
    DType.bool_: torch.bool,
}
_FROM_TORCH: dict[torch.dtype, DType] = {v: k for k, v in _DTYPES.items()}


def _acc_dtype(x: torch.Tensor) -> torch.dtype:
    dt = _FROM_TORCH.get(x.dtype)
    if dt is None:
        return x.dtype
    return _DTYPES[accumulate_dtype(dt)]


def _sum(x: torch.Tensor, axes: tuple[int, ...], keepdim: bool) -> torch.Tensor:
    if not axes:  # torch reduces every dim for dim=(); NumPy reduces none
        return x.to(_acc_dtype(x))
    return torch.sum(x, dim=axes, keepdim=keepdim, dtype=_acc_dtype(x))


def _minmax(fn: Callable[..., torch.Tensor]) -> Callable[[torch.Tensor, tuple[int, ...], bool], torch.Tensor]:
    def reduce(x: torch.Tensor, axes: tuple[int, ...], keepdim: bool) -> torch.Tensor:
        return x if not axes else fn(x, dim=axes, keepdim=keepdim)

    return reduce


def _pad(x: torch.Tensor, axis: int, before: int, after: int) -> torch.Tensor:
    shape = list(x.shape)
    n = shape[axis]
    shape[axis] = before + n + after
    out = torch.zeros(shape, dtype=x.dtype, device=x.device)
    out.narrow(axis, before, n).copy_(x)
    return out


def _random(be: AbstractBackend, shape: tuple[int, ...], dtype: DType, normal: bool) -> torch.Tensor:
    assert isinstance(be, TorchBackend)
    sample = torch.randn if normal else torch.rand
    return sample(shape, generator=be.generator, dtype=_DTYPES[dtype])


def _one_hot(be: AbstractBackend, c: base.KernelCall, xs: Sequence[Any]) -> torch.Tensor:
    idx = xs[0].to(torch.int64)
    out = torch.nn.functional.one_hot(idx, int(c.attr("num_classes")))
    return out.to(_DTYPES[c.dtype_attr()])


def _gather(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    return torch.gather(x, -1, idx.to(torch.int64).unsqueeze(-1)).squeeze(-1)


def _take_batched(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    return x[torch.arange(x.shape[0], device=x.device)[:, None], idx.to(torch.int64)]


def _index_add(g: torch.Tensor, idx: torch.Tensor, a: int, n: int) -> torch.Tensor:
    out = g.new_zeros(tuple(g.shape[:a]) + (n,) + tuple(g.shape[a + 1 :]))
    return out.index_add_(a, idx.to(torch.int64), g)


def _index_add_batched(g: torch.Tensor, idx: torch.Tensor, n: int) -> torch.Tensor:
    out = g.new_zeros((g.shape[0], n) + tuple(g.shape[2:]))
    rows = torch.arange(g.shape[0], device=g.device)[:, None].expand(idx.shape)
    return out.index_put_((rows, idx.to(torch.int64)), g.contiguous(), accumulate=True)


def _tanh(x: torch.Tensor) -> torch.Tensor:
    """``tanh``: on CPU float tensors a native kernel (float32, where it is faster on this CPU:
    ``backends/native.py``) or NumPy's ufunc, writing into a new tensor through a shared view
    (no copy). ``torch.tanh`` (Sleef, one thread) was the slowest of the three on both CPUs
    measured (torch 2.13 / NumPy 2.4): per (512, 64) 115-130 us against NumPy's 15 on an
    AVX-512 CPU, 101 us against the native kernel's 25 on an AVX2 one; per (128000, 64) 28-36
    vs 3.1 ms, 27 vs 4.3 ms. Within 1.4 ulp of the float64 result (the native kernel: 3.1,
    ``native.MAX_ULP`` checked when it is built). PPO's actor and critic
    evaluate it 2 x 250 times per acting loop and over the whole rollout when learning.
    Strided views give the same values as their copies (a lazily negated view is resolved
    first). ``torch.tanh`` elsewhere (small tensors, other devices and dtypes, inside
    ``torch.compile``, tensors with autograd)."""
    if (
        x.device.type != "cpu"
        or x.dtype not in _NUMPY_UFUNC_DTYPES
        or x.requires_grad
        or torch.compiler.is_compiling()
        or x.numel() < _TANH_SMALL
    ):
        return torch.tanh(x)
    x = x.resolve_neg()
    kernel = native.tanh_f32() if x.dtype == torch.float32 else None
    if kernel is not None:
        x = x.contiguous()
        out = torch.empty(x.shape, dtype=x.dtype)
        kernel(x.data_ptr(), out.data_ptr(), x.numel())
        return out
    out = torch.empty_like(x)
    np.tanh(x.numpy(), out=out.numpy())
    return out


_NUMPY_UFUNC_DTYPES = frozenset({torch.float32, torch.float64})
_TANH_SMALL = 4096
"""Below this many elements ``torch.tanh``: the call costs more than the kernel there (one
thread, (8, 64): ``torch.tanh`` 3.6 us, the native kernel through ctypes ~9, NumPy 4.7)."""


def _tanh_grad(g: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``g * (1 - y * y)``: ATen's one-pass ``tanh_backward`` where it applies (equal shapes)."""
    if g.shape == y.shape and g.dtype == y.dtype and g.is_floating_point():
        return torch.ops.aten.tanh_backward(g, y)
    return g * (1 - y * y)


def _matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b``; a product with 2-8 output columns, more rows than columns and at least 32,768
    elements in ``a`` runs as ``(b^T @ a^T)^T``. Measured on this CPU with torch 2.13, one
    thread: ``(64, 128000) @ (128000, 2)`` (the weight gradient of a 2-action policy head)
    42-46 ms as is, 5-6 ms swapped; ``(512, 64) @ (64, 2)`` (acting) 36 -> 18 us, ``n = 4`` 33 ->
    9 us, ``n = 16`` 14 -> 17 us (hence the bound); ``(8, 64) @ (64, n)`` 2 -> 4-5 us. The
    swapped product is made contiguous (~4 us at 512 rows): its transposed layout made every
    reduction over the last dim after it strided (``argmax`` of a (512, 2) 100 -> 9 us, of a
    (128000, 2) 16 -> 1.5 ms)."""
    if a.ndim == b.ndim > 2 and base.partly_broadcast(tuple(a.shape[:-2]), tuple(b.shape[:-2])):
        return base.matmul_broadcast(torch.einsum, a, b)
    m, n = a.shape[-2] if a.ndim >= 2 else 1, b.shape[-1] if b.ndim >= 2 else 1
    if a.ndim >= 2 and b.ndim >= 2 and 2 <= n <= 8 and n < m and m * a.shape[-1] >= 32768:
        return (b.mT @ a.mT).mT.contiguous()
    return torch.matmul(a, b)


def _shift_rows(y: torch.Tensor, axis: int, s: int) -> torch.Tensor:
    """Rows ``s ..`` of ``y`` along ``axis``, then ``s`` zero rows (``SUFFIX_SUM``)."""
    shape = list(y.shape)
    shape[axis] = s
    return torch.cat([y.narrow(axis, s, y.shape[axis] - s), y.new_zeros(shape)], dim=axis)


def _linear_scan(x: torch.Tensor, c: torch.Tensor, y0: torch.Tensor, reverse: bool) -> torch.Tensor:
    """``y[k] = x + c * y[k +/- 1]`` along dim 0 from ``y0`` at the last/first row (``x``, ``c``:
    one row fewer than ``y``; see ``OpKind.LINEAR_SCAN``). Each step writes into its row of the
    output (``mul`` then ``add_``: the same values as ``x + c * y``): (249, 512) 2.9 -> 2.1 ms.
    Rows are taken per step, not all at once with ``unbind``: hundreds of live views made the
    garbage collector run a full pass in PPO's learner (26.7 ms per scan, 3.9 with it off)."""
    m = int(x.shape[0])
    out = torch.empty((m + 1,) + tuple(x.shape[1:]), dtype=x.dtype)
    out[m if reverse else 0].copy_(y0)
    for k in range(m - 1, -1, -1) if reverse else range(m):
        row, prev = (k, k + 1) if reverse else (k + 1, k)
        y = out[row]
        torch.mul(c[k], out[prev], out=y)
        y.add_(x[k])
    return out


_KERNELS: dict[OpKind, Kernel] = {
    **base.shared_kernels(),
    OpKind.RAND_UNIFORM: base.random(lambda be, s, dt: _random(be, s, dt, False)),
    OpKind.RAND_NORMAL: base.random(lambda be, s, dt: _random(be, s, dt, True)),
    # elementwise unary
    OpKind.NEG: base.unary(torch.neg),
    OpKind.EXP: base.unary(torch.exp),
    OpKind.LOG: base.unary(torch.log),
    OpKind.SQRT: base.unary(torch.sqrt),
    OpKind.TANH: base.unary(_tanh),
    OpKind.ABS: base.unary(torch.abs),
    OpKind.RELU: base.unary(torch.relu),
    OpKind.SIGMOID: base.unary(torch.sigmoid),
    OpKind.SIGN: base.unary(torch.sign),
    OpKind.LOGICAL_NOT: base.unary(torch.logical_not),
    OpKind.CAST: lambda be, c, xs: xs[0].to(_DTYPES[c.dtype_attr()]),
    # elementwise binary / ternary
    OpKind.ADD: base.elementwise(torch.add),
    OpKind.SUB: base.elementwise(torch.sub),
    OpKind.MUL: base.elementwise(torch.mul),
    OpKind.DIV: base.elementwise(torch.div),
    OpKind.POW: base.elementwise(torch.pow),
    OpKind.TANH_GRAD: base.elementwise(_tanh_grad),
    OpKind.MAXIMUM: base.elementwise(torch.maximum),
    OpKind.MINIMUM: base.elementwise(torch.minimum),
    OpKind.LT: base.elementwise(torch.lt),
    OpKind.LE: base.elementwise(torch.le),
    OpKind.GT: base.elementwise(torch.gt),
    OpKind.GE: base.elementwise(torch.ge),
    OpKind.EQ: base.elementwise(torch.eq),
    OpKind.NE: base.elementwise(torch.ne),
    OpKind.LOGICAL_AND: base.elementwise(torch.logical_and),
    OpKind.LOGICAL_OR: base.elementwise(torch.logical_or),
    OpKind.WHERE: base.elementwise(torch.where),
    # reductions / scans
    OpKind.SUM: base.reduction(_sum),
    OpKind.MAX: base.reduction(_minmax(torch.amax)),
    OpKind.MIN: base.reduction(_minmax(torch.amin)),
    OpKind.ARGMAX: base.along_dim(lambda x, a: torch.argmax(x, dim=a)),
    OpKind.CUMSUM: base.along_dim(lambda x, a: torch.cumsum(x, dim=a, dtype=_acc_dtype(x))),
    OpKind.DISCOUNTED_SUM: base.discounted_sum(lambda x, a: torch.sum(x, dim=a)),
    OpKind.LINEAR_SCAN: base.linear_scan(_linear_scan),
    OpKind.SUFFIX_SUM: base.suffix_sum(_shift_rows),
    OpKind.LOG_SOFTMAX: base.along_dim(lambda x, a: torch.log_softmax(x, dim=a)),
    OpKind.SOFTMAX: base.along_dim(lambda x, a: torch.softmax(x, dim=a)),
    # layout / indexing
    OpKind.PERMUTE: base.permute(torch.permute),
    OpKind.SQUEEZE: base.along_dim(lambda x, a: torch.squeeze(x, a)),
    OpKind.UNSQUEEZE: base.along_dim(torch.unsqueeze),
    OpKind.CAT: base.multi_along_dim(lambda xs, a: torch.cat(list(xs), dim=a)),
    OpKind.STACK: base.multi_along_dim(lambda xs, a: torch.stack(list(xs), dim=a)),
    OpKind.PAD_SLICE: base.pad_slice(_pad),
    OpKind.GATHER: base.gather(_gather),
    OpKind.ONE_HOT: _one_hot,
    OpKind.TAKE: base.take_rows(lambda x, i, a: torch.index_select(x, a, i.to(torch.int64)), _take_batched),
    OpKind.INDEX_ADD: base.index_add_rows(_index_add, _index_add_batched),
    OpKind.ARGSORT: base.along_dim(lambda x, a: torch.argsort(x, dim=a, stable=True)),
    OpKind.MATMUL: base.matmul(_matmul),
}


_INTO: dict[OpKind, Callable[..., torch.Tensor]] = {
    OpKind.ADD: torch.add,
    OpKind.SUB: torch.sub,
    OpKind.MUL: torch.mul,
    OpKind.DIV: torch.div,
    OpKind.MAXIMUM: torch.maximum,
    OpKind.MINIMUM: torch.minimum,
}
"""Binary elementwise kernels (``base.elementwise`` of these) that :meth:`TorchBackend.run_into`
runs with ``out=``: the same kernel, so the values are the same bit for bit."""


@final
def _on_jax_host(obj: Any) -> bool:
    """Whether ``obj`` is a ``jax.Array`` on one CPU device (no JAX import: its type's module)."""
    if not type(obj).__module__.startswith("jax"):
        return False
    dev = getattr(obj, "device", None)
    return getattr(dev, "platform", None) == "cpu"


class TorchBackend(AbstractBackend):
    """Runs ops with eager PyTorch; RNG is one ``torch.Generator``."""

    name: ClassVar[str] = "torch"
    kernels: ClassVar[Mapping[OpKind, Kernel]] = _KERNELS
    donates: ClassVar[bool] = True  # through run_into (regions write one member's result in place)
    scans: ClassVar[str] = "host"

    def run_into(
        self,
        op: Any,
        inputs: Sequence[Any],
        batch: tuple[int, ...],
        batched: Sequence[bool],
        env: Mapping[Any, int],
        out: Any,
    ) -> Any | None:
        """``torch.sub(a, b, out=out)`` for the binary elementwise ops of :data:`_INTO`, when the
        broadcast result has ``out``'s shape and dtype (float); else None."""
        fn = _INTO.get(op.kind)
        if (
            fn is None
            or len(inputs) != 2
            or not isinstance(out, torch.Tensor)
            or not out.dtype.is_floating_point
        ):
            return None
        batch = tuple(int(b) for b in batch)
        flags = tuple(bool(b) for b in batched) if batch else (False, False)
        call = base.KernelCall(op, batch, flags, env)
        if batch and not call.any_batched:  # run() would broadcast the result afterwards
            return None
        xs = base.align_ranks(call, inputs)
        if not all(isinstance(x, torch.Tensor) for x in xs):
            return None
        if torch.broadcast_shapes(*(x.shape for x in xs)) != out.shape or torch.result_type(*xs) != out.dtype:
            return None
        return fn(*xs, out=out)

    def __init__(self, seed: int = 0, use_compile: bool = False) -> None:
        super().__init__()
        self.generator = torch.Generator().manual_seed(seed)
        self.use_compile = use_compile
        # where tensors are made and ops run; imports from other devices are copied here
        self.device = torch.device("cpu")
        self._warned_device_copy = False

    def seed(self, seed: int) -> None:
        """Reset the generator."""
        self.generator.manual_seed(seed)

    def from_numpy(self, a: np.ndarray) -> torch.Tensor:
        """Copy into a new tensor with the same dtype."""
        # A fresh torch allocation: 64-byte aligned, so DLPack exports stay zero-copy.
        a = np.asarray(a, order="C")
        if not a.flags.writeable:  # from_numpy warns about read-only arrays; torch.tensor copies
            return torch.tensor(a)
        return torch.from_numpy(a).clone()

    def to_numpy(self, x: Any) -> np.ndarray:
        """A NumPy view of ``x`` (shares memory: treat it as read-only)."""
        return x.detach().cpu().numpy()

    def stack(self, xs: Sequence[Any], axis: int) -> torch.Tensor:
        """``torch.stack``."""
        return torch.stack(list(xs), dim=axis)

    def concat(self, xs: Sequence[Any], axis: int) -> torch.Tensor:
        """``torch.cat``."""
        return torch.cat(list(xs), dim=axis)

    def take(self, x: Any, axis: int, index: int) -> torch.Tensor:
        """``x`` at ``index`` along ``axis`` (axis removed; a view)."""
        return torch.select(x, axis, index)

    def mask_rows(self, x: Any, axis: int, stop: int) -> torch.Tensor:
        """A copy of ``x`` with rows ``stop ..`` along ``axis`` zeroed."""
        out = x.clone()
        out.narrow(axis, stop, x.shape[axis] - stop).zero_()
        return out

    def permute_axes(self, x: Any, perm: tuple[int, ...]) -> torch.Tensor:
        """``x.permute(perm)`` (a view)."""
        return x.permute(perm)

    def zeros(self, shape: tuple[int, ...], dtype: DType) -> torch.Tensor:
        """``torch.zeros``."""
        return torch.zeros(shape, dtype=_DTYPES[dtype])

    def cast_like(self, x: Any, like: Any) -> torch.Tensor:
        """``x.to(like.dtype)``."""
        return x.to(like.dtype)

    def broadcast_to(self, x: Any, shape: tuple[int, ...]) -> torch.Tensor:
        """``torch.broadcast_to`` (a stride-0 view)."""
        return torch.broadcast_to(x, shape)

    def block_alloc(self, rows: int, like: Any) -> torch.Tensor:
        """``torch.zeros((rows,) + like.shape)``."""
        return torch.zeros((rows,) + tuple(like.shape), dtype=like.dtype, device=like.device)

    def block_copy(self, buf: Any) -> torch.Tensor:
        """``buf.clone()``."""
        return buf.clone()

    def block_write(self, buf: Any, index: int, x: Any) -> torch.Tensor:
        """``buf[index].copy_(x)`` (in place)."""
        buf[index].copy_(x)
        return buf

    def block_write_rows(self, buf: Any, dst: int, xs: Any, axis: int, src: int, count: int) -> torch.Tensor:
        """``buf[dst:dst + count].copy_(rows)`` (in place)."""
        buf[dst : dst + count].copy_(xs.movedim(axis, 0)[src : src + count])
        return buf

    def block_row(self, buf: Any, index: int) -> torch.Tensor:
        """``buf[index]``: a contiguous view."""
        return buf[index]

    def block_rows(self, pieces: Sequence[tuple[Any, int, int]], axis: int, size: int) -> torch.Tensor:
        """A view ``buf[start:stop]`` for one piece read at ``axis == 0``; else one contiguous
        copy (the layout ``torch.stack`` gives, so reductions round the same way)."""
        views = [buf[a:b] for buf, a, b in pieces]
        n = sum(int(v.shape[0]) for v in views)
        if len(views) == 1 and axis == 0 and size == n:
            return views[0]
        if axis:
            views = [v.movedim(0, axis) for v in views]
        if size > n:
            shape = list(views[0].shape)
            shape[axis] = size - n
            views.append(torch.zeros(shape, dtype=views[0].dtype, device=views[0].device))
        return torch.cat(views, dim=axis) if len(views) > 1 else views[0].contiguous()

    def any_true(self, x: Any) -> bool:
        """``bool(x.any())``."""
        return bool(torch.any(x))

    def all_true(self, x: Any) -> bool:
        """``bool(x.all())``."""
        return bool(torch.all(x))

    def to_dlpack(self, x: Any) -> torch.Tensor:
        """The detached tensor (tensors requiring grad cannot be exported)."""
        return x.detach()

    def from_dlpack(self, obj: Any) -> torch.Tensor:
        """``torch.from_dlpack``: zero-copy; the result aliases ``obj``'s buffer (do not write into it).

        A JAX array on the host goes through its NumPy view (``np.asarray``: 7 us against 16 us
        for JAX's own ``__dlpack__``, which checks its sharding at every call), straight to a
        tensor on this CPU backend (an (8, 4) array: 14.6 -> ~6 us)."""
        host = _on_jax_host(obj) and self.device.type == "cpu"
        try:
            x = torch.from_dlpack(np.asarray(obj) if host else obj)
        except (TypeError, BufferError, RuntimeError) as e:
            raise BackendError(f"torch cannot import {type(obj).__name__} through DLPack: {e}") from e
        if host:  # a host array on this CPU backend: no device to compare
            return x
        if x.device != self.device:  # e.g. a JAX env's arrays on a GPU: copied to where this backend computes
            if not self._warned_device_copy:
                self._warned_device_copy = True
                log.warning(
                    "the torch backend computes on %s; arrays imported from %s (e.g. a JAX env on a GPU) "
                    "are copied there at every step; use backend='jax' to keep the env and the program "
                    "on that device",
                    self.device,
                    x.device,
                )
            x = x.to(self.device)
        return x

    def compile(self, fn: Callable[..., Any], donate: tuple[int, ...] = ()) -> Callable[..., Any]:
        """``fn`` itself, or ``torch.compile(fn)`` when the backend was built with
        ``use_compile=True`` (``donate`` is ignored: the region itself writes into donated
        buffers through :meth:`run_into`)."""
        return torch.compile(fn) if self.use_compile else fn

    def nbytes(self, x: Any) -> int:
        """``numel * element_size``."""
        return int(x.numel() * x.element_size())

    def to_host(self, x: Any) -> Any:
        """On a GPU: a pinned (page-locked) host tensor filled by an asynchronous copy
        (untested: no GPU in this project's runs); on CPU: a NumPy copy."""
        if x.is_cuda:  # pragma: no cover - needs a GPU
            h = torch.empty(x.shape, dtype=x.dtype, pin_memory=True)
            h.copy_(x, non_blocking=True)
            return h
        return np.array(x.detach().numpy(), copy=True)

    def from_host(self, h: Any) -> Any:
        """Back to the device: an asynchronous copy from pinned memory on a GPU (untested),
        a fresh tensor from the NumPy copy on CPU."""
        if isinstance(h, torch.Tensor):  # pragma: no cover - needs a GPU
            return h.to("cuda", non_blocking=True)
        return self.from_numpy(h)

    def host_nbytes(self, h: Any) -> int:
        """Bytes of a host copy (NumPy array or pinned tensor)."""
        return int(h.nbytes) if isinstance(h, np.ndarray) else int(h.numel() * h.element_size())
