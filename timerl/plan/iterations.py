"""The iteration dim and what crosses iterations: the facts about ``i`` the plan decides from.

Most RL programs run iteration-major: one outer loop over the first dim with a static bound
(``i``, :func:`iteration_dim`) around everything. :func:`iteration_loop` finds that loop in
a schedule (the runtime then frees whole iterations, ``runtime/gc.py``, and checkpoints at
its ends); :func:`read_lags` says how far back readers reach along ``i``, and
:func:`carried_values` which values a checkpoint must save."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from timerl.pdg.ir import PDG, Edge
from timerl.schedule.ast import AstNode, Exec, If, Loop, Seq, walk
from timerl.schedule.distance import edge_offsets
from timerl.symbolic import And, Eq, Expr, Slice, Sym, affine_difference, evaluate, free_symbols, linear_form


def iteration_dim(pdg: PDG) -> Sym | None:
    """The outermost dim that nodes vary over and whose bound is static (``i``), if any."""
    used = {d for n in pdg for d in n.domain}
    for s, b in pdg.dims:
        if s in used and b in pdg.static_bounds:
            return s
    return None


def read_back(e: Edge, pdg: PDG, dim: Sym) -> int | None:
    """How many iterations of ``dim`` before its own the sink of ``e`` reads (``0``: none);
    ``None`` when unbounded (``x[0:i]``, a constant index, a sink without ``dim``)."""
    off = edge_offsets(e, pdg).get(dim)
    if off is None or math.isinf(off[0]):
        return None
    return max(0, int(-off[0]))


def read_lags(pdg: PDG, dim: Sym) -> dict[int, int]:
    """Per node varying over ``dim``: how many iterations back its readers reach (bounded only)."""
    lags: dict[int, int | None] = {n.id: 0 for n in pdg if dim in n.domain}
    for e in pdg.edges:
        if e.order_only or e.src not in lags or lags[e.src] is None:
            continue
        back = read_back(e, pdg, dim)
        lags[e.src] = None if back is None else max(lags[e.src] or 0, back)
    return {k: v for k, v in lags.items() if v is not None}


def _pinned(cond: Expr, var: Sym) -> int | None:
    """``k`` when ``cond`` (or one of its conjuncts) says ``var == k``, else ``None``."""
    if isinstance(cond, And):
        pins = [_pinned(c, var) for c in cond.args]
        return next((k for k in pins if k is not None), None)
    if not isinstance(cond, Eq):
        return None
    (ca, ka), (cb, kb) = linear_form(cond.args[0]), linear_form(cond.args[1])
    coeffs = {x: ca.get(x, 0) - cb.get(x, 0) for x in ca.keys() | cb.keys()}
    c = coeffs.pop(var, 0)
    if c not in (1, -1) or any(coeffs.values()):
        return None
    return (kb - ka) * c


def _execs(node: AstNode, var: Sym, pin: int | None = None) -> Iterator[tuple[Exec, int | None]]:
    """The execs under ``node`` with the value ``var`` is pinned to by enclosing ``If``s."""
    if isinstance(node, Exec):
        yield node, pin
    elif isinstance(node, Seq):
        for c in node.children:
            yield from _execs(c, var, pin)
    elif isinstance(node, If):
        k = _pinned(node.cond, var)
        yield from _execs(node.then, var, pin if k is None else k)
        if node.else_ is not None:
            yield from _execs(node.else_, var, pin)
    elif isinstance(node, Loop):
        yield from _execs(node.body, var, pin)


def loop_offset(loop: Loop, pdg: PDG, dim: Sym) -> int | None:
    """``c`` when every exec of a ``dim`` node in ``loop`` runs at ``dim = counter + c`` (one
    ``c``). An exec at a constant point under ``if (counter == k)`` (isl's code for a
    statement run at one iteration only, such as a final checkpoint) counts as ``c = point - k``."""
    offs = set()
    for st, pin in _execs(loop.body, loop.var):
        if dim in pdg.nodes[st.node].domain:
            comp = st.point[pdg.nodes[st.node].domain.index(dim)]
            if isinstance(comp, Slice):
                return None
            if loop.var in free_symbols(comp):
                offs.add(affine_difference(comp, loop.var))
            elif pin is not None and not free_symbols(comp):
                offs.add(int(evaluate(comp, {})) - pin)
            else:
                return None
    if len(offs) != 1 or None in offs or loop.inc != 1:
        return None
    return offs.pop()


def iteration_loop(ast: AstNode, pdg: PDG, dim: Sym) -> tuple[Loop, int] | None:
    """The one loop running every exec of a ``dim`` node, each at ``dim = counter + c``:
    ``(loop, c)`` for an iteration-major schedule, else ``None``."""
    found: list[Loop] = []
    stray = False

    def rec(node: AstNode) -> None:
        nonlocal stray
        if isinstance(node, Loop):
            if any(isinstance(st, Exec) and dim in pdg.nodes[st.node].domain for st in walk(node.body)):
                found.append(node)
        elif isinstance(node, Seq):
            for c in node.children:
                rec(c)
        elif isinstance(node, If):
            rec(node.then)
            if node.else_ is not None:
                rec(node.else_)
        elif isinstance(node, Exec) and dim in pdg.nodes[node.node].domain:
            stray = True  # a point of some iteration runs outside the loop

    rec(ast)
    if len(found) != 1 or stray:
        return None
    c = loop_offset(found[0], pdg, dim)
    return None if c is None else (found[0], c)


@dataclass(frozen=True)
class Carried:
    """Output ``oid`` of node ``nid``, read across the ``i`` boundary.

    ``lag``: the sinks read at most ``lag`` iterations back (``None``: any earlier one).
    """

    name: str
    nid: int
    oid: int
    lag: int | None
    shape: str
    dtype: str
    batch: tuple[int, ...]

    def spec(self) -> dict[str, Any]:
        return {"shape": self.shape, "dtype": self.dtype, "batch": list(self.batch)}


def carried_values(pdg: PDG, i: Sym) -> list[Carried]:
    """The values read across the ``i`` boundary, in a stable order (see the module doc)."""
    lags: dict[tuple[int, int], int | None] = {}
    readers: dict[tuple[int, int], set[str]] = {}
    for e in pdg.edges:
        if e.order_only:
            continue
        src, sink = pdg.nodes[e.src], pdg.nodes[e.sink]
        if i not in src.domain:
            continue
        # any slice over i: every earlier point (kept as written by the first version)
        lag = None if isinstance(e.phi[src.domain.index(i)], Slice) else read_back(e, pdg, i)
        if lag == 0:
            continue  # same (or a later) iteration: nothing crosses the boundary
        key = (e.src, e.oid)
        if key in lags:
            old = lags[key]
            lags[key] = None if old is None or lag is None else max(old, lag)
        else:
            lags[key] = lag
        if sink.name:
            readers.setdefault(key, set()).add(sink.name)
    names: dict[tuple[int, int], str] = {}
    derived: set[tuple[int, int]] = set()  # named after a reader, not by the user
    for nid, oid in lags:
        src = pdg.nodes[nid]
        nm = src.name
        if nm is None and readers.get((nid, oid)):
            nm = sorted(readers[(nid, oid)])[0]
            derived.add((nid, oid))
        names[(nid, oid)] = f"%{nid}.{oid}" if nm is None else (nm if oid == 0 else f"{nm}:{oid}")
    own = {names[k] for k in names if k not in derived}
    for k in derived:  # `w[i + 1] = new[i]`: the update is `w.next` beside `w` itself
        if names[k] in own:
            names[k] = f"{names[k]}.next"
    counts: dict[str, int] = {}
    for nm in names.values():
        counts[nm] = counts.get(nm, 0) + 1
    out = []
    for nid, oid in sorted(lags):
        nm = names[(nid, oid)]
        if counts[nm] > 1:
            nm = f"%{nid}.{oid}"
        spec = pdg.nodes[nid].outputs[oid]
        shape = "(" + ", ".join(str(x) for x in spec.shape) + (",)" if len(spec.shape) == 1 else ")")
        out.append(
            Carried(nm, nid, oid, lags[(nid, oid)], shape, spec.dtype.name, tuple(pdg.nodes[nid].batch))
        )
    return out


def checkpoint_sinks(pdg: PDG) -> list[Any]:
    """The functions of the program's checkpoint sinks (``x.checkpoint(path)``: sink
    functions with ``serves_checkpoints = True``), served at the iteration loop's ends."""
    from timerl.pdg.ops import OpKind

    return [
        n.op.attr("fn")
        for n in pdg
        if n.op.kind is OpKind.SINK and getattr(n.op.attr("fn"), "serves_checkpoints", False)
    ]


def kept_values(pdg: PDG) -> frozenset[int]:
    """Nodes that frees and merge moves must leave alone: with checkpoint sinks, the values a
    checkpoint saves (read from the store, outside the PDG's edges, up to after the run)."""
    if not checkpoint_sinks(pdg):
        return frozenset()
    i = iteration_dim(pdg)
    return frozenset(c.nid for c in carried_values(pdg, i)) if i is not None else frozenset()
