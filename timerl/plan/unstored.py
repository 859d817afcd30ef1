"""Frees of values that are never stored, left out of the Plan.

A region member whose output is read only inside its region (:func:`stored_members`) never
reaches the store, yet the schedule frees every point it computes: PPO's learner region
holds ~300 such members, and their frees were ~300 store calls per iteration that found
nothing. This pass drops a ``Dealloc`` of node ``n`` when every statement that runs ``n``
is a region that does not store it, and none of those regions lies in a loop that may run
as one scan (only the iteration loop encloses them: a scan decides what it keeps by its own
rule, :mod:`timerl.runtime.scan`).

Postcondition: the store holds the same values after every statement (a region that falls
back to running its members one by one frees the members it does not store itself,
``runtime/fusion.py``).
"""

from __future__ import annotations

from dataclasses import replace

from timerl.pdg.ir import PDG
from timerl.plan.fusable import stored_members
from timerl.plan.regions import FusedExec
from timerl.schedule.ast import AstNode, Dealloc, Exec, If, Loop, Seq


def never_stored(ast: AstNode, pdg: PDG, iter_loop: Loop | None) -> frozenset[int]:
    """Nodes run only by regions that do not store them, outside every loop but ``iter_loop``."""
    fused_only: dict[int, bool] = {}

    def rec(node: AstNode, in_loop: bool) -> None:
        if isinstance(node, Seq):
            for c in node.children:
                rec(c, in_loop)
        elif isinstance(node, Loop):
            rec(node.body, in_loop or node is not iter_loop)
        elif isinstance(node, If):
            rec(node.then, in_loop)
            if node.else_ is not None:
                rec(node.else_, in_loop)
        elif isinstance(node, FusedExec):
            nodes = [pdg.nodes[m] for m in node.members]
            kept = {node.members[k] for k in stored_members(nodes, pdg)}
            for m in node.members:
                fused_only[m] = fused_only.get(m, True) and not in_loop and m not in kept
        elif isinstance(node, Exec):
            fused_only[node.node] = False

    rec(ast, False)
    return frozenset(n for n, ok in fused_only.items() if ok)


def drop_unstored_frees(ast: AstNode, pdg: PDG, iter_loop: Loop | None) -> AstNode:
    """``ast`` without the ``Dealloc``s of :func:`never_stored` nodes (``ast`` itself when
    there are none)."""
    gone = never_stored(ast, pdg, iter_loop)
    if not gone:
        return ast

    def rec(node: AstNode) -> AstNode | None:
        """``node`` without those frees; None where nothing is left."""
        if isinstance(node, Dealloc):
            return None if node.node in gone else node
        if isinstance(node, Seq):
            kids = tuple(k for k in (rec(c) for c in node.children) if k is not None)
            return Seq(kids) if kids else None
        if isinstance(node, Loop):
            return replace(node, body=rec(node.body) or Seq(()))
        if isinstance(node, If):
            then = rec(node.then)
            other = None if node.else_ is None else rec(node.else_)
            if then is None and other is None:
                return None
            return If(node.cond, then or Seq(()), other)
        return node

    return rec(ast) or Seq(())
