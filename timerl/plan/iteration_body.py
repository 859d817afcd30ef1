"""Whether the iteration loop's body runs as one compiled call, decided in the plan
(``runtime/iteration.py`` runs it).

An RL program's iteration (acting, learning, the optimiser's step) is the same computation
every iteration but for the values it reads from the iterations before. On JAX the whole body
of the iteration loop can then be traced once and run as one compiled function of the live
values it starts from: the host runs one call per iteration instead of a dispatch per
statement and the scans' bookkeeping. That is sound when every way the body depends on the
iteration counter ``i`` is one of:

* a coordinate ``i + c`` along the iteration dim of a point it runs, frees or reads (the
  runtime shifts the points of the traced iteration by the distance in ``i``);
* a condition (an ``If`` of the AST, a branch condition of a ``MERGE``): the runtime evaluates
  every such condition for all iterations of the inner loops around it (NumPy), and a body is
  reused only where all of them come out as they did for the traced iteration
  (:class:`BodyCond`);
* a value the host computes from the point (``EVAL_SYMBOL``, the seeds of random draws, a
  sink's point): computed per call by a host callback from the shift.

Its inner loops run as compiled scans, or are unrolled into the trace when they run at most
:data:`UNROLL_LIMIT` times per iteration. The verdict names the first thing that is none of
these (a UDF without a pure form, a dynamic bound, a long loop that does not scan, an index
``2 * i``, swapping) and the body then
runs statement by statement, as before.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from timerl.pdg.ir import PDG, Edge, Node
from timerl.pdg.ops import OpKind
from timerl.plan.regions import FusedExec
from timerl.schedule.ast import AstNode, Dealloc, Exec, Fetch, If, Loop, Offload, Seq
from timerl.symbolic import TRUE, Expr, Slice, Sym, free_symbols, substitute
from timerl.symbolic.compile import compile_expr
from timerl.symbolic.expr import add, mul
from timerl.symbolic.simplify import simplify

UNROLL_LIMIT = 256
"""Runs per iteration of the body of a loop that does not scan, up to which it is unrolled
into the compiled body (a longer loop keeps the body statement by statement)."""


def _trips(loop: Loop, pdg: PDG) -> int:
    """How many times ``loop`` (bounds static) runs its body, counted up to
    ``UNROLL_LIMIT + 1``."""
    env = {s: int(v) for s, v in pdg.static_bounds.items()}
    init, cond = compile_expr(loop.init), compile_expr(loop.cond)
    env[loop.var] = init(env)
    n = 0
    while n <= UNROLL_LIMIT and cond(env):
        n += 1
        env[loop.var] += loop.inc
    return n


@dataclass(frozen=True)
class BodyCond:
    """A condition of the body that depends on the iteration counter: ``expr`` over the AST's
    loop variables, evaluated inside the inner ``loops`` (outermost first) around it."""

    expr: Expr
    loops: tuple[Loop, ...]


def _walk(
    node: AstNode, var: Sym, loops: tuple[Loop, ...] = (), guarded: bool = False
) -> Iterator[tuple[AstNode, tuple[Loop, ...], bool]]:
    """Every statement under ``node`` with the loops around it (inside ``node``) and whether
    an ``If`` on ``var`` guards it."""
    yield node, loops, guarded
    if isinstance(node, Seq):
        for c in node.children:
            yield from _walk(c, var, loops, guarded)
    elif isinstance(node, If):
        g = guarded or var in free_symbols(node.cond)
        yield from _walk(node.then, var, loops, g)
        if node.else_ is not None:
            yield from _walk(node.else_, var, loops, g)
    elif isinstance(node, Loop):
        yield from _walk(node.body, var, (*loops, node), guarded)


def _moves_by_one(x: Expr | Slice, var: Sym) -> bool:
    """Whether ``x`` is ``var + c`` (``c`` free of ``var``), or free of ``var``; a slice when
    both ends are."""
    if isinstance(x, Slice):
        return _moves_by_one(x.start, var) and _moves_by_one(x.stop, var)
    if var not in free_symbols(x):
        return True
    return var not in free_symbols(simplify(add(x, mul(-1, var))))


def _attr_symbols(node: Node) -> set[Sym]:
    out: set[Sym] = set()

    def visit(v: object) -> None:
        if isinstance(v, (Expr, Slice)):
            out.update(free_symbols(v))
        elif isinstance(v, (tuple, list)):
            for x in v:
                visit(x)

    for name, v in node.op.attrs:
        if node.op.kind is OpKind.EVAL_SYMBOL and name == "expr":
            continue  # computed on the host per call
        visit(v)
    return out


def body_verdict(
    pdg: PDG,
    loop: Loop,
    dim: Sym,
    scanned: Mapping[int, str],
    has_blocks: bool,
) -> tuple[str, tuple[BodyCond, ...]]:
    """Why the body of the iteration loop ``loop`` (over the iteration dim ``dim``) cannot run
    as one compiled call ('' when it can), and the conditions the runtime checks per iteration
    before reusing a traced body. ``scanned``: the plan's scan verdicts (id(loop) -> why not)."""
    var = loop.var
    dyn = frozenset(pdg.dynamic_bounds)
    if has_blocks:
        return "some outputs are kept in block buffers (block_store)", ()
    conds: list[BodyCond] = []
    for s, loops, guarded in _walk(loop.body, var):
        if isinstance(s, (Offload, Fetch)):
            return "it swaps tensors to the host (swap)", ()
        if isinstance(s, Loop):
            bound = free_symbols(s.init) | free_symbols(s.cond)
            if var in bound or bound & dyn or bound & {lp.var for lp in loops}:
                return f"the bounds of its loop over {s.var} change along the loop", ()
            why = scanned.get(id(s), "loops are not scanned")
            if why:  # unrolled into the trace: only short loops
                runs = _trips(s, pdg) * math.prod(_trips(lp, pdg) for lp in loops if scanned.get(id(lp), "x"))
                if runs > UNROLL_LIMIT:
                    return (
                        f"its loop over {s.var} does not run as one scan ({why}) and its body runs "
                        f"more than {UNROLL_LIMIT} times per iteration, too many to unroll into one call",
                        (),
                    )
        elif isinstance(s, If):
            used = free_symbols(s.cond)
            if used & dyn:
                return f"the condition `{s.cond}` needs a dynamic bound", ()
            if var in used:
                conds.append(BodyCond(s.cond, loops))
        elif isinstance(s, (Exec, Dealloc)):
            why = _statement(pdg, s, loops, var, dim, dyn, conds, guarded)
            if why:
                return why, ()
    return "", tuple(dict.fromkeys(conds))


