"""Saving RT values from a running program (``x.checkpoint(path)``)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np


def save_sink(path: str, name: str) -> Callable[[np.ndarray, dict[str, int]], None]:
    """A sink that writes ``<path>/<name>.npz`` (latest value) and ``meta.json``-style info."""

    def save(value: np.ndarray, point: dict[str, Any]) -> None:
        os.makedirs(path, exist_ok=True)
        tag = "_".join(f"{k}{v}" for k, v in sorted(point.items()))
        np.save(os.path.join(path, f"{name}.npy"), value)
        with open(os.path.join(path, f"{name}.point.txt"), "w") as f:
            f.write(tag + "\n")

    save.__name__ = f"checkpoint_{name}"
    return save
