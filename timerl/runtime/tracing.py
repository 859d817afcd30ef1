"""The trace of an iteration body in progress (``runtime/iteration.py``), seen by the thunks.

While :class:`~timerl.runtime.iteration.CompiledIteration` traces the iteration loop's body,
the interpreter runs every statement once on JAX tracers. What the host would compute from
the point (an ``EVAL_SYMBOL``'s value, the seeds of random draws) becomes a host callback of
the distance ``delta`` (in iterations) between the traced iteration and the one the call
runs, and a sink a callback with its value and point; a statement that cannot be traced
raises :class:`NotTraceable`. :data:`current` is None outside a trace (one attribute read per
statement that cares).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

Point = tuple[int, ...]


class NotTraceable(Exception):
    """A statement of the body cannot run inside a trace (the body then runs as before)."""


class TraceContext:
    """What the thunks need while a body is traced: ``delta`` (a traced int32 scalar) and,
    per node, where its points move with the iteration (``ipos``: node id -> coordinate)."""

    def __init__(self, delta: Any, ipos: dict[int, int]) -> None:
        self.delta = delta
        self.ipos = ipos
        self.errors: list[BaseException] = []  # raised by sinks inside the compiled call

    def shift(self, nid: int, point: Point, d: int) -> Point:
        """``point`` of node ``nid`` moved ``d`` iterations on."""
        j = self.ipos.get(nid)
        if j is None or d == 0:
            return point
        return point[:j] + (point[j] + d,) + point[j + 1 :]

    def host_value(self, fn: Callable[[int], Any], shape: Sequence[int], dtype: Any) -> Any:
        """``fn(delta)`` computed on the host at every call (a NumPy array of ``shape``)."""
        import jax

        shape, dtype = tuple(int(s) for s in shape), np.dtype(dtype)

        def cb(d: Any) -> np.ndarray:
            return np.asarray(fn(int(d)), dtype=dtype).reshape(shape)

        return jax.pure_callback(cb, jax.ShapeDtypeStruct(shape, dtype), self.delta)

    def sink(self, call: Callable[[np.ndarray, int], None], x: Any) -> None:
        """``call(value, delta)`` on the host, in program order; its errors are kept for
        :meth:`raise_errors` (a callback must not raise into XLA)."""
        from jax.experimental import io_callback

        errors = self.errors

        def cb(v: Any, d: Any) -> None:
            if errors:
                return
            try:
                call(np.array(v), int(d))
            except BaseException as exc:  # noqa: BLE001 - re-raised by raise_errors
                errors.append(exc)

        io_callback(cb, None, x, self.delta, ordered=True)

    def raise_errors(self) -> None:
        """Raise the first error a sink raised (once)."""
        if self.errors:
            exc = self.errors[0]
            self.errors.clear()
            raise exc


current: TraceContext | None = None
"""The trace in progress, or None."""
