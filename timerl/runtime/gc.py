"""Freeing whole iterations: the runtime's memory bound for long training runs.

Most RL programs run iteration-major: one outer loop over the first dim (``i``) around
everything, every statement running at the loop's current ``i``. A value of node ``n`` at
iteration ``i`` is then never read again once the loop reaches ``i + lag(n) + 1``, where
``lag(n)`` is the furthest back any reader reaches along ``i`` (``0`` for same-iteration
reads, ``1`` for ``w[i - 1]``; unbounded for reads such as ``x[0:i]`` or from nodes
without ``i``, which keep every value). :class:`IterationCollector` frees those values at
the start of each iteration, so memory stays bounded by a few iterations instead of
growing with the run (PPO on CartPole ran out of 24 GiB after 62 iterations without it).

It is used only when the schedule has that shape (checked on the AST); otherwise nothing
is freed here. Explicit ``Dealloc`` statements are independent of it.
"""

from __future__ import annotations

import logging
import math

from timerl.pdg.ir import PDG
from timerl.runtime.store import PointStore
from timerl.schedule.ast import AstNode, Exec, Loop, Seq, walk
from timerl.schedule.distance import edge_offsets
from timerl.symbolic import Sym

log = logging.getLogger(__name__)


def read_lags(pdg: PDG, dim: Sym) -> dict[int, int]:
    """Per node varying over ``dim``: how many iterations back its readers reach (bounded only)."""
    lags: dict[int, int | None] = {n.id: 0 for n in pdg if dim in n.domain}
    for e in pdg.edges:
        if e.order_only or e.src not in lags or lags[e.src] is None:
            continue
        off = edge_offsets(e, pdg).get(dim)
        if off is None or math.isinf(off[0]):
            lags[e.src] = None  # a reader without dim, or an unbounded look-back
            continue
        lags[e.src] = max(lags[e.src] or 0, int(-off[0]))
    return {k: v for k, v in lags.items() if v is not None}


def outer_loop(ast: AstNode, pdg: PDG, dim: Sym) -> Loop | None:
    """The top-level loop that runs every node varying over ``dim`` with ``dim = counter``."""
    tops: list[AstNode] = []
    todo = [ast]
    while todo:  # top-level statements, nested sequences flattened
        x = todo.pop(0)
        if isinstance(x, Seq):
            todo[:0] = list(x.children)
        else:
            tops.append(x)
    loops = [x for x in tops if isinstance(x, Loop)]
    if len(loops) != 1:
        return None
    loop = loops[0]
    inside = 0
    for x in walk(loop.body):
        if isinstance(x, Exec):
            dom = pdg.nodes[x.node].domain
            if dim in dom:
                if x.point[dom.index(dim)] is not loop.var:
                    return None
                inside += 1
    outside = [
        x
        for t in tops
        if t is not loop
        for x in walk(t)
        if isinstance(x, Exec) and dim in pdg.nodes[x.node].domain
    ]
    return loop if inside and not outside else None


class IterationCollector:
    """Frees the values no later iteration reads; call :meth:`collect` at each iteration start."""

    def __init__(self, pdg: PDG, dim: Sym) -> None:
        self.dim = dim
        lags = read_lags(pdg, dim)
        self.plan = [(nid, pdg.nodes[nid].domain.index(dim), lag) for nid, lag in sorted(lags.items())]

    def collect(self, store: PointStore, current: int) -> int:
        """Free points of iterations ``< current - lag``; returns the bytes released."""
        released = 0
        for nid, k, lag in self.plan:
            limit = current - lag
            if limit <= 0:
                continue
            for p in store.points(nid):
                if p[k] < limit:
                    released += store.free(nid, p)
        return released
