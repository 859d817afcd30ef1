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
from timerl.symbolic import Slice, Sym, evaluate


class ArrayOps(Protocol):
    def take(self, x: Any, axis: int, index: int) -> Any: ...

    def permute_axes(self, x: Any, perm: tuple[int, ...]) -> Any: ...

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
            else:  # "expand": (ndim of the batch before, reshape target, broadcast shape)
                nb, lead, full = arg
                s = tuple(x.shape)
                x = ops.broadcast_to(x.reshape(lead + s[nb:]), full + s[nb:])
        return x

    def compile(self, ops: ArrayOps) -> Callable[[Any, Mapping[Sym, int]], Any] | None:
        """``f(x, env)`` applying the steps, or ``None`` when there are none."""
        if not self.steps:
            return None
        return lambda x, env: self.apply(x, env, ops)


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
            steps.append(("narrow", (ax, comp)))
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
        steps.append(("expand", (len(keep), lead, full)))
    return InputLayout(tuple(steps), True)
