"""The mutable graph that recurrent-tensor operations record into.

Each :class:`BNode` becomes one PDG node at lowering. Nodes are mutable only while
the program is written: MERGE nodes receive branches (``x[t+1] = ...``) and autodiff
fills gradient placeholders. ``lower.py`` freezes the graph into a :class:`PDG`.
"""

from __future__ import annotations

import linecache
import os
import sys
from dataclasses import dataclass, field

from timerl.pdg.ir import TensorSpec
from timerl.pdg.ops import Op
from timerl.symbolic import TRUE, Expr, Slice, Sym


@dataclass
class BInput:
    """Input of a node: ``src`` output ``oid`` read at ``phi`` (sink symbols) when ``cond``."""

    src: int
    oid: int
    phi: tuple[Expr | Slice, ...]
    cond: Expr = TRUE
    select: Expr | None = None


@dataclass
class BNode:
    id: int
    op: Op
    domain: tuple[Sym, ...]
    outputs: tuple[TensorSpec, ...]
    inputs: list[BInput] = field(default_factory=list)
    order_after: list[BInput] = field(default_factory=list)  # order-only dependences
    cond: Expr = TRUE
    name: str | None = None
    where: str = "?"
    is_param: bool = False
    stop_gradient: bool = False
    batch_dims: tuple[Sym, ...] = ()  # dims this op must be vectorized over (env UDFs)
    # a parameter's agent dims (trl.param(agents=...)): each of their points is one agent,
    # initialised from its own slice of the init, never stepped by an optimiser; and the
    # number of agents each init holds (checked against the dims' bounds when lowering)
    agents: tuple[Sym, ...] = ()
    agent_sizes: tuple[int, ...] = ()

    @property
    def label(self) -> str:
        if self.name:
            return f"'{self.name}'"
        return f"{self.op.kind.name.lower()} defined at {self.where}"


_PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


_API_DIRS = tuple(
    os.path.join(_PKG_DIR, d)
    for d in ("rt", "nn", "optim", "symbolic", "pdg", "schedule", "plan", "runtime", "backends", "dist")
)
_FLAT_API_DIRS = (_PKG_DIR, os.path.join(_PKG_DIR, "envs"))  # their files, not their subpackages


def _in_api(fn: str) -> bool:
    """Whether ``fn`` is part of timerl's API (where it records nodes for a caller); elsewhere
    in the package are programs written with it (``timerl/agents``, the envs' own programs)."""
    d = os.path.dirname(fn)
    return d in _FLAT_API_DIRS or any(d == a or d.startswith(a + os.sep) for a in _API_DIRS)


def user_location() -> str:
    """``file:line`` (and the line) of the first stack frame outside timerl's API: the user's
    code, or a program shipped in the package (shown by its path in the package)."""
    f = sys._getframe(1)
    root = os.path.dirname(_PKG_DIR) + os.sep
    while f is not None:
        fn = os.path.abspath(f.f_code.co_filename)
        if not _in_api(fn):
            line = linecache.getline(fn, f.f_lineno).strip()
            short = fn[len(root) :] if fn.startswith(_PKG_DIR + os.sep) else os.path.basename(fn)
            return f"{short}:{f.f_lineno} (`{line}`)" if line else f"{short}:{f.f_lineno}"
        f = f.f_back
    return "?"


class Graph:
    """Nodes recorded by one :class:`~timerl.rt.context.Context`."""

    def __init__(self) -> None:
        self.nodes: dict[int, BNode] = {}
        self._next = 0
        self.random_ops = 0  # random ops recorded so far: the next one's RNG stream

    def add(
        self,
        op: Op,
        domain: tuple[Sym, ...],
        outputs: tuple[TensorSpec, ...],
        inputs: list[BInput] | None = None,
        cond: Expr = TRUE,
        name: str | None = None,
    ) -> BNode:
        node = BNode(self._next, op, domain, outputs, list(inputs or []), cond=cond, name=name)
        node.where = user_location()
        self.nodes[node.id] = node
        self._next += 1
        return node
