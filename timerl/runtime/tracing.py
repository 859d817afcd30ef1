"""The trace of an iteration body in progress (``runtime/iteration.py``), seen by the thunks.

While :class:`~timerl.runtime.iteration.CompiledIteration` traces the iteration loop's body,
the interpreter runs every statement once on JAX tracers. What the host would compute from
the point (an ``EVAL_SYMBOL``'s value, the seeds of random draws) becomes an input of the
call, computed on the host from the distance ``delta`` (in iterations) between the traced
iteration and the one the call runs, and a sink's value an output of the call, called back
after it; a statement that cannot be traced
raises :class:`NotTraceable`. :data:`current` is None outside a trace (one attribute read per
statement that cares).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

Point = tuple[int, ...]
Host = tuple[Callable[[int], Any], tuple[int, ...], np.dtype, Callable[[np.ndarray], Any] | None]
"""A host value of a compiled call: ``(fn(delta), shape, dtype, many(deltas) or None)``."""


class NotTraceable(Exception):
    """A statement of the body cannot run inside a trace (the body then runs as before)."""


class TraceContext:
    """What the thunks need while a body is traced: ``delta`` (a traced int32 scalar) and,
    per node, where its points move with the iteration (``ipos``: node id -> coordinate).

    Nothing host-side runs inside the compiled call (on a GPU each host callback would stop
    the device until the host answers):

    * a value the host computes from the point (:meth:`host_value`) is an input of the call,
      computed before it from the distance; the first trace of a body finds which values
      there are (``hosts``, in the order the body asks for them) with callbacks in their
      place, a second trace takes them as inputs (``inputs``);
    * a sink (:meth:`sink`) is an output of the call, and its callback runs on the host after
      the call, in program order (``sinks``).
    """

    def __init__(self, delta: Any, ipos: dict[int, int]) -> None:
        self.delta = delta
        self.ipos = ipos
        self.hosts: list[Host] = []
        self.inputs: Sequence[Any] | None = None  # the host values, traced (second trace)
        self.sinks: list[Callable[[np.ndarray, int], None]] = []
        self.sink_values: list[Any] = []

    def begin(self, delta: Any, inputs: Sequence[Any] | None) -> None:
        """Start a trace: the host values are ``inputs`` (found by an earlier trace) or found
        now (None)."""
        self.delta, self.inputs = delta, inputs
        if inputs is None:
            self.hosts = []
        self.sinks, self.sink_values = [], []
        self._k = 0

    def shift(self, nid: int, point: Point, d: int) -> Point:
        """``point`` of node ``nid`` moved ``d`` iterations on."""
        j = self.ipos.get(nid)
        if j is None or d == 0:
            return point
        return point[:j] + (point[j] + d,) + point[j + 1 :]

    def host_value(
        self,
        fn: Callable[[int], Any],
        shape: Sequence[int],
        dtype: Any,
        many: Callable[[np.ndarray], Any] | None = None,
    ) -> Any:
        """``fn(delta)`` (a NumPy array of ``shape``) for the iteration a call runs. ``many``:
        the same for an array of deltas at once (``(len(deltas), *shape)``), where ``fn`` is a
        pure function of ``delta``: the calls then take it from a chunk computed ahead."""
        import jax

        shape, dtype = tuple(int(s) for s in shape), np.dtype(dtype)
        k, self._k = self._k, self._k + 1
        if self.inputs is not None:
            if k >= len(self.hosts) or self.hosts[k][1:3] != (shape, dtype):
                raise NotTraceable("the body asked for other host values in a second trace")
            return self.inputs[k]
        self.hosts.append((fn, shape, dtype, many))

        def cb(d: Any) -> np.ndarray:
            return host_array(fn, shape, dtype, int(d))

        return jax.pure_callback(cb, jax.ShapeDtypeStruct(shape, dtype), self.delta)

    def sink(self, call: Callable[[np.ndarray, int], None], x: Any) -> None:
        """``call(value, delta)`` on the host after the call, in program order."""
        self.sinks.append(call)
        self.sink_values.append(x)


def host_array(fn: Callable[[int], Any], shape: tuple[int, ...], dtype: np.dtype, d: int) -> np.ndarray:
    """``fn(d)`` as a NumPy array of ``shape`` and ``dtype``."""
    return np.asarray(fn(d), dtype=dtype).reshape(shape)


current: TraceContext | None = None
"""The trace in progress, or None."""
