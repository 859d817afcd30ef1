"""Shape rules for per-point shapes whose sizes may be symbolic (``T - t``)."""

from __future__ import annotations

from collections.abc import Sequence

from timerl.errors import ShapeError
from timerl.pdg.ir import ShapeDim
from timerl.symbolic import Const, Expr, lift, same


def norm_dim(d: ShapeDim) -> ShapeDim:
    """Ints stay ints; constant expressions become ints."""
    if isinstance(d, Expr):
        return int(d.value) if isinstance(d, Const) else d
    return int(d)


def norm_shape(shape: Sequence[ShapeDim]) -> tuple[ShapeDim, ...]:
    return tuple(norm_dim(d) for d in shape)


def dims_equal(a: ShapeDim, b: ShapeDim) -> bool:
    return same(lift(a), lift(b))


def broadcast(shapes: Sequence[Sequence[ShapeDim]], what: str) -> tuple[ShapeDim, ...]:
    """NumPy broadcasting of per-point shapes; symbolic sizes must match exactly."""
    nd = max((len(s) for s in shapes), default=0)
    out: list[ShapeDim] = []
    for k in range(nd):
        cur: ShapeDim = 1
        for s in shapes:
            j = k - (nd - len(s))
            if j < 0:
                continue
            d = norm_dim(s[j])
            if d == 1 and not isinstance(d, Expr):
                continue
            if cur == 1 and not isinstance(cur, Expr):
                cur = d
            elif not dims_equal(cur, d):
                raise ShapeError(
                    f"{what}: per-point shapes {[tuple(x) for x in shapes]} do not broadcast "
                    f"(size {cur} vs {d}); reshape or expand one operand"
                )
        out.append(cur)
    return tuple(out)


def numel(shape: Sequence[ShapeDim]) -> ShapeDim:
    n: ShapeDim = 1
    for d in shape:
        n = norm_dim(lift(n) * lift(d)) if isinstance(d, Expr) or isinstance(n, Expr) else n * d
    return n


def norm_axis(dim: int, ndim: int, what: str) -> int:
    if not -ndim <= dim < max(ndim, 1):
        raise ShapeError(f"{what}: dim {dim} is out of range for a per-point tensor with {ndim} dims")
    return dim % ndim if ndim else 0
