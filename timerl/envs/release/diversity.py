"""Against plateaus: candidate filters for the samplers (:mod:`.sampling`).

A tuning run gets stuck when the cost model ranks a plateau of equivalent configurations
on top: configurations that differ only in knobs the model does not split on get exactly
the same prediction (the trees put them in the same leaves), greedy sampling measures its
top k of them, each measurement confirms the plateau, and the run never leaves it.

- :func:`dedup_ties` keeps one candidate per predicted score (rounded to ``decimals``):
  the model cannot tell the others apart, so measuring one of them tells as much as
  measuring all. With no ties it returns its input unchanged.
- :func:`diverse_order` orders candidates for a batch in the manner of AutoTVM's
  diversity-aware selection: greedily, each next pick maximises its normalised score plus
  ``knob_weight`` times the fraction of knobs whose value no earlier pick has. With
  ``knob_weight = 0`` it is the plain score order.

Both are deterministic (ties in the greedy pick go to the earlier candidate).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from timerl.envs.release.space import Config
from timerl.errors import TimeRLError

DIVERSITY_MODES = ("none", "ties", "knobs")


def check_mode(mode: str) -> str:
    """``mode`` if it is one of :data:`DIVERSITY_MODES`, else a :class:`TimeRLError`."""
    if mode not in DIVERSITY_MODES:
        raise TimeRLError(f"RELEASE diversity must be one of {', '.join(DIVERSITY_MODES)}, got {mode!r}")
    return mode


def dedup_ties(
    configs: Sequence[Config], scores: np.ndarray, decimals: int = 6
) -> tuple[list[Config], np.ndarray]:
    """The candidates with a predicted score no earlier candidate has (rounded to
    ``decimals``), in their order, with their scores."""
    scores = np.asarray(scores, np.float64)
    if len(configs) != len(scores):
        raise TimeRLError(f"dedup_ties: {len(configs)} configurations but {len(scores)} scores")
    seen: set[float] = set()
    keep: list[int] = []
    for j, s in enumerate(np.round(scores, decimals)):
        if float(s) not in seen:
            seen.add(float(s))
            keep.append(j)
    return [configs[j] for j in keep], scores[keep]


def diverse_order(configs: Sequence[Config], scores: np.ndarray, knob_weight: float = 1.0) -> list[Config]:
    """All of ``configs`` in diversity-aware pick order (see the module doc)."""
    if knob_weight < 0:
        raise TimeRLError(f"diverse_order: knob_weight must be >= 0, got {knob_weight}")
    n = len(configs)
    if n == 0:
        return []
    scores = np.asarray(scores, np.float64)
    span = float(scores.max() - scores.min())
    norm = (scores - scores.min()) / span if span > 0 else np.zeros(n)
    arr = np.asarray(configs, np.int64).reshape(n, -1)
    num_knobs = arr.shape[1]
    covered = np.zeros_like(arr, dtype=bool)  # covered[j, d]: configs[j]'s value of knob d is in the batch
    left = np.ones(n, bool)
    out: list[Config] = []
    for _ in range(n):
        new = (~covered).sum(1) / max(num_knobs, 1)
        gain = np.where(left, norm + knob_weight * new, -np.inf)
        j = int(np.argmax(gain))  # the first of equal gains
        out.append(configs[j])
        left[j] = False
        covered |= arr == arr[j]
    return out
