"""The contractions LoopTune schedules: ``Y[out] = sum_{reduction dims} X0[...] * X1[...]``.

A :class:`Kernel` is written as text, each tensor indexed by affine expressions of
single-letter iteration dims (sums of ``dim`` or ``coeff*dim`` terms)::

    mm      A[m,k] * B[k,n] -> C[m,n]
    bmm     A[b,m,k] * B[b,k,n] -> C[b,m,n]
    conv1d  X[i+r,c] * W[r,c,o] -> Y[i,o]            (valid 1-D convolution, channels last)
    conv2d  X[h+r,w+s,c] * W[r,s,c,o] -> Y[h,w,o]    (valid 2-D convolution)

The output is indexed by distinct plain dims; every other dim is a reduction dim. All
tensors are float32, row-major, and an input's axis extent is the largest value its
expression takes plus one (``X[i+r, c]``: ``I + R - 1`` rows). Everything the loop-nest
IR, the lowering and the features need comes from these index expressions: the stride of
a loop in a tensor is the sum over its axes of the dim's coefficient times the axis's
row-major stride (see :meth:`Access.stride`).

NumPy references (:func:`numpy_reference`) are the baseline the tuned nests are compared
with: OpenBLAS ``matmul`` for ``mm`` and ``bmm``, im2col (``sliding_window_view``, one
copy) followed by one ``matmul`` for the convolutions. This module imports only NumPy,
so a child process timing NumPy can import it cheaply.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from timerl.errors import TimeRLError

Term = tuple[str, int]  # (dim, coefficient)
Axis = tuple[Term, ...]  # an affine index: the sum of its terms

_TENSOR_RE = re.compile(r"^([A-Za-z][A-Za-z0-9_]*)\[([^\]]*)\]$")
_TERM_RE = re.compile(r"^(?:(\d+)\*)?([a-z])$")


@dataclass(frozen=True)
class Access:
    """A tensor and the affine index of each of its axes (``X[i+r, c]``)."""

    tensor: str
    axes: tuple[Axis, ...]

    @property
    def dims(self) -> tuple[str, ...]:
        """The dims the index uses, in order of first use."""
        out: list[str] = []
        for axis in self.axes:
            for d, _ in axis:
                if d not in out:
                    out.append(d)
        return tuple(out)

    def shape(self, extents: Mapping[str, int]) -> tuple[int, ...]:
        """Axis extents: ``1 + sum(coeff * (extent - 1))`` per axis."""
        return tuple(1 + sum(c * (extents[d] - 1) for d, c in axis) for axis in self.axes)

    def stride(self, dim: str, extents: Mapping[str, int]) -> int:
        """Elements the address moves when ``dim`` grows by one (0: the tensor does not use it)."""
        shape = self.shape(extents)
        out, axis_stride = 0, 1
        for axis, size in zip(reversed(self.axes), reversed(shape), strict=True):
            out += axis_stride * sum(c for d, c in axis if d == dim)
            axis_stride *= size
        return out

    def text(self, exprs: Mapping[str, str] | None = None, name: str | None = None) -> str:
        """``X[i + r, c]``, with each dim replaced by ``exprs[dim]`` if given (in parentheses
        where a coefficient multiplies it)."""

        def term(d: str, c: int) -> str:
            e = d if exprs is None else exprs[d]
            return e if c == 1 else (f"{c} * {e}" if " " not in e else f"{c} * ({e})")

        axes = [" + ".join(term(d, c) for d, c in axis) for axis in self.axes]
        return f"{name or self.tensor}[{', '.join(axes)}]"


@dataclass(frozen=True)
class Kernel:
    """``out = sum over the reduction dims of lhs * rhs`` (see the module doc).

    ``dims`` orders the sizes of a :class:`~timerl.envs.looptune.ir.Problem`; ``order``
    is the untuned compute nest's loop order: the output dims but the last, the reduction
    dims, then the last output dim (unit stride in the output; the only dim the lowering
    vectorises), as ``m, k, n`` for matmul."""

    name: str
    dims: tuple[str, ...]
    lhs: Access
    rhs: Access
    out: Access

    @property
    def out_dims(self) -> tuple[str, ...]:
        return self.out.dims

    @property
    def reduction_dims(self) -> tuple[str, ...]:
        return tuple(d for d in self.dims if d not in self.out.dims)

    @property
    def vector_dim(self) -> str:
        """The output's last dim: unit stride in the output (and the accumulator)."""
        return self.out.dims[-1]

    @property
    def order(self) -> tuple[str, ...]:
        return (*self.out_dims[:-1], *self.reduction_dims, self.vector_dim)

    @property
    def accesses(self) -> tuple[Access, Access, Access]:
        """The compute body's accesses: ``lhs``, ``rhs`` and the accumulator (``out``'s index)."""
        return (self.lhs, self.rhs, self.out)

    @property
    def text(self) -> str:
        return f"{self.lhs.text()} * {self.rhs.text()} -> {self.out.text()}"


