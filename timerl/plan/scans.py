"""Which static loops run as one compiled scan, decided in the plan (``runtime/scan.py`` runs them).

A loop is scanned when every statement of its body (nested ``Seq``s inlined, regions
expanded into their members, frees aside: they run after the scan) is an ``Exec`` of a pure
op without symbolic attributes, a ``MERGE``, or a UDF with a pure form (``fn.pure_step()``;
on Torch's host loops any UDF), its bounds are static, and no member takes part in a dynamic bound. Every other loop gets
the reason, which the Plan's listing shows and the log reports at INFO."""

from __future__ import annotations

from timerl.pdg.ir import PDG, Node
from timerl.pdg.ops import OpKind
from timerl.plan.fusable import fusable
from timerl.plan.regions import FusedExec
from timerl.schedule.ast import AstNode, Dealloc, Exec, If, Loop, Seq, walk
from timerl.symbolic import Slice, Sym, free_symbols, substitute
from timerl.symbolic.expr import add, mul
from timerl.symbolic.simplify import simplify


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


def _dynamic_parts(pdg: PDG) -> tuple[frozenset[Sym], frozenset[int], list[frozenset[Sym]]]:
    """The dynamic bounds, their setters, and the dims enclosing each bound's dim."""
    setters, enclosing = set(), []
    for n in pdg:
        if n.op.kind is OpKind.SET_SYMBOL and n.op.attr("dim") in n.domain:
            setters.add(n.id)
            enclosing.append(frozenset(n.domain[: n.domain.index(n.op.attr("dim"))]))
    return frozenset(pdg.dynamic_bounds), frozenset(setters), enclosing


def why_not_scanned(loop: Loop, pdg: PDG, host_udfs: bool = False) -> str:
    """Why ``loop`` cannot run as one scan ('' when it can). ``host_udfs``: the scan is a
    host loop (Torch), where a UDF without a pure form is called as the interpreter calls it."""
    execs: list[Exec] = []
    for c in flat(loop.body):
        if frees_only(c):
            continue
        if type(c) is not Exec:
            return f"its body holds a {type(c).__name__}"
        execs.append(c)
    if not execs:
        return "its body has no statement"
    dyn, setters, enclosing = _dynamic_parts(pdg)
    if (free_symbols(loop.init) | free_symbols(loop.cond)) & dyn:
        return "its bounds are dynamic"
    for c in execs:
        n = pdg.nodes[c.node]
        if n.id in setters or any(enc <= set(n.domain) for enc in enclosing):
            return f"{n.label} takes part in a dynamic bound"
        k = n.op.kind
        if k is OpKind.MERGE:
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


def scan_verdicts(ast: AstNode, pdg: PDG, gc_loop: Loop | None, host_udfs: bool = False) -> dict[int, str]:
    """Per loop of ``ast`` (by ``id``): '' when it runs as one scan, else why not. The loop
    at whose steps whole iterations are freed (``gc_loop``) is not scanned; ``host_udfs``: see
    :func:`why_not_scanned`."""
    out = {}
    for lp in walk(ast):
        if isinstance(lp, Loop):
            out[id(lp)] = (
                "whole iterations are freed at its steps"
                if lp is gc_loop
                else why_not_scanned(lp, pdg, host_udfs)
            )
    return out
