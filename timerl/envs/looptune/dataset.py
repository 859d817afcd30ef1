"""LoopTune's benchmark sets and their fixed train/test split.

``"mm"``: every matmul with ``m, n, k`` in ``64, 80, ..., 256`` (13 values each, 2197
problems), as in the paper (train 80 % = 1757 problems, test 20 % = 440).
"""

from __future__ import annotations

import math

import numpy as np

from timerl.envs.looptune.ir import Problem
from timerl.errors import TimeRLError

_SIZES = tuple(range(64, 257, 16))
DATASETS: tuple[str, ...] = ("mm",)


def _check(dataset: str) -> None:
    if dataset not in DATASETS:
        raise TimeRLError(
            f"unknown LoopTune dataset {dataset!r}; valid datasets: {', '.join(DATASETS)} "
            "(e.g. trl.env.make('looptune.mm', ...))"
        )


def problems(dataset: str = "mm") -> list[Problem]:
    """All problems of ``dataset``, in a fixed order (``m`` slowest, ``k`` fastest)."""
    _check(dataset)
    return [Problem(m, n, k) for m in _SIZES for n in _SIZES for k in _SIZES]


def split(
    dataset: str = "mm", seed: int = 0, test_fraction: float = 0.2
) -> tuple[list[Problem], list[Problem]]:
    """``(train, test)``: a permutation of :func:`problems` fixed by ``seed``; the test
    set is the first ``ceil(test_fraction * len)`` of it (440 for ``mm``, as in the paper); each part is
    returned in dataset order."""
    if not 0.0 < test_fraction < 1.0:
        raise TimeRLError(f"test_fraction must be in (0, 1), got {test_fraction}")
    allp = problems(dataset)
    perm = np.random.default_rng(seed).permutation(len(allp))
    n_test = math.ceil(test_fraction * len(allp))
    test_idx = set(perm[:n_test].tolist())
    train = [p for i, p in enumerate(allp) if i not in test_idx]
    test = [p for i, p in enumerate(allp) if i in test_idx]
    return train, test
