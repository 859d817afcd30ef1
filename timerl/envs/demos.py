"""Demonstrations from an env's own best episodes, shared by the schedule envs (LoopTune,
Tiramisu): per task, the actions to the fastest *measured* schedule of any finished
episode, and the buffer-imitation batch built from them (``env.demo_buffer``: the states
along each kept demonstration, replayed from the task's initial state without measuring).

:class:`Demonstrations` keeps the best episode per task; :func:`buffer_rows` lays the
replayed rows of one minibatch's share of the tasks out in a fixed number of slots;
:class:`DemoBufferFn` is the UDF that calls an env state's ``demo_buffer`` once per point.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from timerl.errors import TimeRLError
from timerl.rt.udf import UDFFn
from timerl.symbolic import Sym

Rows = tuple[np.ndarray, ...]
"""One task's replayed rows: arrays with ``per`` rows each (observation, ..., weight)."""


class Demonstrations(dict):
    """Per task name, ``(speedup, actions)`` of its best measured episode so far (a dict)."""

    def remember(self, name: str, speedup: float, actions: Sequence[int]) -> bool:
        """Keep ``actions`` (the actions to a measured schedule ``speedup`` x the task's initial
        one) if they beat the kept ones; ``True`` when kept. Non-finite speedups and empty
        action lists are never kept."""
        if not actions or not math.isfinite(speedup) or speedup <= self.get(name, (0.0, ()))[0]:
            return False
        self[name] = (float(speedup), tuple(int(a) for a in actions))
        return True

    def actions(self, name: str, min_speedup: float) -> tuple[int, ...]:
        """The kept actions of ``name`` if they reach ``min_speedup``, else ``()``."""
        speedup, acts = self.get(name, (0.0, ()))
        return acts if speedup >= min_speedup else ()


def buffer_rows(
    num_tasks: int, slots: int, part: int, parts: int, rows_of: Callable[[int | None, int], Rows]
) -> Rows:
    """The buffer-imitation batch of ``slots`` rows: the tasks ``p`` with ``p % parts == part``
    in order, ``per = slots // ceil(num_tasks / parts)`` rows each (``rows_of(p, per)``), then
    empty rows (``rows_of(None, per)``: weight 0) where this part has fewer tasks."""
    share = -(-num_tasks // parts)
    if slots % share:
        raise TimeRLError(
            f"demo_buffer needs a multiple of {share} slots (one row per task and step), got {slots}"
        )
    per = slots // share
    rows = [rows_of(p, per) for p in range(part, num_tasks, parts)]
    while len(rows) < share:
        rows.append(rows_of(None, per))
    return tuple(np.concatenate([r[k] for r in rows]) for k in range(len(rows[0])))


class DemoBufferState(Protocol):
    """What :class:`DemoBufferFn` needs from an env's state."""

    env_id: str

    def demo_buffer(self, slots: int, min_speedup: float, part: int, parts: int) -> Rows: ...


class DemoBufferFn(UDFFn):
    """``state.demo_buffer(slots, min_speedup, part, parts)`` at every point of the UDF's
    domain, ``slots`` the bound of the slot dim, ``part`` the value of the dim ``part`` (0 without)."""

    def __init__(
        self,
        state: DemoBufferState,
        min_speedup: float,
        slots: Sym,
        part: Sym | None,
        parts: int,
        call: Callable[..., Rows] | None = None,
    ) -> None:
        super().__init__(self._call, f"{state.env_id}.demo_buffer")
        self.state = state
        self.min_speedup = float(min_speedup)
        self.slots = slots
        self.part = part
        self.parts = int(parts)
        self.call = call if call is not None else state.demo_buffer
        self.n = 0

    def bind(self, bounds: Mapping[Sym, int]) -> None:
        self.n = int(bounds[self.slots])

    def _call(self, inputs: list[np.ndarray], point: dict[str, Any]) -> list[np.ndarray]:
        part = int(point[self.part.name]) if self.part is not None else 0
        return list(self.call(self.n, self.min_speedup, part, self.parts))
