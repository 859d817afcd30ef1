"""Deallocation statements placed by isl (paper §6.2; ``shared/notes/isl_recipe.md`` §5).

With ``CompileOptions(dealloc=True)`` every stored node ``X`` whose points are read gets a
free statement ``F{X}`` over the points some edge reads, grafted into the *frozen* compute
schedule (the paper's second round): the compute order is never changed, a free only
added after the last reader of each point.

1. **Uses.** ``uses_X``: ``F_X[p] -> C[q]`` for every data edge ``C[q] <- X[phi(q)]``
   (the inverted dependence map, ``phi^-1``), with clustered nodes read through their
   cluster's statement. A point of ``X`` over a dynamic dim ``t`` also counts ``T``'s
   setter ``Z[e, t]`` as a use: whether ``X[.., t, ..]`` has a later reader (``x[t + 1]``
   exists only if ``t + 1 < T``) is known only once ``Z`` ran at ``t``, so the free waits
   for it (otherwise isl guards it by ``t + 1 == T`` before ``T`` is known).
2. **Last use.** With the compute schedule ``theta`` (restricted to the domain and to the
   run's parameters), ``last = lexmax(uses . theta)`` and
   ``U = last . theta^-1 & uses``: each point with its last reader's instance.
3. **Graft.** For each leaf of the schedule tree (reverse pre-order, so earlier paths
   stay valid), the frees whose last user runs at that leaf become an extension node
   ``prefix time -> F_X[p]`` grafted after the leaf.

Points no edge reads (final parameters ``w[I]``, ``o_next[i, T - 1]``) are never freed
here; nodes in ``keep`` (values read after the run, such as a final checkpoint's) are not
either. ``free_iterations`` (``runtime/gc.py``) still frees whole finished iterations of
what is left.

The result is checked against the validity of the frees (each free after every reader
and after the write, every read point freed) by :meth:`IslProgram.ast_violations`; the
caller falls back to the schedule without frees when the check fails.

:func:`sink_frees` then moves each ``Dealloc`` after the run of ``Exec``s that follows it
in its ``Seq`` (never past a loop or an ``If``), so frees do not split the runs the
runtime fuses into compiled regions.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace

import islpy as isl

from timerl.pdg.ir import PDG, Edge
from timerl.pdg.passes.enclose import enclosing_dims
from timerl.schedule.ast import AstNode, Dealloc, Exec, If, Loop, Seq

log = logging.getLogger(__name__)

FREE_PREFIX = "F"
"""isl tuple names of free statements: ``F{node id}``."""

_BOUND_USE_IID = -3  # iid of the synthetic edges "a free waits for T's setter"


@dataclass(frozen=True)
class FreeRequest:
    """What to free: the PDG before clustering, each node's statement (cluster
    representative; nodes absent are never freed, e.g. the prologue) and nodes to keep."""

    pdg: PDG
    stmt_of: Mapping[int, int]
    keep: frozenset[int] = frozenset()


def free_name(nid: int) -> str:
    return f"{FREE_PREFIX}{nid}"


@dataclass(frozen=True)
class _Frees:
    """Free statements: ``F{k}`` frees ``members[k]`` (nodes read by the same relations, so
    freed at the same instances) at points of statement ``stmt[k]``."""

    members: dict[int, tuple[int, ...]]
    stmt: dict[int, int]
    uses: isl.UnionMap  # F_k[p] -> user instance, bound uses included
    reads: isl.UnionMap  # the data reads only


def _uses(req: FreeRequest, prog: object) -> _Frees:
    """The free statements with their uses (see the module doc), restricted to the points
    some data edge reads. Nodes of one statement read through the same relations share one
    free statement: PPO's 700 nodes need about 60, which keeps isl's AST and its check fast."""
    pdg, stmt = req.pdg, req.stmt_of
    maps: dict[str, isl.Map] = {}
    texts: dict[int, set[str]] = {}
    for e in pdg.edges:
        if e.order_only or e.src in req.keep or e.src not in stmt or e.sink not in stmt:
            continue
        mapped = replace(e, src=stmt[e.src], sink=stmt[e.sink])
        txt = prog.edge_text(mapped)
        if txt not in maps:  # S_c[q] -> S_x[p]
            maps[txt] = prog.edge_map(mapped).intersect_range(prog.node_domain(mapped.src))
        texts.setdefault(e.src, set()).add(txt)
    by_key: dict[tuple[int, frozenset[str]], list[int]] = {}
    for x in sorted(texts):
        by_key.setdefault((stmt[x], frozenset(texts[x])), []).append(x)
    space = prog.context().get_space()
    reads = isl.UnionMap.empty(space)
    members: dict[int, tuple[int, ...]] = {}
    stmts: dict[int, int] = {}
    per: dict[int, isl.UnionMap] = {}
    for k, ((st, key), xs) in enumerate(by_key.items()):
        members[k], stmts[k] = tuple(xs), st
        um = isl.UnionMap.empty(space)
        for txt in sorted(key):
            um = um.union(
                isl.UnionMap.from_map(maps[txt].reverse().set_tuple_name(isl.dim_type.in_, free_name(k)))
            )
        per[k] = um
        reads = reads.union(um)
    uses = reads
    for _, (t, enclosing, zid) in sorted(enclosing_dims(pdg).items(), key=lambda kv: kv[0].name):
        if zid not in stmt:
            continue
        from timerl.schedule.scheduler import _setter_point  # the scheduler imports this module

        z = pdg.nodes[zid]
        for k, um in per.items():
            node = pdg.nodes[members[k][0]]
            if t not in node.domain or not set(enclosing) <= set(node.domain):
                continue
            e = Edge(stmts[k], stmt[zid], _BOUND_USE_IID, 0, _setter_point(pdg, z, t, t), order_only=True)
            m = prog.edge_map(e).set_tuple_name(isl.dim_type.in_, free_name(k))  # F_k[p] -> Z[e, t]
            uses = uses.union(isl.UnionMap.from_map(m).intersect_domain(um.domain()))
    return _Frees(members, stmts, uses, reads)


def _leaves(node: isl.ScheduleNode, path: tuple[int, ...], out: list) -> None:
    """Every leaf of the tree below ``node``: ``(path of child indices, leaf node)``, pre-order."""
    if node.get_type() == isl.schedule_node_type.leaf:
        out.append((path, node))
        return
    for k in range(node.n_children()):
        _leaves(node.child(k), (*path, k), out)


def graft_frees(
    req: FreeRequest, prog: object, sched: isl.Schedule
) -> tuple[isl.Schedule, isl.UnionMap, isl.UnionSet, dict[int, tuple[int, ...]]] | None:
    """``(schedule with frees, validity of the frees, their domain, nodes each free
    statement frees)``, or ``None`` when no point is freed (see the module doc)."""
    t0 = time.perf_counter()
    run = prog.run_context()
    frees = _uses(req, prog)
    uses = frees.uses.intersect_params(run)
    if uses.is_empty():
        return None
    theta = sched.get_map().intersect_domain(sched.get_domain()).intersect_params(run)
    last = uses.apply_range(theta).lexmax()
    last_user = last.apply_range(theta.reverse()).intersect(uses)
    leaves: list = []
    _leaves(sched.get_root(), (), leaves)
    grafts = []
    for path, leaf in leaves:
        here = last_user.intersect_range(leaf.get_domain())
        if here.is_empty():
            continue
        ext = here.apply_range(leaf.get_prefix_schedule_union_map()).reverse()
        grafts.append((path, ext))
    for path, ext in reversed(grafts):  # later leaves first: earlier paths stay valid
        node = sched.get_root()
        for k in path:
            node = node.child(k)
        node = node.graft_after(isl.ScheduleNode.from_extension(ext))
        sched = node.get_schedule()
    domain = frees.reads.domain().intersect_params(run)
    # each free after every use and after the write of the points it frees
    validity = uses.reverse().union(_own_writes(frees, prog).intersect_params(run))
    log.debug(
        "placed %d free statements (%d nodes) after %d leaves in %.3fs",
        len(frees.members), sum(map(len, frees.members.values())), len(grafts), time.perf_counter() - t0,
    )  # fmt: skip
    return sched, validity, domain, frees.members


def _own_writes(frees: _Frees, prog: object) -> isl.UnionMap:
    """``S[p] -> F_k[p]`` for every freed point."""
    out = isl.UnionMap.empty(prog.context().get_space())
    freed = frees.reads.domain()
    for k, st in frees.stmt.items():
        dom = prog.node_domain(st)
        ident = isl.Map.identity(dom.get_space().map_from_set()).intersect_domain(dom)
        ident = ident.set_tuple_name(isl.dim_type.out, free_name(k))
        out = out.union(isl.UnionMap.from_map(ident).intersect_range(freed))
    return out


def expand_frees(node: AstNode, members: Mapping[int, tuple[int, ...]]) -> AstNode:
    """Replace each ``Dealloc(k)`` of a free statement by one ``Dealloc`` per node it frees."""
    if isinstance(node, Dealloc):
        ms = members[node.node]
        return Dealloc(ms[0], node.point) if len(ms) == 1 else Seq(tuple(Dealloc(m, node.point) for m in ms))
    if isinstance(node, Seq):
        return Seq(tuple(expand_frees(c, members) for c in node.children))
    if isinstance(node, Loop):
        return replace(node, body=expand_frees(node.body, members))
    if isinstance(node, If):
        return replace(
            node,
            then=expand_frees(node.then, members),
            else_=None if node.else_ is None else expand_frees(node.else_, members),
        )
    return node


def sink_frees(node: AstNode) -> AstNode:
    """Move each ``Dealloc`` of a ``Seq`` after the ``Exec``s that follow it (module doc)."""
    if isinstance(node, Seq):
        kids = [sink_frees(c) for c in node.children]
        out: list[AstNode] = []
        held: list[AstNode] = []
        for c in kids:
            if isinstance(c, Dealloc):
                held.append(c)
            elif isinstance(c, Exec) or (isinstance(c, Seq) and all(isinstance(x, Exec) for x in c.children)):
                out.append(c)  # a cluster's members too
            else:
                out.extend(held)
                held.clear()
                out.append(c)
        out.extend(held)
        return Seq(tuple(out))
    if isinstance(node, Loop):
        return replace(node, body=sink_frees(node.body))
    if isinstance(node, If):
        return replace(
            node, then=sink_frees(node.then), else_=None if node.else_ is None else sink_frees(node.else_)
        )
    return node
