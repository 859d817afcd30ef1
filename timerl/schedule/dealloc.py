"""Deallocation statements placed by isl (paper §6.2; ``shared/notes/isl_recipe.md`` §5).

With ``CompileOptions(dealloc=True)`` every stored node ``X`` whose points are read gets a
free statement ``F{X}`` over the points some edge reads, grafted into the *frozen* compute
schedule (the paper's second round): the compute order is never changed, a free only
added after the last reader of each point.

1. **Uses.** ``uses_X``: ``F_X[p] -> C[q]`` for every data edge ``C[q] <- X[phi(q)]``
   (the inverted dependence map, ``phi^-1``), with clustered nodes read through their
   cluster's statement. Under a dynamic bound ``T`` (per enclosing point ``e``, set by
   ``Z[e, t]``), the frees of ``X[p]`` (``X`` over ``e``) also use every setter point
   ``Z[e, s]`` before which ``p``'s readers are not determined: two values of ``T`` that
   the runtime cannot tell apart before ``Z[e, s]`` give ``p`` different readers
   (:func:`_bound_waits`). ``x[t]`` read by ``x[t + 1]`` waits for ``Z[e, t]``,
   ``x[p]`` read at ``t // 2`` for ``Z[e, 2 p]``, ``a[e]`` read along ``t < T - 1`` for
   ``Z[e, T - 1]``; otherwise isl guards the free by ``t + 1 == T``, ``T <= 2 p`` or
   ``T == 1`` where ``T`` is not known yet. A node lacking some of ``e`` (a block over
   ``(di,)`` read at every ``(i, t, di)``) waits for the setter points of every ``e``: its
   free after the last reader ``(I - 1, T - 1)`` was placed before that step's setter.
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

import functools
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

import islpy as isl

from timerl.pdg.ir import PDG, Edge
from timerl.pdg.passes.enclose import enclosing_dims
from timerl.schedule.ast import AstNode, Dealloc, Exec, If, Loop, Seq
from timerl.schedule.bound_known import setter_point
from timerl.schedule.isl import stmt_name
from timerl.symbolic import ZERO, Slice, Sym

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
    swap: frozenset[int] = frozenset()  # nodes to swap as well (``schedule/swap.py``)


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
    per: dict[int, isl.UnionMap]  # the data reads of each free statement
    # per member of ``members[k]``, the outputs ``F{k}`` frees (empty: all of them)
    outputs: dict[int, tuple[tuple[int, ...], ...]]


def _free_parts(
    pdg: PDG,
    texts: Mapping[tuple[int, int], set[str]],
    swap: frozenset[int],
    read_points: Callable[[int, int], isl.Set],
    dynamic: set[str],
) -> list[tuple[int, tuple[int, ...]]]:
    """``(node, outputs)`` freed together, in node order: a node whose outputs are read
    through different relations gets one free per group of outputs read alike (an env
    step's observation is freed after the next step reads it, not when its rewards are
    read after the episode), each group freeing the outputs no edge reads too (freeing an
    absent point is a no-op); every other node one free of all its outputs (``()``), and
    so does a swapped node (its offloads and fetches move whole points)."""
    by_node: dict[int, dict[int, frozenset[str]]] = {}
    for (x, o), ts in texts.items():
        by_node.setdefault(x, {})[o] = frozenset(ts)
    out: list[tuple[int, tuple[int, ...]]] = []
    for x in sorted(by_node):
        read = by_node[x]
        groups: dict[frozenset[str], list[int]] = {}
        for o in sorted(read):
            groups.setdefault(read[o], []).append(o)
        if len(groups) == 1 or x in swap or _rest_is_dynamic(x, list(groups.values()), read_points, dynamic):
            out.append((x, ()))
            continue
        unread = [o for o in range(len(pdg.nodes[x].outputs)) if o not in read]
        out += [(x, tuple(sorted(os + unread))) for os in groups.values()]
    return out


def _rest_is_dynamic(
    x: int, groups: list[list[int]], read_points: Callable[[int, int], isl.Set], dynamic: set[str]
) -> bool:
    """Whether the points one group of ``x``'s outputs is read at and another is not depend on a
    dynamic bound (the last step of an episode): the free of the other group's outputs there
    would be guarded by a bound not known yet, so ``x`` is freed whole."""
    doms = [functools.reduce(isl.Set.union, (read_points(x, o) for o in g)) for g in groups]
    for a in doms:
        for b in doms:
            rest = a.subtract(b)
            for name in dynamic:
                pos = rest.find_dim_by_name(isl.dim_type.param, name)
                if pos >= 0 and rest.involves_dims(isl.dim_type.param, pos, 1):
                    return True
    return False


def _rest_of_split_points(
    members: Mapping[int, tuple[int, ...]],
    outputs: Mapping[int, tuple[tuple[int, ...], ...]],
    per: Mapping[int, isl.UnionMap],
) -> list[tuple[int, int, int, isl.UnionMap]]:
    """For a node freed per output: ``(k, node, o, uses)`` for each free statement ``k`` of
    some of its outputs and each other output ``o`` it has, with ``k``'s uses restricted to
    the points ``k`` frees where no edge reads ``o`` (as one free of all outputs would, it
    frees ``o`` there: an env step's observation after the run's last step)."""
    where: dict[int, list[tuple[int, tuple[int, ...]]]] = {}
    for k, ms in members.items():
        for x, outs in zip(ms, outputs[k], strict=True):
            if outs:
                where.setdefault(x, []).append((k, outs))
    out = []
    for x, parts in where.items():
        doms = {k: _dom(per[k]) for k, _ in parts}
        for k, outs in parts:
            for k2, outs2 in parts:
                rest = doms[k].subtract(doms[k2])
                if k2 == k or rest.is_empty():
                    continue
                for o in outs2:
                    if o in outs:  # unread outputs are freed by every part already
                        continue
                    name = per[k].get_map_list().get_at(0).get_tuple_name(isl.dim_type.in_)
                    out.append(
                        (k, x, o, per[k].intersect_domain(isl.UnionSet.from_set(rest.set_tuple_name(name))))
                    )
    return out


def _dom(um: isl.UnionMap) -> isl.Set:
    """The points a free statement's uses free, as an unnamed set."""
    return isl.Set.from_union_set(um.domain()).reset_tuple_id()


