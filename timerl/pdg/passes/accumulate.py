"""Sums over a whole episode as running sums (issue 33: the learner interleaved with acting).

A reduction over every step of an episode, ``x[e, 0:T].sum(0)`` (a weight gradient summed
over the steps, before ``contract`` turns it into one contraction of stacked rows), holds
every ``x[e, t]`` until the episode ends: its peak grows with ``T``. Written as a running
sum, ``acc[e, 0] = x[e, 0]``, ``acc[e, t] = acc[e, t - 1] + x[e, t]``, read at
``acc[e, T - 1]``, each step's term is added (and freed) as soon as it exists, so the sum
holds one partial result whatever ``T`` (TimeRL §8.4's n-step schedule keeps ``O(n)``
values live). This is TimeRL's Alg. 3 with blocks of one step along the episode's own dim,
which also works when ``T`` is dynamic (blocks of equal size need a static ``T``).

Rewritten: a ``SUM`` over dim 0 (``keepdim=False``), unbatched, unconditional, with one
data input that reads its source at ``0:T`` along one dim ``t`` whose bound ``T`` is in
``bounds`` and at the sum's own point along every other dim (the sum's domain is the
source's without ``t``), with no condition, ``select`` or batch read. The sum keeps its id
and becomes an ``IDENTITY`` of ``acc[e, T - 1]``, so its readers are unchanged. Values
equal the batched sum's up to float summation order.

:func:`accumulate_episode_sums` is chosen by ``memory_budget`` when a peak grows with a
dynamic bound (``CompileOptions(accumulate=True)``, ``compile._fit_dynamic``); it runs
before ``contract`` so the sums it rewrites are not contracted.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import replace

from timerl.pdg.ir import PDG, Edge, Node
from timerl.pdg.ops import Op, OpKind
from timerl.symbolic import TRUE, Const, Slice, Sym, lift
from timerl.symbolic.expr import cmp_eq, cmp_le

log = logging.getLogger(__name__)


def _episode_dim(pdg: PDG, r: Node, e: Edge, bounds: frozenset[Sym]) -> Sym | None:
    """The dim ``t`` that ``e`` (the only input of the sum ``r``) reads whole (``0:T``, ``T``
    in ``bounds``), reading every other dim at ``r``'s own point; None if it does not."""
    src = pdg.nodes[e.src]
    if e.cond is not TRUE or e.select is not None or e.batch_read or e.to_batch is not None:
        return None
    if src.batch or r.batch or r.cond is not TRUE:
        return None
    t = None
    for d, c in zip(src.domain, e.phi, strict=True):
        if isinstance(c, Slice):
            bound = pdg.bound_of(d)
            if t is not None or bound not in bounds:
                return None
            if not (isinstance(c.start, Const) and c.start.value == 0 and c.stop is bound):
                return None
            t = d
        elif c is not d:
            return None
    if t is None or tuple(d for d in src.domain if d is not t) != tuple(r.domain):
        return None
    return t


def accumulate_episode_sums(pdg: PDG, bounds: Iterable[Sym] | None = None) -> PDG:
    """``pdg`` with every sum over a whole episode (module doc) as a running sum; ``bounds``:
    the bounds whose dims are summed this way (default: the dynamic ones). Unchanged when
    there is none."""
    over = frozenset(pdg.dynamic_bounds if bounds is None else bounds)
    if not over:
        return pdg
    nodes = dict(pdg.nodes)
    edges = list(pdg.edges)
    next_id = max(nodes, default=-1) + 1
    done = 0
    for r in list(pdg):
        if r.op.kind is not OpKind.SUM or tuple(r.op.attr("dims", ())) != (0,) or r.op.attr("keepdim", False):
            continue
        ins = pdg.data_in_edges(r.id)
        if len(ins) != 1 or len(r.outputs) != 1:
            continue
        e = ins[0]
        t = _episode_dim(pdg, r, e, over)
        if t is None:
            continue
        src = pdg.nodes[e.src]
        dom = tuple(src.domain)
        acc, add = next_id, next_id + 1
        next_id += 2
        later = cmp_le(lift(1), t)
        nodes[add] = replace(r, id=add, op=Op.make(OpKind.ADD), domain=dom, cond=later, num_inputs=2)
        nodes[acc] = replace(r, id=acc, op=Op.make(OpKind.MERGE), domain=dom, num_inputs=2)
        nodes[r.id] = replace(r, op=Op.make(OpKind.IDENTITY), num_inputs=1)
        edges.remove(e)
        edges += [
            Edge(acc, src.id, 0, e.oid, dom, cond=cmp_eq(t, lift(0))),
            Edge(acc, add, 1, 0, dom, cond=later),
            Edge(add, acc, 0, 0, tuple(d - 1 if d is t else d for d in dom)),
            Edge(add, src.id, 1, e.oid, dom),
            Edge(r.id, acc, 0, 0, tuple(pdg.bound_of(t) - 1 if d is t else d for d in dom)),
        ]
        done += 1
        log.debug("accumulate: %s sums %s over %s as a running sum", r.label, src.label, t)
    if not done:
        return pdg
    log.info("accumulate: %d sum(s) over whole episodes as running sums", done)
    return pdg.with_(nodes=nodes, edges=tuple(edges))
