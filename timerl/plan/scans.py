"""Which loops run as one compiled scan, decided in the plan (``runtime/scan.py`` runs them).

A loop is scanned when every statement of its body (nested ``Seq``s inlined, regions
expanded into their members, frees aside: they run after the scan) is an ``Exec`` of a pure
op without symbolic attributes, a ``MERGE``, a random draw (seeded per point, the seeds an
input of the scan), a UDF with a pure form (``fn.pure_step()``; on Torch's host loops any
UDF), or the ``SET_SYMBOL`` node that ends the loop's own dynamic bound, and no member's
point or read depends on a dynamic bound. A loop whose condition uses a dynamic bound (``t <
T``, ``T`` found by a done-signal) runs in chunks: a ``lax.while_loop`` over a bucket of
iterations that stops after the step whose done-signal ends ``T`` (a host loop stops there
too); with ``T`` known at entry it is scanned as a static loop. Not under a
``memory_budget`` (a chunk's outputs are buffers of the bucket's length, which the peak
estimate does not model). Every other loop gets the reason, which the Plan's listing shows
and the log reports at INFO."""

from __future__ import annotations

from timerl.pdg.ir import PDG, Node
from timerl.pdg.ops import OpKind
from timerl.plan.fusable import fusable
from timerl.plan.regions import FusedExec
from timerl.schedule.ast import AstNode, Dealloc, Exec, If, Loop, Seq, walk
from timerl.symbolic import Slice, Sym, free_symbols, lift, substitute
from timerl.symbolic.expr import add, mul
from timerl.symbolic.simplify import affine_in, simplify


def flat(node: AstNode) -> list[AstNode]:
    """The statements of a body with nested ``Seq``s inlined and regions expanded into one
    ``Exec`` per member, in order."""
    if isinstance(node, Seq):
        return [x for c in node.children for x in flat(c)]
    if isinstance(node, FusedExec):
        return [Exec(m, node.point) for m in node.members]
    return [node]


def frees_only(node: AstNode) -> bool:
    """A ``Dealloc``, or ``If``/``Seq`` statements holding nothing but frees."""
    leaves = [n for n in walk(node) if not isinstance(n, (Seq, If))]
    return bool(leaves) and all(isinstance(n, Dealloc) for n in leaves)


def scan_members(loop: Loop) -> list[Exec]:
    """The statements a scan of ``loop`` runs per iteration (its frees run after the scan)."""
    return [c for c in flat(loop.body) if not frees_only(c)]  # type: ignore[misc]


_RANDOM = (OpKind.RAND_UNIFORM, OpKind.RAND_NORMAL)


def why_not_scanned(loop: Loop, pdg: PDG, host_udfs: bool = False, dynamic: bool = True) -> str:
    """Why ``loop`` cannot run as one scan ('' when it can). ``host_udfs``: the scan is a
    host loop (Torch), where a UDF without a pure form is called as the interpreter calls it;
    ``dynamic``: a loop over a dynamic bound may run in chunks (not under a memory budget)."""
    execs: list[Exec] = []
    for c in flat(loop.body):
        if frees_only(c):
            continue
        if type(c) is not Exec:
            return f"its body holds a {type(c).__name__}"
        execs.append(c)
    if not execs:
        return "it only frees (every iteration's frees at once, where they evaluate elementwise)"
    dyn = frozenset(pdg.dynamic_bounds)
    if free_symbols(loop.init) & dyn:
        return "its start is a dynamic bound"
    ends = free_symbols(loop.cond) & dyn
    if ends and not dynamic:
        return "its bounds are dynamic (a memory_budget is set: chunks are not in the peak estimate)"
    for c in execs:
        n = pdg.nodes[c.node]
        k = n.op.kind
        if k is OpKind.SET_SYMBOL:
            if n.op.attr("bound") not in ends:
                return f"{n.label} sets a dynamic bound other than the loop's own"
            step = affine_in(lift(c.point[n.domain.index(n.op.attr("dim"))]), loop.var)
            if step is None or step[0] * int(loop.inc) != 1:
                return f"{n.label} finds the loop's bound at points that do not move up by one per iteration"
            continue
        why = _dynamic_use(pdg, n, c, dyn, ends)
        if why:
            return why
        if k is OpKind.MERGE:
            continue
        if k in _RANDOM:
            if n.op.symbols():
                return f"{n.label} ({k.name}) has symbolic attributes"
            continue
        if k is OpKind.UDF:
            pure = getattr(n.op.attr("fn"), "pure_step", None)
            if not host_udfs and (pure is None or pure() is None):
                return f"the UDF {n.label} has no pure form"
            continue
        if not fusable(n):
            return f"{n.label} ({k.name}) is not a pure op without symbolic attributes"
    for c in execs:
        n = pdg.nodes[c.node]
        window = _varying_window(pdg, n, c, loop.var)
        if window:
            return f"{n.label} reads a window of {window} whose length changes along the loop"
    return ""


def _dynamic_use(pdg: PDG, n: Node, c: Exec, dyn: frozenset[Sym], ends: set[Sym]) -> str:
    """Why ``n`` at ``c``'s point depends on a dynamic bound ('' when it does not): its
    point, a read's indices, condition or selection, or an attribute use one. A ``MERGE``'s
    branch conditions may use the loop's own bound (``0 <= t - 1 < T``): the runtime
    evaluates them as the interpreter does, with ``T`` at its lower bound and unbounded,
    which must agree."""
    if any(free_symbols(x) & dyn for x in c.point):
        return f"{n.label} runs at a point that uses a dynamic bound"
    merge = n.op.kind is OpKind.MERGE
    for e in pdg.data_in_edges(n.id):
        exprs = [*e.phi, *(x for _, x in e.batch_read)] + ([e.select] if e.select is not None else [])
        if free_symbols(e.cond) & (dyn - ends if merge else dyn):
            return f"{n.label} reads {pdg.nodes[e.src].label} under a condition that uses a dynamic bound"
        if any(free_symbols(x) & dyn for x in exprs):
            return f"{n.label} reads {pdg.nodes[e.src].label} at a point that uses a dynamic bound"
    if n.op.symbols() & dyn:
        return f"{n.label} has an attribute that uses a dynamic bound"
    return ""


def _varying_window(pdg: PDG, n: Node, c: Exec, var: Sym) -> str:
    """The label of a value ``n`` reads through a slice whose length moves with ``var``
    (its rows cannot be stacked into one scanned input), else ''."""
    at = dict(zip(n.domain, c.point, strict=True))
    for e in pdg.data_in_edges(n.id):
        for ix in (*e.phi, *(x for _, x in e.batch_read)):
            if isinstance(ix, Slice):
                length = simplify(add(substitute(ix.stop, at), mul(-1, substitute(ix.start, at))))
                if var in free_symbols(length):
                    return pdg.nodes[e.src].label
    return ""


def scan_verdicts(
    ast: AstNode, pdg: PDG, gc_loop: Loop | None, host_udfs: bool = False, dynamic: bool = True
) -> dict[int, str]:
    """Per loop of ``ast`` (by ``id``): '' when it runs as one scan, else why not. The loop
    at whose steps whole iterations are freed (``gc_loop``) is not scanned; ``host_udfs`` and
    ``dynamic``: see :func:`why_not_scanned`."""
    out = {}
    for lp in walk(ast):
        if isinstance(lp, Loop):
            out[id(lp)] = (
                "whole iterations are freed at its steps"
                if lp is gc_loop
                else why_not_scanned(lp, pdg, host_udfs, dynamic)
            )
    return out