def _parse_access(text: str, where: str) -> Access:
    m = _TENSOR_RE.match(text)
    if not m:
        raise TimeRLError(f"{where}: cannot read tensor {text!r}; write e.g. X[i+r,c]")
    axes = []
    for axis_text in m.group(2).split(","):
        terms = []
        for t in axis_text.split("+"):
            tm = _TERM_RE.match(t)
            if not tm:
                raise TimeRLError(
                    f"{where}: index {axis_text!r} of {m.group(1)} is not supported; LoopTune "
                    "indexes with sums of single-letter dims with positive integer coefficients "
                    "(i+r, 2*i+r)"
                )
            terms.append((tm.group(2), int(tm.group(1) or 1)))
        if len({d for d, _ in terms}) != len(terms):
            raise TimeRLError(f"{where}: index {axis_text!r} repeats a dim")
        axes.append(tuple(terms))
    return Access(m.group(1), tuple(axes))


def parse_kernel(name: str, text: str, dims: str | None = None) -> Kernel:
    """A :class:`Kernel` from ``"A[m,k] * B[k,n] -> C[m,n]"``; ``dims`` (e.g. ``"mnk"``)
    orders the problem sizes (default: output dims, then reduction dims, by first use).
    Raises :class:`TimeRLError` naming what LoopTune cannot express."""
    where = f"kernel {name!r} ({text})"
    body = text.replace(" ", "")
    if body.count("->") != 1:
        raise TimeRLError(f"{where}: write one '->' before the output, e.g. A[m,k]*B[k,n]->C[m,n]")
    lhs_text, out_text = body.split("->")
    operands = re.split(r"\*(?![^\[]*\])", lhs_text)  # '*' outside brackets
    if len(operands) != 2:
        raise TimeRLError(f"{where}: {len(operands)} operands; LoopTune schedules products of exactly two")
    lhs, rhs = (_parse_access(o, where) for o in operands)
    out = _parse_access(out_text, where)
    if any(len(axis) != 1 or axis[0][1] != 1 for axis in out.axes) or len(set(out.dims)) != len(out.axes):
        raise TimeRLError(f"{where}: the output must be indexed by distinct plain dims (Y[i,o])")
    names = [lhs.tensor, rhs.tensor, out.tensor]
    if len(set(names)) != 3:
        raise TimeRLError(f"{where}: the three tensors need distinct names, got {names}")
    missing = [d for d in out.dims if d not in lhs.dims + rhs.dims]
    if missing:
        raise TimeRLError(f"{where}: output dims {missing} index no operand (broadcasts are not supported)")
    used = list(out.dims) + [d for d in lhs.dims + rhs.dims if d not in out.dims]
    used = list(dict.fromkeys(used))
    if not [d for d in used if d not in out.dims]:
        raise TimeRLError(f"{where}: no reduction dim; LoopTune schedules contractions")
    if dims is None:
        order = tuple(used)
    else:
        order = tuple(dims)
        if sorted(order) != sorted(used):
            raise TimeRLError(f"{where}: dims={dims!r} must list each of the dims {''.join(used)} once")
    return Kernel(name, order, lhs, rhs, out)