def _uses(req: FreeRequest, prog: object) -> _Frees:
    """The free statements with their uses (see the module doc), restricted to the points
    some data edge reads. Nodes of one statement read through the same relations share one
    free statement: PPO's 700 nodes need about 60, which keeps isl's AST and its check fast."""
    pdg, stmt = req.pdg, req.stmt_of
    maps: dict[str, isl.Map] = {}
    texts: dict[tuple[int, int], set[str]] = {}  # (node, output) -> read relations
    for e in pdg.edges:
        if e.order_only or e.src in req.keep or e.src not in stmt or e.sink not in stmt:
            continue
        mapped = replace(e, src=stmt[e.src], sink=stmt[e.sink])
        txt = prog.edge_text(mapped)
        if txt not in maps:  # S_c[q] -> S_x[p]
            maps[txt] = prog.edge_map(mapped).intersect_range(prog.node_domain(mapped.src))
        texts.setdefault((e.src, e.oid), set()).add(txt)
    by_key: dict[tuple[int, frozenset[str]], list[tuple[int, tuple[int, ...]]]] = {}
    dynamic = {n for n, b in prog.param_syms.items() if b in pdg.dynamic_bounds}

    def read_points(x: int, o: int) -> isl.Set:
        got = [maps[txt].range() for txt in sorted(texts[(x, o)])]
        out = got[0]
        for g in got[1:]:
            out = out.union(g)
        return out.coalesce()

    for x, outs in _free_parts(pdg, texts, req.swap, read_points, dynamic):
        key = frozenset().union(*(ts for (y, o), ts in texts.items() if y == x and (not outs or o in outs)))
        by_key.setdefault((stmt[x], key), []).append((x, outs))
    space = prog.context().get_space()
    reads = isl.UnionMap.empty(space)
    members: dict[int, tuple[int, ...]] = {}
    outputs: dict[int, tuple[tuple[int, ...], ...]] = {}
    stmts: dict[int, int] = {}
    per: dict[int, isl.UnionMap] = {}
    for k, ((st, key), xs) in enumerate(by_key.items()):
        members[k], outputs[k], stmts[k] = tuple(x for x, _ in xs), tuple(o for _, o in xs), st
        um = isl.UnionMap.empty(space)
        for txt in sorted(key):
            um = um.union(
                isl.UnionMap.from_map(maps[txt].reverse().set_tuple_name(isl.dim_type.in_, free_name(k)))
            )
        per[k] = um
        reads = reads.union(um)
    for k0, x, o, um in _rest_of_split_points(members, outputs, per):
        k = len(members)
        parts: list[isl.Map] = []
        um.foreach_map(parts.append)  # one map per reading statement
        um = isl.UnionMap.empty(space)
        for m in parts:
            um = um.union(isl.UnionMap.from_map(m.set_tuple_name(isl.dim_type.in_, free_name(k))))
        members[k], outputs[k], stmts[k], per[k] = (x,), ((o,),), stmts[k0], um
        reads = reads.union(um)
    uses = reads
    for bound, (t, _, zid) in sorted(enclosing_dims(pdg).items(), key=lambda kv: kv[0].name):
        if zid not in stmt:
            continue
        for k, um in per.items():
            uses = uses.union(_bound_waits(prog, req, k, stmts[k], um, (bound, t, zid)))
    return _Frees(members, stmts, uses, reads, per, outputs)


