"""LoopTune's benchmark sets and their fixed train/test split.

- ``"mm"``: every matmul with ``m, n, k`` in ``64, 80, ..., 256`` (13 values each, 2197
  problems), as in the paper (train 80 % = 1757 problems, test 20 % = 440);
- ``"bmm"``: batched matmuls ``C[b,m,n] = sum_k A[b,m,k] B[b,k,n]``, ``b`` in 2, 4, 8 and
  ``m, n, k`` in 48, 80, 112, 144 (192 problems);
- ``"conv1d"``: ``Y[i,o] = sum_{r,c} X[i+r,c] W[r,c,o]``, ``i`` in 56, 112, 224, ``o`` and
  ``c`` in 32, 64, 128, ``r`` in 3, 5, 7 (81 problems);
- ``"conv2d"``: ``Y[h,w,o] = sum_{r,s,c} X[h+r,w+s,c] W[r,s,c,o]``, ``h = w`` in 14, 28,
  56, ``o`` and ``c`` in 16, 32, 64, ``r = s`` in 3, 5 (54 problems).

The non-matmul sets are for evaluating a policy on nests it did not train on (their
sizes keep one measurement within tens of milliseconds).
"""

from __future__ import annotations

import math

import numpy as np

from timerl.envs.looptune.ir import Problem
from timerl.envs.looptune.kernels import BMM, CONV1D, CONV2D
from timerl.errors import TimeRLError

_SIZES = tuple(range(64, 257, 16))
DATASETS: tuple[str, ...] = ("mm", "bmm", "conv1d", "conv2d")


def _check(dataset: str) -> None:
    if dataset not in DATASETS:
        raise TimeRLError(
            f"unknown LoopTune dataset {dataset!r}; valid datasets: {', '.join(DATASETS)} "
            "(e.g. trl.env.make('looptune.mm', ...))"
        )


def problems(dataset: str = "mm") -> list[Problem]:
    """All problems of ``dataset``, in a fixed order (``m`` slowest, ``k`` fastest)."""
    _check(dataset)
    if dataset == "bmm":
        mnk = (48, 80, 112, 144)
        return [Problem(b, m, n, k, kernel=BMM) for b in (2, 4, 8) for m in mnk for n in mnk for k in mnk]
    if dataset == "conv1d":
        ch = (32, 64, 128)
        return [
            Problem(i, o, r, c, kernel=CONV1D)
            for i in (56, 112, 224)
            for o in ch
            for r in (3, 5, 7)
            for c in ch
        ]
    if dataset == "conv2d":
        ch = (16, 32, 64)
        return [
            Problem(h, h, o, r, r, c, kernel=CONV2D)
            for h in (14, 28, 56)
            for o in ch
            for r in (3, 5)
            for c in ch
        ]
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
