"""Checks around scheduling: undefined reads (compile time) and AST verification (tests).

* :func:`check_reads_defined` (compile time, exact, via isl): every point a data edge
  reads lies in the source's *defined set*: its domain, or for a ``MERGE`` source the
  union over its branches of ``{q : branch cond(q) and phi_k(q) within the branch
  source's domain}``. Edges *into* a merge are not checked on their own: a branch
  that reads outside its source only makes the merge undefined there, which matters
  only if someone reads those merge points. Static bounds are substituted, dynamic
  bounds are parameters ``>= 1`` (a read that is undefined for some value of them is
  an error). Raises :class:`~timerl.errors.UndefinedPointError` for the first violation.

* :func:`verify_ast` (brute force, for tests): interprets an AST with concrete bounds
  and checks that every domain point executes exactly once, nothing else executes,
  and every source point read executes before its reader. Raises
  :class:`~timerl.errors.ScheduleError`.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator, Mapping

from timerl.errors import ScheduleError, SymbolicError, UndefinedPointError
from timerl.pdg.ir import PDG, Edge, Node
from timerl.pdg.ops import OpKind
from timerl.schedule.ast import AstNode, Dealloc, Exec, If, Loop, Seq
from timerl.schedule.isl import IslProgram
from timerl.symbolic import Const, Slice, Sym, evaluate

log = logging.getLogger(__name__)


# -- undefined reads ------------------------------------------------------------------


def check_reads_defined(pdg: PDG) -> None:
    """Raise :class:`UndefinedPointError` if some data edge reads a point with no definition."""
    prog = IslProgram(pdg)
    context = prog.context()
    defined: dict[int, object] = {}

    def defined_set(nid: int):  # -> isl.Set
        if nid in defined:
            return defined[nid]
        node = pdg.nodes[nid]
        if node.op.kind is not OpKind.MERGE:
            out = prog.node_domain(nid)
        else:
            out = prog.node_domain(nid).subtract(prog.node_domain(nid))  # empty, same space
            for br in pdg.data_in_edges(nid):
                bad = prog.edge_map(br).subtract_range(prog.node_domain(br.src)).domain()
                out = out.union(prog.cond_set(br).subtract(bad))
        defined[nid] = out
        return out

    for e in pdg.edges:
        if e.order_only:
            continue
        sink, src = pdg.nodes[e.sink], pdg.nodes[e.src]
        if sink.op.kind is OpKind.MERGE or _reads_in_box(pdg, e):
            continue
        reads = prog.edge_map(e).range()
        bad = reads.subtract(defined_set(e.src)).intersect_params(context)
        if bad.is_empty():
            continue
        points = prog.named_set(bad, src)
        example = prog.example_point(bad, src)
        raise UndefinedPointError(
            f"{src.label} is read by {sink.label} at points where it is not defined: {points} "
            f"(for example {example}). Hint: add a branching definition for these points "
            f"(such as {example.split(' ')[0]} = ...), or guard the read with a condition."
        )
    log.debug("check_reads_defined: %d edges OK", len(pdg.edges))


def _reads_in_box(pdg: PDG, e: Edge) -> bool:
    """Whether ``e`` evidently reads only points of its source's domain, which is the whole
    box ``0 <= d < D`` (no condition, not a ``MERGE``): every index is a dim of the reader
    with the same bound, the whole range ``0:D``, or a constant below a static ``D``. Every
    other edge is left to isl."""
    src, sink = pdg.nodes[e.src], pdg.nodes[e.sink]
    if src.op.kind is OpKind.MERGE or not (isinstance(src.cond, Const) and src.cond.value is True):
        return False
    try:
        for d, comp in zip(src.domain, e.phi, strict=True):
            bound = pdg.bound_of(d)
            if isinstance(comp, Sym):
                if not (any(x is comp for x in sink.domain) and pdg.bound_of(comp) is bound):
                    return False
            elif isinstance(comp, Slice):
                if not (isinstance(comp.start, Const) and comp.start.value == 0 and comp.stop is bound):
                    return False
            elif isinstance(comp, Const):
                size = pdg.static_bounds.get(bound)
                if size is None or not 0 <= comp.value < size:
                    return False
            else:
                return False
    except (KeyError, ValueError):  # malformed: isl's check reports it
        return False
    return True


# -- brute-force AST verification -------------------------------------------------------

MAX_STEPS = 2_000_000


def _env(pdg: PDG, bounds: Mapping[Sym, int]) -> dict[Sym, int]:
    env: dict[Sym, int] = dict(pdg.static_bounds)
    env.update(bounds)
    for _, b in pdg.dims:
        if b not in env:
            raise ScheduleError(f"verify_ast: no value for bound `{b}`")
    return env


def domain_points(pdg: PDG, node: Node, env: Mapping[Sym, int]) -> Iterator[tuple[int, ...]]:
    """All points of ``node``'s domain for concrete bounds (brute force)."""
    ranges = [range(env[pdg.bound_of(d)]) for d in node.domain]
    for p in itertools.product(*ranges):
        local = dict(env)
        local.update(zip(node.domain, p, strict=True))
        if evaluate(node.cond, local):
            yield p