def _bound_waits(
    prog: object, req: FreeRequest, k: int, x_stmt: int, reads: isl.UnionMap, setter: tuple[Sym, Sym, int]
) -> isl.UnionMap:
    """``F_k[p] -> Z[e, s]`` for every setter point of ``bound`` (``T``) before which the
    readers of ``p`` are not determined yet.

    After ``Z[e, s - 1]`` the runtime knows ``T`` if ``T <= s``, else only ``T >= s + 1``.
    The free of ``p`` must wait for ``Z[e, s]`` when two values ``T1, T2 >= s + 1`` (at which
    ``p`` exists) give ``p`` different readers: ``x[t + 1]`` reading ``x[t]`` makes the free
    of ``x[t]`` wait for ``Z[e, t]``, ``y[t] = x[t // 2]`` the free of ``x[p]`` for
    ``Z[e, 2 p]``, and a reader over ``t`` of ``w[e]`` (or ``x[T - 1 - t]``) for ``T``
    itself (``Z[e, T - 1]``). Without it isl would guard a free by ``T == 1`` or
    ``T <= 2 p`` where ``T`` is not known yet.
    """
    pdg, stmt = req.pdg, req.stmt_of
    bound, t, zid = setter
    name = next((n for n, b in prog.param_syms.items() if b == bound), None)
    if name is None:  # the bound does not reach isl (no statement uses it)
        return isl.UnionMap.empty(reads.get_space())
    a, b = _renamed(reads, name, _WAIT_A), _renamed(reads, name, _WAIT_B)
    exists = isl.UnionSet.from_set(prog.node_domain(x_stmt).set_tuple_name(free_name(k)))
    differ = (
        a.subtract(b).union(b.subtract(a)).domain()
        .intersect(_renamed(exists, name, _WAIT_A)).intersect(_renamed(exists, name, _WAIT_B))
    )  # fmt: skip
    if differ.is_empty():
        return isl.UnionMap.empty(reads.get_space())
    z, zs = pdg.nodes[zid], stmt[zid]
    at = setter_point(pdg, z, t, Slice(ZERO, bound), pdg.nodes[x_stmt].domain)
    every = Edge(x_stmt, zs, _BOUND_USE_IID, 0, at, order_only=True)
    waits = isl.UnionMap.from_map(prog.edge_map(every).set_tuple_name(isl.dim_type.in_, free_name(k)))
    zvars = [f"z{j}" for j in range(len(z.domain))]
    s = zvars[z.domain.index(t)]
    before = isl.UnionSet.read_from_str(
        prog.ctx,
        f"[{_WAIT_A}, {_WAIT_B}] -> {{ {stmt_name(zs)}[{', '.join(zvars)}] : {s} < {_WAIT_A} and {s} < {_WAIT_B} }}",
    )
    waits = waits.intersect_domain(differ).intersect_range(before)
    ids = isl.IdList.from_id(isl.Id.read_from_str(prog.ctx, _WAIT_A)).add(
        isl.Id.read_from_str(prog.ctx, _WAIT_B)
    )
    return waits.project_out_param_id_list(ids)


_WAIT_A, _WAIT_B = "_Ta", "_Tb"  # two values of a dynamic bound, compared by _bound_waits


