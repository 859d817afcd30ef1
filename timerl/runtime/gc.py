"""Freeing whole iterations: the runtime's memory bound for long training runs.

Most RL programs run iteration-major: one outer loop over the first dim (``i``) around
everything, every statement running at the loop's current ``i``. A value of node ``n`` at
iteration ``i`` is then never read again once the loop reaches ``i + lag(n) + 1``, where
``lag(n)`` is the furthest back any reader reaches along ``i`` (``0`` for same-iteration
reads, ``1`` for ``w[i - 1]``; unbounded for reads such as ``x[0:i]`` or from nodes
without ``i``, which keep every value). :class:`IterationCollector` frees those values at
the start of each iteration, so memory stays bounded by a few iterations instead of
growing with the run (PPO on CartPole ran out of 24 GiB after 62 iterations without it).

It is used only when the schedule has that shape (the plan's ``iteration_loop``,
:func:`~timerl.plan.iterations.iteration_loop`, also used by checkpointing); otherwise nothing is freed here. Explicit ``Dealloc`` statements are independent of it.
"""

from __future__ import annotations

import logging

from timerl.pdg.ir import PDG
from timerl.plan.iterations import read_lags
from timerl.runtime.store import PointStore
from timerl.symbolic import Sym

log = logging.getLogger(__name__)


class IterationCollector:
    """Frees the values no later iteration reads; call :meth:`collect` at each iteration start."""

    def __init__(self, pdg: PDG, dim: Sym) -> None:
        self.dim = dim
        lags = read_lags(pdg, dim)
        self.plan = [(nid, pdg.nodes[nid].domain.index(dim), lag) for nid, lag in sorted(lags.items())]

    def collect(self, store: PointStore, current: int) -> int:
        """Free points of iterations ``< current - lag``; returns the bytes released."""
        released = 0
        tables = store.all_tables()
        for nid, k, lag in self.plan:
            limit = current - lag
            tabs = tables.get(nid)
            if limit <= 0 or not tabs or not tabs[0]:  # most nodes hold nothing between iterations
                continue
            stale = [p for p in tabs[0] if p[k] < limit]
            if stale:
                released += store.free_points(nid, stale)
        return released