def run_ast(ast: AstNode, env: Mapping[Sym, int]) -> list[tuple[int, tuple[int, ...]]]:
    """Interpret ``ast`` with concrete values; return the executed (node, point) in order."""
    out: list[tuple[int, tuple[int, ...]]] = []
    steps = 0

    def go(n: AstNode, local: dict[Sym, int]) -> None:
        nonlocal steps
        if isinstance(n, Seq):
            for c in n.children:
                go(c, local)
        elif isinstance(n, Loop):
            v = evaluate(n.init, local)
            inner = dict(local)
            while True:
                inner[n.var] = v
                if not evaluate(n.cond, inner):
                    break
                go(n.body, inner)
                v += n.inc
                steps += 1
                if steps > MAX_STEPS:
                    raise ScheduleError(f"verify_ast: loop over {n.var} does not terminate")
        elif isinstance(n, If):
            if evaluate(n.cond, local):
                go(n.then, local)
            elif n.else_ is not None:
                go(n.else_, local)
        elif isinstance(n, Exec):
            out.append((n.node, tuple(int(evaluate(x, local)) for x in n.point)))
        elif isinstance(n, Dealloc):
            pass
        else:
            raise ScheduleError(f"verify_ast: unknown AST node {n!r}")

    try:
        go(ast, dict(env))
    except SymbolicError as exc:
        raise ScheduleError(f"verify_ast: cannot evaluate the AST: {exc}") from exc
    return out


def verify_ast(pdg: PDG, ast: AstNode, bounds: dict[Sym, int]) -> None:
    """Check ``ast`` against ``pdg`` for concrete bound values (``bounds`` adds to static ones)."""
    env = _env(pdg, bounds)
    trace = run_ast(ast, env)
    when: dict[tuple[int, tuple[int, ...]], int] = {}
    for k, inst in enumerate(trace):
        nid, p = inst
        if nid not in pdg.nodes:
            raise ScheduleError(f"verify_ast: AST executes unknown node %{nid}")
        if inst in when:
            raise ScheduleError(f"verify_ast: {pdg.nodes[nid].label} runs twice at {p} (env {_show(env)})")
        when[inst] = k
    domains = {n.id: set(domain_points(pdg, n, env)) for n in pdg}
    for nid, p in when:
        if p not in domains[nid]:
            raise ScheduleError(
                f"verify_ast: {pdg.nodes[nid].label} runs at {p}, outside its domain (env {_show(env)})"
            )
    for nid, pts in domains.items():
        missing = pts - {p for (m, p) in when if m == nid}
        if missing:
            raise ScheduleError(
                f"verify_ast: {pdg.nodes[nid].label} never runs at {sorted(missing)[:5]} (env {_show(env)})"
            )
    for e in pdg.edges:
        sink, src = pdg.nodes[e.sink], pdg.nodes[e.src]
        for q in domains[e.sink]:
            local = dict(env)
            local.update(zip(sink.domain, q, strict=True))
            if not (e.cond is Const(True) or evaluate(e.cond, local)):
                continue
            comps = [evaluate(c, local) for c in e.phi]
            axes = [c if isinstance(c, range) else (c,) for c in comps]
            for p in itertools.product(*axes):
                p = tuple(int(x) for x in p)
                if p not in domains[e.src]:
                    continue  # undefined reads are check_reads_defined's business
                if when[(e.src, p)] >= when[(e.sink, q)]:
                    kind = "order edge" if e.order_only else "read"
                    raise ScheduleError(
                        f"verify_ast: {sink.label} at {q} runs before {src.label} at {p}, "
                        f"which it depends on ({kind} {e!r}; env {_show(env)})"
                    )


def _show(env: Mapping[Sym, int]) -> str:
    return ", ".join(f"{k.name}={v}" for k, v in sorted(env.items(), key=lambda kv: kv[0].name))


__all__ = ["check_reads_defined", "domain_points", "run_ast", "verify_ast"]
