"""timerl's own AST: what the scheduler emits and the runtime interprets.

Counters are symbols named ``_c0, _c1, ...``; every expression may use counters,
bound symbols (``T``, possibly dynamic: known only at runtime) and constants.

* ``Loop(var, init, cond, inc, body)``: ``for var = init; cond; var += inc``.
* ``If(cond, then, else_)``.
* ``Seq(children)``: run in order.
* ``Exec(node, point)``: run PDG node ``node`` at the domain point given by
  ``point`` (one expression per domain dim of the node, in the node's dim order).
* ``Dealloc(node, point, outputs)``: the stored outputs of ``node`` at ``point`` (those in
  ``outputs``, default all) have no later reader and can be freed.
* ``Offload(node, point)``: move the stored outputs of ``node`` at ``point`` from the
  device pool to the host pool (swapping, ``schedule/swap.py``); ``Fetch(node, point,
  outputs)``: move them (those in ``outputs``, default all) back before their next reader.

After post-processing (``schedule/swap.py::postprocess``) a memory statement's point may
hold :class:`~timerl.symbolic.Slice` components: the batched form of a static loop that
held only memory statements (one call over the range of points).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from timerl.symbolic import Expr, Sym


@dataclass(frozen=True, slots=True)
class Loop:
    var: Sym
    init: Expr
    cond: Expr
    inc: int
    body: AstNode


@dataclass(frozen=True, slots=True)
class If:
    cond: Expr
    then: AstNode
    else_: AstNode | None = None


@dataclass(frozen=True, slots=True)
class Seq:
    children: tuple[AstNode, ...]


@dataclass(frozen=True, slots=True)
class Exec:
    node: int
    point: tuple[Expr, ...]


@dataclass(frozen=True, slots=True)
class Dealloc:
    node: int
    point: tuple[Expr, ...]
    outputs: tuple[int, ...] = ()  # the outputs to free (empty: all)


@dataclass(frozen=True, slots=True)
class Offload:
    node: int
    point: tuple[Expr, ...]


@dataclass(frozen=True, slots=True)
class Fetch:
    node: int
    point: tuple[Expr, ...]
    outputs: tuple[int, ...] = ()  # the outputs to move back (empty: all)


AstNode = Loop | If | Seq | Exec | Dealloc | Offload | Fetch
MemOp = (Dealloc, Offload, Fetch)
"""The memory statements (no data read or written, only moved or dropped)."""

_KIND = {Dealloc: "free", Offload: "offload", Fetch: "fetch"}


def pretty(node: AstNode, indent: int = 0) -> str:
    """C-like listing of an AST (for debugging and docs)."""
    pad = "  " * indent
    if isinstance(node, Seq):
        return "\n".join(pretty(c, indent) for c in node.children)
    if isinstance(node, Loop):
        head = f"{pad}for ({node.var} = {node.init}; {node.cond}; {node.var} += {node.inc}) {{"
        return f"{head}\n{pretty(node.body, indent + 1)}\n{pad}}}"
    if isinstance(node, If):
        s = f"{pad}if ({node.cond}) {{\n{pretty(node.then, indent + 1)}\n{pad}}}"
        if node.else_ is not None:
            s += f" else {{\n{pretty(node.else_, indent + 1)}\n{pad}}}"
        return s
    args = ", ".join(map(str, node.point))
    kind = _KIND.get(type(node), "exec")
    outs = getattr(node, "outputs", ())
    return f"{pad}{kind} %{node.node}({args})" + (f" outputs {list(outs)}" if outs else "")


def walk(node: AstNode):
    """Yield every AST node, pre-order."""
    yield node
    if isinstance(node, Seq):
        for c in node.children:
            yield from walk(c)
    elif isinstance(node, Loop):
        yield from walk(node.body)
    elif isinstance(node, If):
        yield from walk(node.then)
        if node.else_ is not None:
            yield from walk(node.else_)


def inline_seqs(children: Sequence[AstNode]) -> list[AstNode]:
    """``children`` with nested ``Seq``s replaced by their statements, in order."""
    out: list[AstNode] = []
    for c in children:
        if isinstance(c, Seq):
            out.extend(inline_seqs(c.children))
        else:
            out.append(c)
    return out