def _renamed(x: isl.UnionMap | isl.UnionSet, old: str, new: str) -> isl.UnionMap | isl.UnionSet:
    """``x`` with its parameter ``old`` renamed ``new`` (a different parameter for isl)."""
    parts: list = []
    (x.foreach_map if isinstance(x, isl.UnionMap) else x.foreach_set)(parts.append)
    out = type(x).empty(x.get_space())
    for part in parts:
        pos = part.find_dim_by_name(isl.dim_type.param, old)
        if pos >= 0:
            part = part.set_dim_name(isl.dim_type.param, pos, new)
        out = out.union(type(x).from_map(part) if isinstance(x, isl.UnionMap) else type(x).from_set(part))
    return out


def _leaves(node: isl.ScheduleNode, path: tuple[int, ...], out: list) -> None:
    """Every leaf of the tree below ``node``: ``(path of child indices, leaf node)``, pre-order."""
    if node.get_type() == isl.schedule_node_type.leaf:
        out.append((path, node))
        return
    for k in range(node.n_children()):
        _leaves(node.child(k), (*path, k), out)


def graft_frees(
    req: FreeRequest, prog: object, sched: isl.Schedule, order: isl.UnionMap | None = None
) -> (
    tuple[
        isl.Schedule, isl.UnionMap, isl.UnionSet, dict[int, tuple[tuple[int, tuple[int, ...]], ...]], object
    ]
    | None
):
    """``(schedule with frees, validity of the frees, their domain, ``(node, outputs)`` each
    free statement frees, swap plan or None)``, or ``None`` when no point is freed (see the
    module doc). With ``req.swap``, the offloads and fetches of ``schedule/swap.py`` are
    grafted too (offloads after a leaf like frees, fetches before it), their validity and
    domain included. ``order``: the compute instances' execution order (instance -> time)
    to take last uses from, instead of ``sched``'s map (the order of its AST, see
    ``scheduler._with_frees``)."""
    t0 = time.perf_counter()
    run = prog.run_context()
    frees = _uses(req, prog)
    uses = frees.uses.intersect_params(run)
    if uses.is_empty():
        return None
    theta = sched.get_map().intersect_domain(sched.get_domain()) if order is None else order
    theta = theta.intersect_params(run)
    last = uses.apply_range(theta).lexmax()
    last_user = last.apply_range(theta.reverse()).intersect(uses)
    plan = None
    if req.swap:
        from timerl.schedule.swap import plan_swaps

        plan = plan_swaps(req, frees, req.swap, prog, theta, run)
    after = last_user if plan is None else last_user.union(plan.after)
    leaves: list = []
    _leaves(sched.get_root(), (), leaves)
    grafts = []
    for path, leaf in leaves:
        dom = leaf.get_domain()
        here = after.intersect_range(dom)
        first = None if plan is None else plan.before.intersect_range(dom)
        if here.is_empty() and (first is None or first.is_empty()):
            continue
        prefix = leaf.get_prefix_schedule_union_map()
        ext = None if here.is_empty() else here.apply_range(prefix).reverse()
        pre = None if first is None or first.is_empty() else first.apply_range(prefix).reverse()
        grafts.append((path, ext, pre))
    for path, ext, pre in reversed(grafts):  # later leaves first: earlier paths stay valid
        node = sched.get_root()
        for k in path:
            node = node.child(k)
        if ext is not None:
            node = node.graft_after(isl.ScheduleNode.from_extension(ext))
        if pre is not None:
            node = node.graft_before(isl.ScheduleNode.from_extension(pre))
        sched = node.get_schedule()
    domain = frees.reads.domain().intersect_params(run)
    # each free after every use and after the write of the points it frees
    validity = uses.reverse().union(_own_writes(frees, prog).intersect_params(run))
    if plan is not None:
        domain = domain.union(plan.domain.intersect_params(run))
        validity = validity.union(plan.validity.intersect_params(run))
    log.debug(
        "placed %d free statements (%d nodes) after %d leaves in %.3fs",
        len(frees.members), sum(map(len, frees.members.values())), len(grafts), time.perf_counter() - t0,
    )  # fmt: skip
    parts = {k: tuple(zip(ms, frees.outputs[k], strict=True)) for k, ms in frees.members.items()}
    return sched, validity, domain, parts, plan


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


def expand_frees(node: AstNode, members: Mapping[int, tuple[tuple[int, tuple[int, ...]], ...]]) -> AstNode:
    """Replace each ``Dealloc(k)`` of a free statement by one ``Dealloc`` per ``(node,
    outputs)`` it frees."""
    if isinstance(node, Dealloc):
        ms = [Dealloc(m, node.point, outs) for m, outs in members[node.node]]
        return ms[0] if len(ms) == 1 else Seq(tuple(ms))
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