def _statement(
    pdg: PDG,
    s: Exec | Dealloc,
    loops: tuple[Loop, ...],
    var: Sym,
    dim: Sym,
    dyn: frozenset[Sym],
    conds: list[BodyCond],
    guarded: bool,
) -> str:
    """Why statement ``s`` cannot be in a compiled body. Under an ``If`` on the iteration
    (``guarded``: the first iteration's reset, say), a statement that cannot be traced does not
    refuse the body: an iteration that runs it is not compiled (the runtime finds out when it
    traces one)."""
    members = s.members if isinstance(s, FusedExec) else (s.node,)
    n0 = pdg.nodes[members[0]]
    for d, x in zip(n0.domain, s.point, strict=True):
        used = free_symbols(x.start) | free_symbols(x.stop) if isinstance(x, Slice) else free_symbols(x)
        if used & dyn:
            return f"{n0.label} runs at a point with a dynamic bound"
        if var in used and (d is not dim or not _moves_by_one(x, var)):
            return f"{n0.label} runs at {d} = {x}, which does not move by one with the iteration"
    if isinstance(s, Dealloc):
        return ""
    at = dict(zip(n0.domain, s.point, strict=True))
    for nid in members:
        n = pdg.nodes[nid]
        k = n.op.kind
        if k is OpKind.SET_SYMBOL and not guarded:
            return f"{n.label} sets a dynamic bound"
        if k is OpKind.UDF and not guarded:
            pure = getattr(n.op.attr("fn"), "pure_step", None)
            if pure is None or pure() is None:
                return f"the UDF {n.label} has no pure form"
        if _attr_symbols(n) & (dyn | {dim}):
            return f"{n.label} has attributes that depend on {dim} or on a dynamic bound"
        for e in pdg.data_in_edges(nid):
            why = _edge(pdg, e, n, dim, dyn)
            if why:
                return why
            if e.cond is not TRUE and dim in free_symbols(e.cond):
                conds.append(BodyCond(substitute(e.cond, at), loops))
    return ""


def _edge(pdg: PDG, e: Edge, n: Node, dim: Sym, dyn: frozenset[Sym]) -> str:
    src = pdg.nodes[e.src]
    parts: list[tuple[Sym | None, Expr | Slice]] = list(zip(src.domain, e.phi, strict=False))
    parts += [(None, x) for _, x in e.batch_read]
    if e.select is not None:
        parts.append((None, e.select))
    for d, x in parts:
        used = free_symbols(x.start) | free_symbols(x.stop) if isinstance(x, Slice) else free_symbols(x)
        if used & dyn:
            return f"{n.label} reads {src.label} at an index with a dynamic bound"
        if dim in used and (d is not dim or not _moves_by_one(x, dim)):
            return f"{n.label} reads {src.label} at {x}, which does not move by one with {dim}"
    if free_symbols(e.cond) & dyn:
        return f"{n.label} chooses a branch by a dynamic bound"
    return ""