MM = parse_kernel("mm", "A[m,k] * B[k,n] -> C[m,n]", "mnk")
BMM = parse_kernel("bmm", "A[b,m,k] * B[b,k,n] -> C[b,m,n]", "bmnk")
CONV1D = parse_kernel("conv1d", "X[i+r,c] * W[r,c,o] -> Y[i,o]", "iorc")
CONV2D = parse_kernel("conv2d", "X[h+r,w+s,c] * W[r,s,c,o] -> Y[h,w,o]", "hworsc")
KERNELS: dict[str, Kernel] = {k.name: k for k in (MM, BMM, CONV1D, CONV2D)}


def kernel(name: str) -> Kernel:
    """The built-in kernel ``name`` (``mm``, ``bmm``, ``conv1d``, ``conv2d``)."""
    if name not in KERNELS:
        raise TimeRLError(f"unknown LoopTune kernel {name!r}; built in: {', '.join(KERNELS)}")
    return KERNELS[name]


# --- NumPy: reference results and the baseline --------------------------------------


def _im2col_1d(x: np.ndarray, r: int) -> np.ndarray:
    # (I + R - 1, C) -> (I, R * C), rows ordered (r, c) like W's first two axes
    win = np.lib.stride_tricks.sliding_window_view(x, r, axis=0)  # (I, C, R)
    return np.ascontiguousarray(win.transpose(0, 2, 1)).reshape(win.shape[0], -1)


def _im2col_2d(x: np.ndarray, r: int, s: int) -> np.ndarray:
    # (H + R - 1, W + S - 1, C) -> (H * W, R * S * C), columns ordered (r, s, c)
    win = np.lib.stride_tricks.sliding_window_view(x, (r, s), axis=(0, 1))  # (H, W, C, R, S)
    cols = np.ascontiguousarray(win.transpose(0, 1, 3, 4, 2))
    return cols.reshape(win.shape[0] * win.shape[1], -1)


def _conv1d(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    return _im2col_1d(x, w.shape[0]) @ w.reshape(-1, w.shape[-1])


def _conv2d(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    h, wd = x.shape[0] - w.shape[0] + 1, x.shape[1] - w.shape[1] + 1
    out = _im2col_2d(x, w.shape[0], w.shape[1]) @ w.reshape(-1, w.shape[-1])
    return out.reshape(h, wd, w.shape[-1])


_NUMPY: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "mm": np.matmul,
    "bmm": np.matmul,
    "conv1d": _conv1d,
    "conv2d": _conv2d,
}


def has_numpy_baseline(k: Kernel) -> bool:
    return k.name in _NUMPY and KERNELS.get(k.name) == k


def numpy_reference(k: Kernel) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """``f(lhs, rhs) -> out`` in NumPy for a built-in kernel (the NumPy baseline)."""
    if not has_numpy_baseline(k):
        raise TimeRLError(f"kernel {k.name!r} has no NumPy baseline; built in: {', '.join(_NUMPY)}")
    return _NUMPY[k.name]


def einsum_reference(k: Kernel, lhs: np.ndarray, rhs: np.ndarray, extents: Mapping[str, int]) -> np.ndarray:
    """``out`` by brute force from the index expressions (float64, any kernel; for tests
    and kernels without a NumPy baseline): gathers each operand over the full iteration
    space, then one ``einsum``. Memory grows with the product of all extents."""
    if all(len(axis) == 1 and axis[0][1] == 1 for acc in (k.lhs, k.rhs) for axis in acc.axes):
        sub = ",".join("".join(axis[0][0] for axis in acc.axes) for acc in (k.lhs, k.rhs))
        return np.einsum(f"{sub}->{''.join(k.out_dims)}", lhs.astype(np.float64), rhs.astype(np.float64))
    grids = np.meshgrid(*(np.arange(extents[d]) for d in k.dims), indexing="ij")
    at = dict(zip(k.dims, grids, strict=True))
    letters = "".join(k.dims)

    def gather(a: np.ndarray, acc: Access) -> np.ndarray:
        idx = tuple(sum(c * at[d] for d, c in axis) for axis in acc.axes)
        return a.astype(np.float64)[idx]

    full = np.einsum(f"{letters},{letters}->{''.join(k.out_dims)}", gather(lhs, k.lhs), gather(rhs, k.rhs))
    return full
