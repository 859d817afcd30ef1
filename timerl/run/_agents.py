"""Many agents in one training script: ``--num-seeds`` and ``--sweep`` as a list of settings,
one per agent along the agent dim (``docs/concepts/agents.md``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from timerl.errors import TimeRLError


def agent_settings(
    sweep: Sequence[str], num_seeds: int, seed: int, allowed: Sequence[str]
) -> list[dict[str, float]]:
    """One dict per agent: the grid of ``sweep`` (``["lr=1e-3,3e-3", "ent_coef=0,0.01"]``,
    every combination in order, names among ``allowed``), each repeated for ``num_seeds``
    seeds; agent ``k`` has ``seed = seed + k``. One agent without either."""
    grid: list[dict[str, float]] = [{}]
    for item in sweep:
        name, sep, values = item.partition("=")
        name = name.strip().replace("-", "_")
        if not sep or name not in allowed or not values:
            raise TimeRLError(f"--sweep {item!r}: give name=v1,v2,... with a name among {', '.join(allowed)}")
        try:
            vals = [float(v) for v in values.split(",")]
        except ValueError:
            raise TimeRLError(f"--sweep {item!r}: the values must be numbers") from None
        grid = [{**g, name: v} for g in grid for v in vals]
    if num_seeds < 1:
        raise TimeRLError(f"--num-seeds must be at least 1, got {num_seeds}")
    out = [dict(g) for g in grid for _ in range(num_seeds)]
    for k, st in enumerate(out):
        st["seed"] = float(seed + k)
    return out


def per_agent(args: Any, settings: Sequence[dict[str, float]], s: Any) -> Any:
    """``args`` (a dataclass) with each swept setting an RT over the agent dim ``s``
    (``trl.const(values)[s]``: a setting per agent); call inside the program's context."""
    from timerl.rt.creation import const

    swept = sorted({k for st in settings for k in st if k != "seed"})
    return replace(args, **{k: const(np.array([st[k] for st in settings], np.float32))[s] for k in swept})
