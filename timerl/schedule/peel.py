"""Partial unrolling of loops to take ``If``\\ s out of them (TimeRL §6.3, AST post-processing).

isl guards the statements that run only at a loop's first or last iteration with ``If``\\ s
inside the loop (``if (_c1 == 8)``: the bootstrap value after the last step; ``if (1 <=
_c0)``: what reads the previous iteration; the frees of a loop's last points). The
interpreter then evaluates them at every iteration. :func:`peel_ifs` splits such a loop into
its first iteration, the iterations between, and its last, each a loop of its own, with
every ``If`` directly in the loop's body whose condition is decided on the piece replaced by
the branch it takes there:

* ``var == first`` (true only at the first iteration), ``first + 1 <= var`` / ``first < var``
  (false only there);
* ``var == last`` (true only at the last), ``var <= last - 1`` / ``var < last`` (false only
  there), where the loop's condition is ``var <= last`` or ``var < last + 1``.

The pieces keep the loop's variable and condition (a piece's own range is added to it), so a
loop of one iteration (``first == last``) or none runs as before: the first piece keeps the
``If``\\ s about the last iteration undecided, and the last piece runs only when ``last >
first``. Only innermost loops of step 1 whose bounds use no dynamic bound are split (a loop
over an episode learns its last iteration only when the episode ends; splitting an outer
loop would copy every loop inside it three times). ``If``\\ s of other forms (``2 <= _c0 +
_c1``) stay.

Postcondition: the same statements run at the same points in the same order.
"""

from __future__ import annotations

from dataclasses import replace

from timerl.schedule.ast import AstNode, If, Loop, Seq, walk
from timerl.symbolic import Expr, Sym, free_symbols, lift
from timerl.symbolic.expr import Eq, Le, Lt, logical_and
from timerl.symbolic.simplify import affine_difference, simplify

_FIRST, _NOT_FIRST, _LAST, _NOT_LAST = "first", "not first", "last", "not last"


def peel_ifs(node: AstNode, dynamic: frozenset[Sym] = frozenset()) -> AstNode:
    """``node`` with loops split where that decides ``If``\\ s in their bodies (module doc)."""
    if isinstance(node, Seq):
        return Seq(tuple(peel_ifs(c, dynamic) for c in node.children))
    if isinstance(node, If):
        return replace(
            node,
            then=peel_ifs(node.then, dynamic),
            else_=None if node.else_ is None else peel_ifs(node.else_, dynamic),
        )
    if not isinstance(node, Loop):
        return node
    loop = replace(node, body=peel_ifs(node.body, dynamic))
    if loop.inc != 1 or (free_symbols(loop.init) | free_symbols(loop.cond)) & dynamic:
        return loop
    if any(isinstance(x, Loop) for x in walk(loop.body)):
        return loop  # innermost loops only: peeling an outer loop would copy every loop in it
    last = _last(loop.var, loop.cond)
    kinds = {k for c in _children(loop.body) if isinstance(c, If) and (k := _kind(c.cond, loop, last))}
    if not kinds:
        return loop
    var, first = loop.var, loop.init
    head, tail = bool(kinds & {_FIRST, _NOT_FIRST}), bool(kinds & {_LAST, _NOT_LAST})
    start = simplify(first + 1) if head else first
    pieces: list[AstNode] = []
    if head:  # the first iteration; the If's about the last stay (a loop of one iteration)
        body = _resolve(loop, last, at_first=True, at_last=None)
        pieces.append(replace(loop, cond=logical_and(loop.cond, Le(var, first)), body=body))
    middle_cond = logical_and(loop.cond, Le(var, simplify(last - 1))) if tail else loop.cond
    body = _resolve(loop, last, at_first=False if head else None, at_last=False if tail else None)
    pieces.append(replace(loop, init=start, cond=middle_cond, body=body))
    if tail:  # the last iteration, when it is not the first one peeled already
        body = _resolve(loop, last, at_first=False if head else None, at_last=True)
        cond = logical_and(Le(var, last), Le(start, var))
        pieces.append(replace(loop, init=last, cond=cond, body=body))
    return Seq(tuple(p for p in pieces if _children(p.body)))  # type: ignore[union-attr]


def _children(node: AstNode) -> tuple[AstNode, ...]:
    return node.children if isinstance(node, Seq) else (node,)


def _last(var: Sym, cond: Expr) -> Expr | None:
    """The last value of ``var`` in a loop while ``cond`` (``var <= e``, ``var < e``)."""
    if isinstance(cond, Le) and cond.args[0] is var and var not in free_symbols(cond.args[1]):
        return cond.args[1]
    if isinstance(cond, Lt) and cond.args[0] is var and var not in free_symbols(cond.args[1]):
        return simplify(cond.args[1] - 1)
    return None


def _same(a: Expr, b: Expr | None) -> bool:
    return b is not None and affine_difference(lift(a), lift(b)) == 0


def _kind(c: Expr, loop: Loop, last: Expr | None) -> str | None:
    """Which iterations ``c`` holds at, when decided by first/last (module doc)."""
    var, first = loop.var, loop.init
    a, b = (c.args + (None, None))[:2] if isinstance(c, (Eq, Le, Lt)) else (None, None)
    if isinstance(c, Eq):
        other = b if a is var else a if b is var else None
        if other is None or var in free_symbols(other):
            return None
        if _same(other, first):
            return _FIRST
        return _LAST if _same(other, last) else None
    if isinstance(c, (Le, Lt)):
        strict = isinstance(c, Lt)
        if b is var and var not in free_symbols(a):  # a <= var / a < var
            return _NOT_FIRST if _same(a, first + (0 if strict else 1)) else None
        if a is var and var not in free_symbols(b):  # var <= b / var < b
            return _NOT_LAST if last is not None and _same(b, last - (0 if strict else 1)) else None
    return None


def _resolve(loop: Loop, last: Expr | None, at_first: bool | None, at_last: bool | None) -> AstNode:
    """The loop's body with the ``If``\\ s decided by ``at_first`` / ``at_last`` (None:
    not decided on this piece) replaced by their branch."""
    out: list[AstNode] = []
    for c in _children(loop.body):
        k = _kind(c.cond, loop, last) if isinstance(c, If) else None
        holds = None
        if k in (_FIRST, _NOT_FIRST) and at_first is not None:
            holds = at_first == (k == _FIRST)
        elif k in (_LAST, _NOT_LAST) and at_last is not None:
            holds = at_last == (k == _LAST)
        if holds is None:
            out.append(c)
        else:
            assert isinstance(c, If)
            branch = c.then if holds else c.else_
            if branch is not None:
                out.extend(_children(branch))
    return Seq(tuple(out))
