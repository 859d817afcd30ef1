"""User-defined functions: external Python state (environments, replay buffers) as ops."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from timerl.errors import RTDefinitionError
from timerl.pdg.ir import TensorSpec
from timerl.pdg.ops import DType, Op, OpKind
from timerl.rt.context import current
from timerl.rt.tensor import RecurrentTensor, to_rt
from timerl.symbolic import Sym


class UDFFn:
    """The callable a UDF node runs: ``fn(inputs, point) -> outputs`` (NumPy in, NumPy out).

    ``bind`` is called once at compile time with the static bounds, before any call.

    ``array_io`` picks how values cross into and out of the function:

    - ``"numpy"`` (default): inputs are fresh NumPy arrays, outputs anything
      ``np.asarray`` accepts (host copies on both sides).
    - ``"dlpack"``: inputs are the backend's tensors as exported by
      ``backend.to_dlpack`` (a ``jax.Array`` or a detached ``torch.Tensor``: objects with
      ``__dlpack__``), and each output may be any object with ``__dlpack__`` (e.g. a
      ``jax.Array``); the runtime imports it with ``backend.from_dlpack``, without a copy
      where the libraries allow (CPU buffers, same device). Inputs and outputs may alias
      runtime values: never write into them. Outputs must have the declared shapes; a
      dtype mismatch is cast (one copy).
    """

    array_io: str = "numpy"

    def __init__(
        self, fn: Callable[[list[np.ndarray], dict[str, int]], Sequence[np.ndarray]], name: str = "udf"
    ) -> None:
        self.fn = fn
        self.__name__ = name

    def bind(self, bounds: Mapping[Sym, int]) -> None:
        """Receive static bound values (default: nothing to do)."""

    def __call__(self, inputs: list[np.ndarray], point: dict[str, int]) -> Sequence[np.ndarray]:
        return self.fn(inputs, point)


def udf(
    fn: Callable[[list[np.ndarray], dict[str, int]], Sequence[np.ndarray]] | UDFFn,
    out_specs: Sequence[tuple[Any, DType] | TensorSpec],
    domain: Sequence[Sym] = (),
    inputs: Sequence[Any] = (),
    name: str | None = None,
    batch_dims: Sequence[Sym] = (),
) -> list[RecurrentTensor]:
    """Wrap ``fn`` as an effectful op run at every point of ``domain`` (in schedule order).

    **Arguments:**

    - ``fn``: called as ``fn(list_of_numpy_inputs, point)`` with ``point`` mapping dim
      names to ints; returns one NumPy array per output spec.
    - ``out_specs``: per-point ``(shape, dtype)`` of each output.
    - ``batch_dims``: dims the function handles all at once (vectorized: inputs and
      outputs carry a leading dim per batch dim).
    """
    ctx = current()
    f = fn if isinstance(fn, UDFFn) else UDFFn(fn, getattr(fn, "__name__", "udf"))
    specs = tuple(s if isinstance(s, TensorSpec) else TensorSpec(tuple(s[0]), s[1]) for s in out_specs)
    ins = [to_rt(x) for x in inputs]
    dom = set(domain)
    for x in ins:
        extra = set(x.domain) - dom
        if extra:
            raise RTDefinitionError(
                f"udf {f.__name__}: input {x!r} varies over {sorted(s.name for s in extra)}, "
                "which are not in the udf's domain"
            )
    node = ctx.graph.add(
        # batch dims by name: an Expr attribute would pin the dim (see pdg/passes/vectorize.py)
        Op.make(OpKind.UDF, fn=f, batch_dims=tuple(d.name for d in batch_dims)),
        ctx.order(dom),
        specs,
        [x._input() for x in ins],
        name=name,
    )
    node.batch_dims = tuple(batch_dims)
    return [RecurrentTensor(ctx, node, k) for k in range(len(specs))]
