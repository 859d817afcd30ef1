"""Polyhedral execution scheduling of a PDG (paper §6.1, §6.3).

:func:`schedule_pdg` turns a PDG into an execution order:

1. every node becomes an isl statement over its domain (static bounds substituted,
   dynamic bounds kept as parameters ``>= 1``);
2. every edge (data and ``order_only``) becomes a validity dependence
   (source points before the reading sink point) and a proximity constraint
   (slices reduced to their last point, constant ``min`` / ``max`` arguments dropped);
3. isl's scheduler (default options, with proximity) computes a schedule tree, and
   isl's AST generator turns it into loops, which are converted to timerl's AST.

Preconditions: the PDG's index expressions are affine (see ``timerl.schedule.isl``),
every bound is static or dynamic.

Postconditions: the returned :class:`Schedule` executes every domain point of every
node exactly once, after all the points it reads (for every value of the dynamic
bounds ``>= 1``); its AST uses counters ``_c{k}`` and the PDG's bound symbols.
Raises :class:`~timerl.errors.ScheduleError` when no such order exists.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from timerl.errors import ScheduleError
from timerl.pdg.ir import PDG, Edge
from timerl.schedule import ast as tast
from timerl.schedule.ast import AstNode
from timerl.schedule.cluster import cluster_pdg, expand_ast, split_prologue
from timerl.schedule.distance import edge_offsets
from timerl.schedule.isl import IslProgram

log = logging.getLogger(__name__)


MAX_UNCLUSTERED = 40
"""Largest statement count for which a failed clustered schedule is retried unclustered."""


@dataclass(frozen=True)
class Schedule:
    """A computed execution schedule.

    ``ast``: timerl's AST to interpret; ``isl_text``: the isl schedule tree (for debugging
    and caching; re-readable with ``isl.Schedule.read_from_str``); ``c_text``: isl's
    C-like listing of the generated AST.
    """

    ast: AstNode
    isl_text: str
    c_text: str = ""

    def pretty(self) -> str:
        return tast.pretty(self.ast)


def schedule_pdg(pdg: PDG, cluster: bool = True, _clustered: bool = False) -> Schedule:
    """Compute the execution schedule of ``pdg`` (see the module docstring).

    With ``cluster`` (default), identity-linked nodes are scheduled as one statement
    (``timerl.schedule.cluster``), which keeps isl fast on large programs.
    """
    if cluster:
        rest, prologue = split_prologue(pdg)
        small, members = cluster_pdg(rest)
        if len(small.nodes) < len(pdg.nodes) and small.nodes:
            _check_own_self_reads(pdg)
            try:
                s = schedule_pdg(small, cluster=False, _clustered=True)
            except ScheduleError:
                if len(rest.nodes) > MAX_UNCLUSTERED:
                    raise  # isl takes minutes on hundreds of statements; the cluster error names them
                # re-run unclustered for a precise error (or a schedule)
                return schedule_pdg(pdg, cluster=False)
            pro = tuple(tast.Exec(n, ()) for n in prologue)
            return Schedule(tast.Seq(pro + (expand_ast(s.ast, members),)), s.isl_text, s.c_text)
    t0 = time.perf_counter()
    prog = IslProgram(pdg)
    validity = prog.dependences(proximity=False)
    proximity = prog.dependences(proximity=True, edges=proximity_edges(pdg))
    if not _clustered:  # a cluster's self-edges include member-to-member reads at one point
        _check_self_reads(pdg, prog, validity)
    sched = prog.compute_schedule(validity, proximity)
    if sched is None:
        raise _unschedulable(pdg, prog)
    bad = prog.violated(sched, validity)
    if _clustered:  # same-point reads between members of a cluster: the member order runs them
        bad = bad.subtract(prog.domain().identity())
    if not bad.is_empty():
        raise ScheduleError(
            f"isl returned a schedule that violates dependences {bad.to_str()}; "
            "this is a bug in the scheduler, please report it with the PDG"
        )
    t1 = time.perf_counter()
    ast, c_text = prog.build_ast(sched)
    t2 = time.perf_counter()
    log.debug(
        "scheduled %d nodes / %d edges: isl schedule %.3fs, AST %.3fs\n%s",
        len(pdg.nodes), len(pdg.edges), t1 - t0, t2 - t1, c_text,
    )  # fmt: skip
    return Schedule(ast=ast, isl_text=prog.schedule_text(sched), c_text=c_text)


def proximity_edges(pdg: PDG) -> list[Edge]:
    """Per (source, sink) pair, the edges reading the latest source points.

    isl minimises the largest proximity distance, so an identity read next to a window
    read ``r[t:t + n]`` of the same statement would keep the two apart (distance 0
    versus n - 1) and stop isl from interleaving n-step learning with acting. Only the
    reads that bound how early the sink can run matter for locality.
    """
    groups: dict[tuple[int, int], list[tuple[Edge, dict]]] = {}
    for e in pdg.edges:
        groups.setdefault((e.src, e.sink), []).append((e, edge_offsets(e, pdg)))
    out: list[Edge] = []
    for items in groups.values():
        for k, (e, off) in enumerate(items):
            dominated = any(
                j != k
                and other.keys() == off.keys()
                and all(other[d][1] >= off[d][1] for d in off)
                and (any(other[d][1] > off[d][1] for d in off) or j < k)
                for j, (_, other) in enumerate(items)
            )
            if not dominated:
                out.append(e)
    return out


def _check_own_self_reads(pdg: PDG) -> None:
    """The self-read check on the nodes' own self-edges (before clustering)."""
    selfish = {e.src for e in pdg.edges if e.src == e.sink}
    if not selfish:
        return
    sub = pdg.with_(
        nodes={k: pdg.nodes[k] for k in selfish},
        edges=tuple(e for e in pdg.edges if e.src == e.sink),
    )
    prog = IslProgram(sub)
    _check_self_reads(sub, prog, prog.dependences(proximity=False))


