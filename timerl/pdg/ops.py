"""PDG operations: immutable descriptions of what a node computes at one point.

An :class:`Op` is a kind (an :class:`OpKind`) plus attributes. Semantics are stated
*per point* on per-point tensors; a node whose domain lost a dim to vectorization has
``batch`` leading dims on its outputs and on those inputs that carry them (see
``timerl/backends/base.py`` for how kernels treat batch dims).

Attributes hold Python scalars/tuples, :class:`DType`, NumPy arrays (``CONST``) or
symbolic expressions (evaluated at the execution point by the runtime, e.g. the
``SLICE`` bounds or ``EVAL_SYMBOL``'s expression).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

import numpy as np

from timerl.symbolic import Expr, Slice, Sym, free_symbols


class DType(enum.Enum):
    float32 = "float32"
    float64 = "float64"
    int32 = "int32"
    int64 = "int64"
    bool_ = "bool"

    @property
    def is_float(self) -> bool:
        return self in (DType.float32, DType.float64)

    @property
    def numpy(self) -> np.dtype:
        return np.dtype(self.value)

    @staticmethod
    def from_numpy(dt: Any) -> DType:
        dt = np.dtype(dt)
        if dt == np.bool_:
            return DType.bool_
        for d in DType:
            if d.value == dt.name:
                return d
        if dt.kind == "f":
            return DType.float32
        if dt.kind in "iu":
            return DType.int64
        raise ValueError(f"unsupported dtype {dt}")


class OpKind(enum.Enum):
    """Every op kind. Per-point semantics (``x`` = input 0, ``y`` = input 1)."""

    # -- creation (no inputs) --------------------------------------------------------
    CONST = enum.auto()  # attrs: value (np.ndarray), batched (value carries the batch dims). Output: value.
    EVAL_SYMBOL = enum.auto()  # attrs: expr, dtype. Output: 0-d tensor, expr at the point.
    RAND_UNIFORM = enum.auto()  # attrs: shape, dtype. U[0,1). Effectful (RNG).
    RAND_NORMAL = enum.auto()  # attrs: shape, dtype. N(0,1). Effectful (RNG).
    # -- elementwise unary ------------------------------------------------------------
    NEG = enum.auto()
    EXP = enum.auto()
    LOG = enum.auto()
    SQRT = enum.auto()
    TANH = enum.auto()
    ABS = enum.auto()
    RELU = enum.auto()
    SIGMOID = enum.auto()
    SIGN = enum.auto()
    LOGICAL_NOT = enum.auto()
    CAST = enum.auto()  # attrs: dtype
    IDENTITY = enum.auto()  # copy (also ``detach``: autodiff stops there)
    # -- elementwise binary (NumPy broadcasting of the per-point shapes) ---------------
    ADD = enum.auto()
    SUB = enum.auto()
    MUL = enum.auto()
    DIV = enum.auto()
    POW = enum.auto()
    TANH_GRAD = enum.auto()  # (g, y) -> g * (1 - y * y): the VJP of tanh from its output y, one pass
    MAXIMUM = enum.auto()
    MINIMUM = enum.auto()
    LT = enum.auto()
    LE = enum.auto()
    GT = enum.auto()
    GE = enum.auto()
    EQ = enum.auto()
    NE = enum.auto()
    LOGICAL_AND = enum.auto()
    LOGICAL_OR = enum.auto()
    WHERE = enum.auto()  # (cond, a, b) -> a where cond else b
    # -- reductions / scans -------------------------------------------------------------
    SUM = enum.auto()  # attrs: dims (tuple of non-negative ints), keepdim
    MAX = enum.auto()  # attrs: dims, keepdim
    MIN = enum.auto()  # attrs: dims, keepdim
    ARGMAX = enum.auto()  # attrs: dim. Output int64, the dim removed.
    CUMSUM = enum.auto()  # attrs: dim
    DISCOUNTED_SUM = enum.auto()  # attrs: gamma. sum_k gamma**k * x[k] over dim 0.
    DISCOUNT_WEIGHTS = enum.auto()  # attrs: gamma. (g, x) -> g * gamma**k broadcast to x's shape (VJP)
    # attrs: reverse. (x, c, y0) -> y of n rows along dim 0, x and c of n - 1 rows (y0: one row):
    # reverse: y[n-1] = y0, y[k] = x[k] + c[k] * y[k + 1]; else y[0] = y0, y[k] = x[k-1] + c[k-1] * y[k - 1].
    LINEAR_SCAN = enum.auto()
    # attrs: gamma, padded. y[k] = sum_{j >= k} gamma**(j - k) * x[j] along dim 0 (every row's
    # discounted sum to the end: r[t:T].discounted_sum(gamma) for all t at once, pdg/passes/suffix_scan).
    # padded: its input rows are zero-padded to bucket(T) (T dynamic; the rows are then a padded batch axis).
    SUFFIX_SUM = enum.auto()
    LOG_SOFTMAX = enum.auto()  # attrs: dim
    SOFTMAX = enum.auto()  # attrs: dim
    # -- layout / indexing ------------------------------------------------------------
    RESHAPE = enum.auto()  # attrs: shape (ints, -1 allowed)
    PERMUTE = enum.auto()  # attrs: dims
    EXPAND = enum.auto()  # attrs: shape (ints; NumPy broadcast_to)
    SQUEEZE = enum.auto()  # attrs: dim
    UNSQUEEZE = enum.auto()  # attrs: dim
    CAT = enum.auto()  # attrs: dim. n inputs.
    STACK = enum.auto()  # attrs: dim. n inputs.
    SLICE = enum.auto()  # attrs: dim, start (Expr), stop (Expr). Concrete slice, symbolic bounds.
    PAD_SLICE = (
        enum.auto()
    )  # attrs: dim, start (Expr), size (Expr). (x) -> zeros of `size` with x at start (VJP of SLICE)
    INDEX = enum.auto()  # attrs: dim, index (Expr). Select one element along dim (dim removed).
    GATHER = enum.auto()  # (x, idx) -> take_along_axis(x, idx[..., None], -1)[..., 0]
    ONE_HOT = enum.auto()  # attrs: num_classes, dtype. (idx) -> one-hot along a new last dim
    TAKE = enum.auto()  # (x, idx) -> x[idx] along per-point dim 0 (idx: (k,) ints): rows of x
    INDEX_ADD = enum.auto()  # attrs: size. (g, idx) -> size rows of zeros plus g's rows at idx
    ARGSORT = enum.auto()  # attrs: dim. Output int64: the indices that sort x along dim (ascending)
    MATMUL = enum.auto()  # NumPy matmul on per-point shapes
    # -- dynamic / effectful --------------------------------------------------------
    MERGE = enum.auto()  # n inputs with edge conditions; output = first input whose condition holds
    SET_SYMBOL = enum.auto()  # attrs: bound (Sym), dim (Sym). Input: bool; if all true, bound = dim + 1
    UDF = enum.auto()  # attrs: fn (UDFFn). External state; effectful.
    SINK = enum.auto()  # attrs: fn. Calls fn(host_value, point_dict). Effectful, no outputs.


UNARY_OPS = frozenset(
    {
        OpKind.NEG,
        OpKind.EXP,
        OpKind.LOG,
        OpKind.SQRT,
        OpKind.TANH,
        OpKind.ABS,
        OpKind.RELU,
        OpKind.SIGMOID,
        OpKind.SIGN,
        OpKind.LOGICAL_NOT,
        OpKind.CAST,
        OpKind.IDENTITY,
    }
)
BINARY_OPS = frozenset(
    {
        OpKind.ADD,
        OpKind.SUB,
        OpKind.MUL,
        OpKind.DIV,
        OpKind.POW,
        OpKind.TANH_GRAD,
        OpKind.MAXIMUM,
        OpKind.MINIMUM,
        OpKind.LT,
        OpKind.LE,
        OpKind.GT,
        OpKind.GE,
        OpKind.EQ,
        OpKind.NE,
        OpKind.LOGICAL_AND,
        OpKind.LOGICAL_OR,
    }
)
ELEMENTWISE_OPS = UNARY_OPS | BINARY_OPS | {OpKind.WHERE}
COMPARISON_OPS = frozenset(
    {
        OpKind.LT,
        OpKind.LE,
        OpKind.GT,
        OpKind.GE,
        OpKind.EQ,
        OpKind.NE,
        OpKind.LOGICAL_AND,
        OpKind.LOGICAL_OR,
        OpKind.LOGICAL_NOT,
    }
)
# Ops with effects outside their outputs: never removed, never duplicated, ordered.
EFFECTFUL_OPS = frozenset(
    {OpKind.RAND_UNIFORM, OpKind.RAND_NORMAL, OpKind.UDF, OpKind.SINK, OpKind.SET_SYMBOL}
)


@dataclass(frozen=True, slots=True)
class Op:
    """An op kind with attributes (a sorted tuple of ``(name, value)`` pairs)."""

    kind: OpKind
    attrs: tuple[tuple[str, Any], ...] = ()

    @staticmethod
    def make(kind: OpKind, **attrs: Any) -> Op:
        return Op(kind, tuple(sorted(attrs.items())))

    def attr(self, name: str, default: Any = ...) -> Any:
        for k, v in self.attrs:
            if k == name:
                return v
        if default is ...:
            raise KeyError(f"{self.kind.name} has no attribute {name!r}")
        return default

    @property
    def effectful(self) -> bool:
        return self.kind in EFFECTFUL_OPS

    def symbols(self) -> frozenset[Sym]:
        """The symbols of the index expressions among the attributes (nested in tuples too)."""
        return _attr_symbols(tuple(v for _, v in self.attrs))

    def __repr__(self) -> str:
        a = ", ".join(f"{k}={_short(v)}" for k, v in self.attrs)
        return f"{self.kind.name}({a})"

    # Ops hold numpy arrays and callables: identity-based hashing keeps them usable as keys.
    __hash__ = object.__hash__

    def __eq__(self, other: object) -> bool:
        return self is other


def _attr_symbols(value: Any) -> frozenset[Sym]:
    if isinstance(value, (Expr, Slice)):
        return free_symbols(value)
    if isinstance(value, (tuple, list)):
        out: frozenset[Sym] = frozenset()
        for v in value:
            out |= _attr_symbols(v)
        return out
    return frozenset()


def _short(v: Any) -> str:
    if isinstance(v, np.ndarray):
        return f"array{tuple(v.shape)}"
    if callable(v):
        return getattr(v, "__name__", type(v).__name__)
    return repr(v)
