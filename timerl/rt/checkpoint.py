"""Checkpoint requests from a running program (``x.checkpoint(path)``, ``dnn[c].checkpoint(path)``).

The sink itself writes nothing: at each point where it runs it records a request. The
executor (:mod:`timerl.runtime.checkpoint`) serves the requests of iteration ``k`` at the
end of that iteration by writing one file set, ``<path>/ckpt_<k>.npz`` (every value read
across the iteration boundary, found from the PDG) and ``<path>/ckpt_<k>.json`` (the
iteration, a fingerprint of the program, the config). ``ctx.compile(..., resume=path)``
continues from it.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class CheckpointSink:
    """A sink that records ``(point)`` requests for a checkpoint into ``path``."""

    serves_checkpoints = True  # the marker the plan and runtime find checkpoint sinks by

    def __init__(self, path: str, name: str, config: dict[str, Any] | None = None) -> None:
        self.path = path
        self.config = dict(config or {})
        self.requests: list[dict[str, int]] = []
        self.__name__ = f"checkpoint_{name}"

    def __call__(self, value: np.ndarray, point: dict[str, int]) -> None:
        del value
        self.requests.append(dict(point))

    def __repr__(self) -> str:
        return f"{self.__name__}({self.path!r})"


def save_sink(path: str, name: str, config: dict[str, Any] | None = None) -> CheckpointSink:
    """The sink behind ``x.checkpoint(path)``."""
    return CheckpointSink(path, name, config)
