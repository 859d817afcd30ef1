"""Batch layout of one input: from the source's batch dims to the sink's.

A gathered input starts in the source's layout: ``src.batch`` (named by
``src.batch_dims``), then the stacked slice axes of ``phi``, then the per-point dims.
The sink expects either its own full batch (``batched``) or none. :func:`input_layout`
plans, once per edge, the few array steps between the two (TimeRL Alg. 2's edge rules):

* ``to_batch`` (the sink was vectorized over ``d``, the source was not): the first
  stacked slice axis ``0:D`` sits right after the source's batch dims and *is* batch
  dim ``d``;
* ``batch_read`` (the source was vectorized over ``d``, the edge still indexes ``d``): a
  point takes that row of the batch axis; a slice narrows it and makes it the first
  stacked per-point axis;
* source batch dims the sink lacks stay in front of the per-point dims (a read of the
  whole batch, ``x[0:B]``, by a sink without ``b``): they are stacked per-point dims;
* source batch dims the sink has are put in the sink's order, with missing ones
  broadcast (a per-``(b, i)`` value read by a node vectorized over ``b`` and ``t``).

Every step is a view or a small copy; the array functions come from ``ArrayOps`` so the
interpreter (backend tensors) and the reference evaluator (NumPy) share the plan.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from timerl.errors import RuntimeExecutionError
from timerl.pdg.ir import Edge, Node
from timerl.pdg.ops import OpKind
from timerl.pdg.sizes import is_padded, resolve_batch
from timerl.symbolic import Slice, Sym, evaluate


def pads_to_bucket(node: Node, e: Edge) -> bool:
    """Whether edge ``e`` stacks rows ``0:T`` into a batch axis of ``node`` padded to
    ``bucket(T)`` (``to_batch`` into a dim whose bound is dynamic), or into the rows of a
    ``SUFFIX_SUM`` that become one (op attribute ``padded``): the stack is zero-padded."""
    if node.op.kind is OpKind.SUFFIX_SUM and node.op.attr("padded", False):
        return any(isinstance(c, Slice) for c in e.phi)
    if e.to_batch is None or e.to_batch not in node.batch_dims:
        return False
    return isinstance(node.batch[node.batch_dims.index(e.to_batch)], Sym)


class ArrayOps(Protocol):
    def take(self, x: Any, axis: int, index: int) -> Any: ...

    def permute_axes(self, x: Any, perm: tuple[int, ...]) -> Any: ...

    def mask_rows(self, x: Any, axis: int, stop: int) -> Any: ...

    def broadcast_to(self, x: Any, shape: tuple[int, ...]) -> Any: ...


class NumpyOps:
    """:class:`ArrayOps` on NumPy arrays (the reference evaluator)."""

    @staticmethod
    def take(x: Any, axis: int, index: int) -> Any:
        return np.take(x, index, axis=axis)

    @staticmethod
    def permute_axes(x: Any, perm: tuple[int, ...]) -> Any:
        return np.transpose(x, perm)

    @staticmethod
    def mask_rows(x: Any, axis: int, stop: int) -> Any:
        out = np.array(x, copy=True)
        out[(slice(None),) * axis + (slice(stop, None),)] = 0
        return out

    @staticmethod
    def broadcast_to(x: Any, shape: tuple[int, ...]) -> Any:
        return np.broadcast_to(x, shape)


@dataclass(frozen=True)
class InputLayout:
    """What to do with a gathered input: ``steps`` in order, then ``batched``."""

    steps: tuple[tuple[str, Any], ...]
    batched: bool

    def apply(self, x: Any, env: Mapping[Sym, int], ops: ArrayOps) -> Any:
        for kind, arg in self.steps:
            if kind == "take":
                ax, e = arg
                k = int(evaluate(e, env))
                if not 0 <= k < x.shape[ax]:
                    raise RuntimeExecutionError(
                        f"read at {e} = {k} outside the vectorized dim of size {x.shape[ax]}"
                    )
                x = ops.take(x, ax, k)
            elif kind == "mask":  # a slice 0:b of an axis padded to a bucket, read by a sum
                ax, sl = arg
                b = int(evaluate(sl.stop, env))
                if not 0 <= b <= x.shape[ax]:
                    raise RuntimeExecutionError(
                        f"read of {sl} = 0:{b} outside the vectorized dim of size {x.shape[ax]}"
                    )
                if b < x.shape[ax]:
                    x = ops.mask_rows(x, ax, b)
            elif kind == "narrow":
                ax, sl = arg
                a, b = int(evaluate(sl.start, env)), int(evaluate(sl.stop, env))
                if not 0 <= a <= b <= x.shape[ax]:
                    raise RuntimeExecutionError(
                        f"read of {sl} = {a}:{b} outside the vectorized dim of size {x.shape[ax]}"
                    )
                x = x[(slice(None),) * ax + (slice(a, b),)]
            elif kind == "move":
                src, dst = arg
                perm = list(range(x.ndim))
                perm.insert(dst, perm.pop(src))
                x = ops.permute_axes(x, tuple(perm))
            elif kind == "perm":
                k = len(arg)
                x = ops.permute_axes(x, tuple(arg) + tuple(range(k, x.ndim)))
            else:  # "expand": (ndim of the batch before, reshape target, broadcast shape or None)
                nb, lead, full = arg
                if is_padded(lead) or (full is not None and is_padded(full)):
                    lead = resolve_batch(lead, env)
                    full = None if full is None else resolve_batch(full, env)
                s = tuple(x.shape)
                x = x.reshape(lead + s[nb:])
                if full is not None:
                    x = ops.broadcast_to(x, full + s[nb:])
        return x

    def compile(self, ops: ArrayOps) -> Callable[[Any, Mapping[Sym, int]], Any] | None:
        """``f(x, env)`` applying the steps, or ``None`` when there are none."""
        if not self.steps:
            return None
        return lambda x, env: self.apply(x, env, ops)


def _sums_rows(src: Node, sink: Node, e: Edge, d: Sym, comp: Slice) -> bool:
    """Whether ``sink`` may read the slice ``comp = 0:b`` of ``src``'s padded batch axis ``d``
    with the rows ``b ..`` zeroed instead of cut off (same shape for every episode length,
    so one compilation per bucket): its op sums that axis (``SUM`` over it,
    ``DISCOUNTED_SUM`` with it first, or the row reshapes of a contraction from
    :mod:`~timerl.pdg.passes.contract`), so zero rows at the end add nothing."""
    from timerl.symbolic import Const

    if not (isinstance(comp.start, Const) and comp.start.value == 0) or e.to_batch is not None:
        return False
    # where the axis lands among the sink's per-point dims (input_layout): right after the
    # source's other batch dims that the sink does not keep as its batch
    read = {y for y, _ in e.batch_read}  # d among them
    cur = [x for x in src.batch_dims if x not in read]
    extra = [x for x in cur if x not in sink.batch_dims]
    # kept batch dims stay batch dims, the others come first among the per-point dims
    pos = len(extra) if len(extra) < len(cur) and sink.batch_dims else len(cur)
    kind = sink.op.kind
    if kind is OpKind.RESHAPE and sink.op.attr("contracted_rows", False):
        return True  # rows of a contraction whose other operand is read the same way
    if kind in (OpKind.DISCOUNTED_SUM, OpKind.SUFFIX_SUM):
        return pos == 0
    if kind is OpKind.SUM:
        dims = sink.op.attr("dims")
        dims = (dims,) if isinstance(dims, int) else tuple(dims)
        nd = pos + 1 + sum(isinstance(c, Slice) for c in e.phi) + len(src.outputs[e.oid].shape)
        return pos in {x % nd for x in dims}
    return False


def input_layout(src: Node, sink: Node, e: Edge) -> InputLayout:
    """Plan the steps from ``src``'s batch layout to what ``sink`` expects for edge ``e``."""
    named = len(src.batch_dims) == len(src.batch) and len(sink.batch_dims) == len(sink.batch)
    if not named:  # hand-built PDGs without batch dim names: all or none of the sink's batch
        if e.batch_read or e.to_batch is not None:
            raise ValueError(f"edge {e!r} reads along batch dims, but its nodes do not name them")
        return InputLayout((), bool(src.batch) and bool(sink.batch))
    cur: list[Sym] = list(src.batch_dims)
    size = dict(zip(src.batch_dims, src.batch, strict=False))
    steps: list[tuple[str, Any]] = []
    if e.to_batch is not None:
        cur.append(e.to_batch)
    slice_read = False
    for d, comp in e.batch_read:
        ax = cur.index(d)
        if isinstance(comp, Slice):
            if slice_read:
                raise ValueError(f"edge {e!r}: at most one slice read along batch dims")
            slice_read = True
            padded = isinstance(size.get(d), Sym)
            steps.append(("mask" if padded and _sums_rows(src, sink, e, d, comp) else "narrow", (ax, comp)))
            last = len(cur) - 1
            if ax != last:
                steps.append(("move", (ax, last)))
        else:
            steps.append(("take", (ax, comp)))
        cur.remove(d)
    sd = list(sink.batch_dims)
    if not sd or not cur:
        return InputLayout(tuple(steps), False)
    keep = [x for x in cur if x in sd]
    extra = [x for x in cur if x not in sd]
    if not keep:
        return InputLayout(tuple(steps), False)
    order = [cur.index(x) for x in keep] + [cur.index(x) for x in extra]
    if order != list(range(len(cur))):
        steps.append(("perm", tuple(order)))
    if keep != sd:
        pos = [sd.index(x) for x in keep]
        if pos != sorted(pos):
            raise ValueError(f"edge {e!r}: source batch dims {keep} are not in the sink's order {sd}")
        ssize = dict(zip(sink.batch_dims, sink.batch, strict=True))
        lead = tuple(ssize[x] if x in keep else 1 for x in sd)
        full = tuple(ssize[x] for x in sd)
        for x in keep:
            if size.get(x, ssize[x]) != ssize[x]:
                raise ValueError(
                    f"edge {e!r}: batch dim {x} has size {size[x]} at the source, {ssize[x]} here"
                )
        if extra:  # stacked per-point dims stay after the (expanded) batch
            raise ValueError(f"edge {e!r}: cannot expand the batch with per-point batch dims {extra}")
        # a matrix product broadcasts size-1 batch dims itself, without copying the operand
        # (the backends' MATMUL kernels: one product per agent's weights, not one per point)
        steps.append(("expand", (len(keep), lead, None if sink.op.kind is OpKind.MATMUL else full)))
    return InputLayout(tuple(steps), True)