def _check_self_reads(pdg: PDG, prog: IslProgram, validity: object) -> None:
    """A point that depends on itself can never run (isl silently ignores such pairs)."""
    for nid in prog.self_dependent(validity):
        node = pdg.nodes[nid]
        raise ScheduleError(
            f"cannot schedule {node.label}: some of its points read themselves "
            f"({prog.self_dependent(validity)[nid]}). Hint: a recurrence must read only strictly "
            "earlier points (e.g. x[t - 1], not x[t]); check the edge conditions."
        )


def _sccs(pdg: PDG) -> list[list[int]]:
    """Strongly connected components of the node graph (Tarjan), with cycles only."""
    succ: dict[int, set[int]] = {n: set() for n in pdg.nodes}
    for e in pdg.edges:
        succ[e.src].add(e.sink)
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    stack: list[int] = []
    on: set[int] = set()
    out: list[list[int]] = []
    counter = 0

    def visit(v: int) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on.add(v)
        for w in sorted(succ[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in succ[v]:
                out.append(sorted(comp))

    for v in sorted(pdg.nodes):
        if v not in index:
            visit(v)
    return out


def _unschedulable(pdg: PDG, prog: IslProgram) -> ScheduleError:
    """Name the smallest cycle of nodes isl cannot order on its own."""
    culprits: list[int] | None = None
    for comp in sorted(_sccs(pdg), key=len):
        members = set(comp)
        sub = pdg.with_(
            nodes={k: pdg.nodes[k] for k in comp},
            edges=tuple(e for e in pdg.edges if e.sink in members and e.src in members),
        )
        sp = IslProgram(sub, prog.ctx)
        if sp.compute_schedule(sp.dependences(False), sp.dependences(True)) is None:
            culprits = comp
            break
    if culprits is None:
        culprits = sorted(pdg.nodes)
    labels = ", ".join(pdg.nodes[k].label for k in culprits)
    return ScheduleError(
        f"cannot schedule {labels}: their dependences form a cycle with no legal execution order. "
        "Hint: a recurrence must read only strictly earlier points (e.g. x[t - 1], not x[t] or x[t + 1]); "
        "check the branch conditions of recursive definitions."
    )
