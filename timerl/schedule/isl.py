"""The bridge between timerl's symbolic world and isl (the ONLY module importing islpy).

:class:`IslProgram` translates one PDG into isl objects built on a *private*
``isl.Context`` (scheduler options live in the context, so they never leak into
other users of isl):

* every node ``n`` becomes the statement ``S{n.id}`` whose domain is the box
  ``0 <= d < D`` over ``n.domain`` intersected with ``n.cond`` (a node without
  dims is the 0-dim statement ``S{n.id}[]``);
* every edge becomes a relation written sink-first (``S{sink}[q] -> S{src}[p]``,
  ``p`` in ``phi(q)`` when ``cond(q)``), reversed for isl's source -> sink
  validity / proximity convention;
* static bounds (``pdg.static_bounds``) are substituted by their ints, dynamic
  bounds (``pdg.dynamic_bounds``) stay isl parameters with ``>= 1`` in the context;
  with ``parametric=True`` the static bounds are parameters ``>= 1`` too while
  scheduling (isl's work then does not grow with their values) and are pinned to their
  values (:meth:`IslProgram.run_context`) for the AST and its check.

Preconditions: index expressions are affine after substituting static bounds
(``+``, ``-``, ``*`` by a constant, ``//`` and ``%`` by a constant, ``min``,
``max``, comparisons and boolean connectives); every bound symbol used is static
or dynamic. Violations raise :class:`~timerl.errors.NonAffineIndexError` /
:class:`~timerl.errors.BoundError` / :class:`~timerl.errors.ScheduleError`.

Postconditions: :meth:`IslProgram.build_ast` returns timerl's own AST
(``timerl.schedule.ast``) whose counters are ``Sym("_c{k}")`` and whose
parameters are the PDG's own bound symbols; no isl object escapes into it.
"""

from __future__ import annotations

import json
import logging
import os
import re
import select
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping

import islpy as isl

from timerl.errors import BoundError, NonAffineIndexError, ScheduleError
from timerl.pdg.ir import PDG, Edge, Node
from timerl.schedule.ast import AstNode, Dealloc, Exec, Fetch, If, Loop, Offload, Seq
from timerl.symbolic import (
    TRUE,
    Add,
    And,
    Const,
    Eq,
    Expr,
    FloorDiv,
    Le,
    Lt,
    Max,
    Min,
    Mod,
    Mul,
    Not,
    Or,
    Slice,
    Sym,
    free_symbols,
    index_symbols,
    is_bool,
    lift,
    logical_and,
    logical_not,
    logical_or,
    smax,
    smin,
    substitute,
    to_str,
)
from timerl.symbolic.expr import cmp_eq, cmp_le, cmp_lt

log = logging.getLogger(__name__)

_RESERVED = frozenset(
    {
        "and", "or", "not", "mod", "floor", "ceil", "min", "max", "exists", "true", "false",
        "infty", "implies", "xor", "rat", "div", "cond", "select", "NaN", "domain", "range",
    }
)  # fmt: skip
_NOT_IDENT = re.compile(r"\W")
_STMT_NAME = re.compile(r"^[SF]\d+$")  # compute statements and frees (schedule/dealloc.py)
MAX_COUNTERS = 64


def new_context() -> isl.Context:
    """A private isl context with the recipe's scheduler options (isl defaults, spelled out)."""
    ctx = isl.Context()
    ctx.set_schedule_algorithm(0)  # isl (Pluto-like), not Feautrier
    ctx.set_schedule_serialize_sccs(0)
    ctx.set_schedule_whole_component(0)
    ctx.set_schedule_max_constant_term(-1)
    ctx.set_schedule_max_coefficient(2)
    return ctx


_MEM_KIND: dict[str, type] = {"F": Dealloc, "O": Offload, "G": Fetch}
"""isl tuple-name prefixes of the memory statements grafted into a schedule (frees in
``dealloc.py``, offloads and fetches in ``swap.py``) and the AST statement each becomes."""
_MEM_PREFIX: dict[type, str] = {v: k for k, v in _MEM_KIND.items()}


def stmt_name(node_id: int) -> str:
    """The isl tuple name of a node's statement."""
    return f"S{node_id}"


class _Namer:
    """Injective map from symbols to isl-safe identifiers (readable where possible)."""

    def __init__(self) -> None:
        self.names: dict[Sym, str] = {}
        self.used: set[str] = set()
        self.alt: dict[Sym, str] = {}

    def _fresh(self, base: str) -> str:
        s = _NOT_IDENT.sub("_", base) or "v"
        if not s[0].isalpha():
            s = "v" + s
        if s in _RESERVED or _STMT_NAME.match(s):
            s += "_"
        out, k = s, 1
        while out in self.used:
            out = f"{s}_{k}"
            k += 1
        self.used.add(out)
        return out

    def name(self, s: Sym) -> str:
        if s not in self.names:
            self.names[s] = self._fresh(s.name)
        return self.names[s]

    def source_name(self, s: Sym) -> str:
        """A second name for ``s``: the source-side copy of a dim in an edge relation."""
        if s not in self.alt:
            self.name(s)
            self.alt[s] = self._fresh(s.name + "_src")
        return self.alt[s]


def proximity_index(e: Expr | Slice) -> Expr:
    """The proximity form of one index component (paper §6.1).

    A slice keeps only its last point (``stop - 1``); in ``min`` / ``max`` an argument
    free of index symbols (a constant or a bound such as ``T``) is dropped when the
    other argument has index symbols.
    """
    if isinstance(e, Slice):
        return _drop_const_minmax(e.stop) - 1
    return e


def _drop_const_minmax(e: Expr) -> Expr:
    if isinstance(e, (Min, Max)):
        a, b = (_drop_const_minmax(x) for x in e.args)
        ia, ib = bool(index_symbols(a)), bool(index_symbols(b))
        if ia and not ib:
            return a
        if ib and not ia:
            return b
        return smin(a, b) if isinstance(e, Min) else smax(a, b)
    if isinstance(e, Add):
        return _drop_const_minmax(e.args[0]) + _drop_const_minmax(e.args[1])
    if isinstance(e, Mul):
        return _drop_const_minmax(e.args[0]) * _drop_const_minmax(e.args[1])
    return e


class IslProgram:
    """A PDG translated to isl objects on a private context.

    ``params`` are the isl parameter names of the dynamic bounds (sorted by name),
    ``param_syms`` maps them back to the PDG's bound symbols. Index symbols get
    sanitized, unique isl names (``t`` stays ``t``; ``min`` becomes ``min_``); the
    source side of an edge relation uses a second name (``t_src``).
    """

    def __init__(self, pdg: PDG, ctx: isl.Context | None = None, parametric: bool = False) -> None:
        self.pdg = pdg
        self.ctx = ctx if ctx is not None else new_context()
        self._namer = _Namer()
        for b in sorted(set(pdg.static_bounds) | set(pdg.dynamic_bounds), key=lambda s: s.name):
            self._namer.name(b)  # bounds first, in one order: their isl names agree across programs
        for b in pdg.dynamic_bounds:
            if b in pdg.static_bounds:
                raise BoundError(f"bound `{b}` is declared both static and dynamic")
        # ``parametric``: static bounds stay isl parameters (>= 1) while scheduling, so the
        # scheduler's work does not grow with their values; ``fixed`` pins them for the AST.
        self.fixed: dict[Sym, int] = dict(pdg.static_bounds) if parametric else {}
        self.static: dict[Sym, int] = {} if parametric else dict(pdg.static_bounds)
        dims_bounds = {b for _, b in pdg.dims}
        self.dynamic: list[Sym] = sorted(set(pdg.dynamic_bounds) | set(self.fixed), key=lambda s: s.name)
        self.params = [self._namer.name(b) for b in self.dynamic]
        self.param_syms: dict[str, Sym] = {self._namer.name(b): b for b in self.dynamic}
        self._dims_bounds = dims_bounds
        self._dom_cache: dict[int, isl.Set] = {}
        self._udom: isl.UnionSet | None = None

    # -- text ---------------------------------------------------------------------
    @property
    def prefix(self) -> str:
        return f"[{', '.join(self.params)}] -> " if self.params else ""

    def expr(self, e: Expr, scope: Mapping[Sym, str], what: str = "expression") -> str:
        """isl syntax for ``e``; index symbols must be in ``scope`` (symbol -> isl variable)."""
        sub = substitute(e, self.static) if self.static else e
        return self._emit(sub, scope, e, what)

    def _emit(self, e: Expr, scope: Mapping[Sym, str], whole: Expr, what: str) -> str:
        go = self._emit
        if isinstance(e, Const):
            if isinstance(e.value, bool):
                return "(0 = 0)" if e.value else "(1 = 0)"
            return f"({int(e.value)})"
        if isinstance(e, Sym):
            if e in scope:
                return scope[e]
            if e in self.static:
                return f"({self.static[e]})"
            if e in self.param_syms.values():
                return self._namer.name(e)
            if e.is_bound or e in self._dims_bounds:
                raise BoundError(
                    f"bound `{e}` in {what} `{to_str(whole)}` is neither static nor dynamic; "
                    "give it a value or mark it dynamic"
                )
            raise ScheduleError(
                f"index symbol `{e}` in {what} `{to_str(whole)}` is not a dim of the point it refers to "
                f"(known here: {', '.join(s.name for s in scope) or 'none'})"
            )
        a = e.args
        if isinstance(e, Add):
            return f"({go(a[0], scope, whole, what)} + {go(a[1], scope, whole, what)})"
        if isinstance(e, Mul):
            if isinstance(a[0], Const):
                return f"({int(a[0].value)} * {go(a[1], scope, whole, what)})"
            if isinstance(a[1], Const):
                return f"({int(a[1].value)} * {go(a[0], scope, whole, what)})"
            raise NonAffineIndexError(
                f"{what} `{to_str(whole)}` is not affine: `{to_str(e)}` multiplies two symbolic values; "
                "index expressions may only multiply by constants"
            )
        if isinstance(e, (FloorDiv, Mod)):
            if not isinstance(a[1], Const) or isinstance(a[1].value, bool):
                op = "//" if isinstance(e, FloorDiv) else "%"
                raise NonAffineIndexError(
                    f"{what} `{to_str(whole)}` is not affine: `{to_str(e)}` uses `{op}` by a symbolic "
                    "value; index expressions may only divide by constants"
                )
            c = int(a[1].value)
            x = go(a[0], scope, whole, what)
            fl = f"floor({x} / {c})" if c > 0 else f"floor((-1 * {x}) / {-c})"
            if isinstance(e, FloorDiv):
                return f"({fl})"
            if c > 0:
                return f"({x} mod {c})"
            return f"({x} - {c} * {fl})"
        if isinstance(e, (Min, Max)):
            f = "min" if isinstance(e, Min) else "max"
            return f"{f}({go(a[0], scope, whole, what)}, {go(a[1], scope, whole, what)})"
        if isinstance(e, (Lt, Le, Eq)):
            op = {Lt: "<", Le: "<=", Eq: "="}[type(e)]
            if is_bool(a[0]) or is_bool(a[1]):
                x, y = go(a[0], scope, whole, what), go(a[1], scope, whole, what)
                if isinstance(e, Eq):  # boolean equivalence
                    return f"(({x} and {y}) or (not {x} and not {y}))"
                raise NonAffineIndexError(f"{what} `{to_str(whole)}` orders boolean values")
            return f"({go(a[0], scope, whole, what)} {op} {go(a[1], scope, whole, what)})"
        if isinstance(e, (And, Or)):
            op = "and" if isinstance(e, And) else "or"
            return f"({go(a[0], scope, whole, what)} {op} {go(a[1], scope, whole, what)})"
        if isinstance(e, Not):
            return f"(not {go(a[0], scope, whole, what)})"
        raise NonAffineIndexError(f"{what} `{to_str(whole)}`: cannot translate `{to_str(e)}` to isl")

    def _scope(self, node: Node) -> dict[Sym, str]:
        return {d: self._namer.name(d) for d in node.domain}

    def _box(self, node: Node, scope: Mapping[Sym, str]) -> list[str]:
        cons = []
        for d in node.domain:
            try:
                b = self.pdg.bound_of(d)
            except KeyError:
                raise ScheduleError(
                    f"{node.label} varies over `{d}`, which is not a dim of the program"
                ) from None
            cons.append(f"0 <= {scope[d]} < {self.expr(b, {}, f'bound of {d}')}")
        return cons

    def domain_text(self, node: Node) -> str:
        """``S{id}[d...] : 0 <= d < D and cond`` (without braces / parameters)."""
        scope = self._scope(node)
        cons = self._box(node, scope)
        if not (isinstance(node.cond, Const) and node.cond.value is True):
            cons.append(self.expr(node.cond, scope, f"domain condition of {node.label}"))
        head = f"{stmt_name(node.id)}[{', '.join(scope[d] for d in node.domain)}]"
        return f"{head} : {' and '.join(cons)}" if cons else head

    def edge_text(self, edge: Edge, proximity: bool = False) -> str:
        """The sink-first relation ``S{sink}[q] -> S{src}[p] : p in phi(q) and cond(q)``."""
        sink, src = self.pdg.nodes[edge.sink], self.pdg.nodes[edge.src]
        what = f"index of {src.label} read by {sink.label}"
        if len(edge.phi) != len(src.domain):
            raise ScheduleError(
                f"edge {edge!r}: {sink.label} indexes {src.label} with {len(edge.phi)} components, "
                f"but it has {len(src.domain)} dims"
            )
        scope = self._scope(sink)
        src_vars = [self._namer.source_name(d) for d in src.domain]
        cons = []
        for v, comp in zip(src_vars, edge.phi, strict=True):
            if proximity:
                comp = proximity_index(comp)
            if isinstance(comp, Slice):
                cons.append(f"{self.expr(comp.start, scope, what)} <= {v}")
                cons.append(f"{v} < {self.expr(comp.stop, scope, what)}")
            else:
                cons.append(f"{v} = {self.expr(lift(comp), scope, what)}")
        if not (isinstance(edge.cond, Const) and edge.cond.value is True):
            cons.append(self.expr(edge.cond, scope, f"condition of the read of {src.label} by {sink.label}"))
        head = (
            f"{stmt_name(sink.id)}[{', '.join(scope[d] for d in sink.domain)}] -> "
            f"{stmt_name(src.id)}[{', '.join(src_vars)}]"
        )
        return f"{head} : {' and '.join(cons)}" if cons else head

    # -- objects --------------------------------------------------------------------
    def _read(self, cls, text: str):
        try:
            return cls.read_from_str(self.ctx, text)
        except isl.Error as exc:
            raise ScheduleError(f"isl cannot parse `{text}`: {exc}") from exc

    def union_set(self, pieces: Iterable[str]) -> isl.UnionSet:
        body = "; ".join(pieces)
        return self._read(isl.UnionSet, f"{self.prefix}{{ {body} }}")

    def union_map(self, pieces: Iterable[str]) -> isl.UnionMap:
        body = "; ".join(pieces)
        return self._read(isl.UnionMap, f"{self.prefix}{{ {body} }}")

    def context(self) -> isl.Set:
        """Parameter context: every dynamic bound (and parametric static one) is ``>= 1``."""
        cons = " and ".join(f"{p} >= 1" for p in self.params)
        return self._read(isl.Set, f"{self.prefix}{{ : {cons} }}")

    def run_context(self) -> isl.Set:
        """The context of the actual run: :meth:`context` with parametric static bounds pinned."""
        cons = [f"{p} >= 1" for p in self.params] + [
            f"{self._namer.name(b)} = {v}" for b, v in self.fixed.items()
        ]
        return self._read(isl.Set, f"{self.prefix}{{ : {' and '.join(cons)} }}")

    def node_domain(self, node_id: int) -> isl.Set:
        if node_id not in self._dom_cache:
            txt = self.domain_text(self.pdg.nodes[node_id])
            self._dom_cache[node_id] = self._read(isl.Set, f"{self.prefix}{{ {txt} }}")
        return self._dom_cache[node_id]

    def domain(self) -> isl.UnionSet:
        """Union of all statement domains (cached)."""
        if self._udom is None:
            out = isl.UnionSet.empty(self.context().get_space())
            for n in self.pdg:
                out = out.union(isl.UnionSet.from_set(self.node_domain(n.id)))
            self._udom = out
        return self._udom

    def edge_map(self, edge: Edge, proximity: bool = False) -> isl.Map:
        """Sink-first relation of one edge, the sink side restricted to the sink's domain."""
        txt = self.edge_text(edge, proximity)
        m = self._read(isl.Map, f"{self.prefix}{{ {txt} }}")
        return m.intersect_domain(self.node_domain(edge.sink))

    def dependences(self, proximity: bool = False, edges: Iterable[Edge] | None = None) -> isl.UnionMap:
        """Source -> sink union of ``edges`` (default: all), both ends restricted to their domains."""
        dom = self.domain()
        out = isl.UnionMap.empty(self.context().get_space())
        for e in self.pdg.edges if edges is None else edges:
            out = out.union(isl.UnionMap.from_map(self.edge_map(e, proximity)))
        return out.intersect_range(dom).reverse().intersect_domain(dom)

    def cond_set(self, edge: Edge) -> isl.Set:
        """Points of the sink's domain where ``edge.cond`` holds."""
        sink = self.pdg.nodes[edge.sink]
        scope = self._scope(sink)
        head = f"{stmt_name(sink.id)}[{', '.join(scope[d] for d in sink.domain)}]"
        if isinstance(edge.cond, Const) and edge.cond.value is True:
            txt = head
        else:
            src = self.pdg.nodes[edge.src]
            txt = f"{head} : " + self.expr(
                edge.cond, scope, f"condition of the read of {src.label} by {sink.label}"
            )
        s = self._read(isl.Set, f"{self.prefix}{{ {txt} }}")
        return s.intersect(self.node_domain(edge.sink))

    def example_point(self, s: isl.Set, node: Node) -> str:
        """One point of a non-empty set, like ``x[0] (T = 1)``."""
        pt = s.sample_point()
        coords = [
            str(pt.get_coordinate_val(isl.dim_type.set, k).to_python()) for k in range(len(node.domain))
        ]
        nm = node.name or f"{node.op.kind.name.lower()}{node.id}"
        out = f"{nm}[{', '.join(coords)}]"
        if self.params:
            vals = []
            for sym, p in zip(self.dynamic, self.params, strict=True):
                k = s.find_dim_by_name(isl.dim_type.param, p)
                if k >= 0:
                    vals.append(f"{sym.name} = {pt.get_coordinate_val(isl.dim_type.param, k).to_python()}")
            out += f" when {', '.join(vals)}"
        return out

    def points(self, s: isl.Set) -> list[tuple[int, ...]]:
        """All points of a bounded, parameter-free set (tests, debugging)."""
        n = s.dim(isl.dim_type.set)
        out: list[tuple[int, ...]] = []
        s.foreach_point(
            lambda pt: out.append(
                tuple(int(pt.get_coordinate_val(isl.dim_type.set, k).to_python()) for k in range(n))
            )
        )
        return sorted(out)

    def named_set(self, s: isl.Set, node: Node) -> str:
        """Text of a set of ``node``'s points with the tuple named like the tensor."""
        nm = node.name or f"{node.op.kind.name.lower()}{node.id}"
        s = s.set_tuple_name(_NOT_IDENT.sub("_", nm))
        for k, d in enumerate(node.domain):
            s = s.set_dim_name(isl.dim_type.set, k, self._namer.name(d))
        return s.to_str()

    # -- scheduling -------------------------------------------------------------------
    def self_dependent(self, validity: isl.UnionMap) -> dict[int, str]:
        """Nodes with points that depend on themselves, with those points as text."""
        loops = validity.intersect(self.domain().identity())
        out: dict[int, str] = {}
        if loops.is_empty():
            return out
        pts = loops.domain()
        for n in self.pdg:
            s = pts.intersect(isl.UnionSet.from_set(self.node_domain(n.id)))
            if not s.is_empty():
                out[n.id] = self.named_set(isl.Set.from_union_set(s), n)
        return out

    def compute_schedule(
        self,
        validity: isl.UnionMap,
        proximity: isl.UnionMap,
        domain: isl.UnionSet | None = None,
        budget_s: float | None = None,
        coefficients: tuple[int, ...] = (1, -1),
    ) -> isl.Schedule | None:
        """Run isl's scheduler; ``None`` when isl finds no schedule.

        With ``budget_s``, isl runs in a child process that is stopped after that many
        seconds (isl's own operation limit does not bound its ILP solver's time), and
        :class:`ScheduleBudgetExceeded` is raised: the caller falls back to a cheaper
        problem instead of hanging.
        """
        dom = self.domain() if domain is None else domain
        sc = (
            isl.ScheduleConstraints.on_domain(dom)
            .set_context(self.context())
            .set_validity(validity)
            .set_proximity(proximity)
        )
        # Small coefficients first (much faster on large graphs); unbounded as a fallback.
        # ``coefficients`` gives another order (block reads ``x[bs*di : bs*di + bs]`` need
        # a coefficient ``bs`` to interleave the blocks with the loop producing them).
        for max_coef in coefficients:
            self.ctx.set_schedule_max_coefficient(max_coef)
            try:
                sched = _within_budget(self.ctx, sc, budget_s)
            except isl.Error as exc:
                log.debug("isl compute_schedule failed (max coefficient %d): %s", max_coef, exc)
                continue
            if sched is not None and sched.get_root() is not None:
                return sched
        return None

    def violated(self, sched: isl.Schedule, validity: isl.UnionMap) -> isl.UnionMap:
        """Validity pairs that ``sched`` does not order source-first (empty when legal)."""
        theta = sched.get_map().intersect_domain(sched.get_domain())
        before = theta.lex_lt_union_map(theta)
        return validity.subtract(before).intersect_params(self.context())

    def schedule_text(self, sched: isl.Schedule) -> str:
        return sched.to_str()

    def build_ast(self, sched: isl.Schedule, flat: bool = False) -> tuple[AstNode, str]:
        """isl AST for ``sched``, converted to timerl's AST; also returns its C listing.

        With ``flat``, the AST is generated from the schedule's flattened map instead of its
        tree (the fallback when the tree's code generator misorders statements, see
        :meth:`ast_violations`).
        """
        build = isl.AstBuild.from_context(self.run_context())
        ids = isl.IdList.alloc(self.ctx, MAX_COUNTERS)
        for k in range(MAX_COUNTERS):
            ids = ids.add(isl.Id.read_from_str(self.ctx, f"_c{k}"))
        build = build.set_iterators(ids)
        try:
            if flat:
                node = build.node_from_schedule_map(sched.get_map().intersect_domain(sched.get_domain()))
            else:
                node = build.node_from_schedule(sched)
        except isl.Error as exc:
            raise ScheduleError(f"isl cannot generate an AST for the schedule: {exc}") from exc
        return _AstConverter(self).node(node, frozenset()), node.to_C_str()

    def known_early(self, e: Expr, dims: tuple[Sym, ...], t: Sym, bound: Sym, lag: int = 0) -> bool:
        """Whether ``e`` (over ``dims``) has one value at each point ``t`` for every value of
        the dynamic bound ``bound >= t + 1 + lag``: what the runtime knows of ``bound`` at
        ``t`` once the bound's setter ran at ``t - 1 + lag``. ``T - 1 - t`` is not (at any
        lag); ``t < T`` and ``min(t + 1, T)`` are; ``min(t + 8, T)`` is at lag 7."""
        if bound not in free_symbols(e):
            return True
        scope = {d: f"d{k}" for k, d in enumerate(dims)}
        alt_a, alt_b = Sym("_bound_a"), Sym("_bound_b")
        scope[alt_a], scope[alt_b] = "ba", "bb"
        ea = self.expr(substitute(e, {bound: alt_a}), scope, "an expression of a dynamic bound")
        eb = self.expr(substitute(e, {bound: alt_b}), scope, "an expression of a dynamic bound")
        differ = (
            f"(({ea} and not {eb}) or ({eb} and not {ea}))" if is_bool(e) else f"({ea} < {eb} or {ea} > {eb})"
        )
        cons = [f"{scope[d]} >= 0" for d in dims]
        for d in dims:
            b = self.pdg.bound_of(d)
            if b in self.static:
                cons.append(f"{scope[d]} < {self.static[b]}")
        cons += [f"ba > {scope[t]} + {int(lag)}", f"bb > {scope[t]} + {int(lag)}", differ]
        names = ", ".join([scope[d] for d in dims] + ["ba", "bb"])
        ctx_cons = " and ".join(f"{p} >= 1" for p in self.params)
        text = f"{self.prefix}{{ [{names}] : {' and '.join(cons)}{' and ' + ctx_cons if ctx_cons else ''} }}"
        return self._read(isl.Set, text).is_empty()

    def ast_order(self, ast: AstNode) -> isl.UnionMap:
        """The execution order an AST implements: statement instance -> time vector.

        The time vector interleaves, from the root down, the position of each ``Seq``
        child and each loop counter (padded with zeros), so one instance runs before
        another iff its vector is lexicographically smaller. Loop and ``If`` conditions
        restrict the counters; ``Exec`` points give the instance.
        """
        pieces: list[tuple[list[str], list[str], str]] = []  # (time entries, constraints, instance)

        def go(n: AstNode, time: list[str], cons: list[str], scope: dict[Sym, str]) -> None:
            if isinstance(n, Seq):
                for k, ch in enumerate(n.children):
                    go(ch, [*time, str(k)], cons, scope)
            elif isinstance(n, Loop):
                v = n.var.name
                inner = {**scope, n.var: v}
                c = [
                    f"{v} >= {self.expr(n.init, scope, 'loop start')}",
                    self.expr(n.cond, inner, "loop bound"),
                ]
                if n.inc != 1:
                    c.append(f"({v} - {self.expr(n.init, scope, 'loop start')}) mod {n.inc} = 0")
                go(n.body, [*time, v], cons + c, inner)
            elif isinstance(n, If):
                cond = self.expr(n.cond, scope, "AST condition")
                go(n.then, time, [*cons, cond], scope)
                if n.else_ is not None:
                    go(n.else_, time, [*cons, f"not {cond}"], scope)
            elif isinstance(n, (Exec, Dealloc, Offload, Fetch)):
                args = ", ".join(self.expr(a, scope, "AST point") for a in n.point)
                name = stmt_name(n.node) if isinstance(n, Exec) else f"{_MEM_PREFIX[type(n)]}{n.node}"
                pieces.append((time, cons, f"{name}[{args}]"))

        go(ast, [], [], {})
        width = max((len(t) for t, _, _ in pieces), default=0)
        texts = []
        for stamp, cons, inst in pieces:
            counters = [x for x in stamp if not x.isdigit()]
            vec = [x if x.isdigit() else f"t_{x}" for x in stamp] + ["0"] * (width - len(stamp))
            ren = {x: f"t_{x}" for x in counters}
            body = " and ".join(cons) if cons else "0 = 0"
            for old, new in ren.items():  # counters are named _cK; rename as whole words
                body = re.sub(rf"\b{re.escape(old)}\b", new, body)
                inst = re.sub(rf"\b{re.escape(old)}\b", new, inst)
            texts.append(f"[{', '.join(vec)}] -> {inst} : {body}")
        if not texts:
            return isl.UnionMap.empty(self.context().get_space())
        return self.union_map(texts).reverse()

    def ast_violations(
        self,
        ast: AstNode,
        validity: isl.UnionMap,
        same_point_ok: bool = False,
        extra_domain: isl.UnionSet | None = None,
    ) -> isl.UnionMap:
        """Validity pairs the AST does not run source-first, plus (as self-pairs) domain points
        it never runs; empty when the AST is a legal execution of the domain. With
        ``same_point_ok``, reads of a statement's own point are allowed (a cluster's members
        read each other at one point, in member order). ``extra_domain``: instances of other
        statements it must run too (the frees of ``schedule/dealloc.py``)."""
        run = self.run_context()  # pinned bounds first: far cheaper than the parametric check
        order = self.ast_order(ast).intersect_params(run)
        dom = self.domain().intersect_params(run)
        if extra_domain is not None:
            dom = dom.union(extra_domain.intersect_params(run))
        deps = validity.intersect_params(run)
        if same_point_ok:
            deps = deps.subtract(dom.identity())
        missing = dom.subtract(order.domain())
        if _some_late(deps, order):
            # each dependence as (source time -> sink time), all in one space of time vectors
            times = deps.apply_domain(order).apply_range(order)
            space = isl.Map.from_union_map(times).get_space().domain()
            not_before = isl.UnionMap.from_map(isl.Map.lex_ge(space))
            late = deps.intersect(order.apply_range(not_before).apply_range(order.reverse()).intersect(deps))
            return late.union(missing.identity())
        return missing.identity()


def _maps_of(um: isl.UnionMap) -> list[isl.Map]:
    out: list[isl.Map] = []
    um.foreach_map(out.append)
    return out


def _some_late(deps: isl.UnionMap, order: isl.UnionMap) -> bool:
    """Whether some pair of ``deps`` (source -> sink instance) has its source run at a time
    (``order``: instance -> time vector, all vectors of one width) not before its sink's.

    The same set as ``deps.apply_domain(order).apply_range(order)`` met with "source time
    lexicographically >= sink time", built one dependence map at a time: each map is
    composed with the order maps of its two statements only (isl's union composition pairs
    every dependence map with every order map), and the first late map answers."""
    by_name: dict[str, isl.Map] = {}
    for m in _maps_of(order):
        name = m.get_tuple_name(isl.dim_type.in_)
        if name in by_name:  # one map per statement expected; else compose the unions
            times = deps.apply_domain(order).apply_range(order)
            if times.is_empty():
                return False
            space = isl.Map.from_union_map(times).get_space().domain()
            return not times.intersect(isl.UnionMap.from_map(isl.Map.lex_ge(space))).is_empty()
        by_name[name] = m
    for m in _maps_of(deps):
        src = by_name.get(m.get_tuple_name(isl.dim_type.in_))
        sink = by_name.get(m.get_tuple_name(isl.dim_type.out))
        if src is None or sink is None:
            continue
        times = m.apply_domain(src).apply_range(sink)
        if times.is_empty():
            continue
        if not times.intersect(isl.Map.lex_ge(times.get_space().domain())).is_empty():
            return True
    return False


class ScheduleBudgetExceeded(ScheduleError):
    """isl's scheduler did not finish within its time budget."""


_OPTIONS = ("schedule_algorithm", "schedule_serialize_sccs", "schedule_whole_component",
            "schedule_max_constant_term", "schedule_max_coefficient")  # fmt: skip


_SERVER = r"""
import json, sys
import islpy as isl
out = sys.stdout.buffer
for line in sys.stdin.buffer:
    req = json.loads(line)
    ctx = isl.Context()
    for name, value in req["options"].items():
        getattr(ctx, "set_" + name)(value)
    try:
        sched = isl.ScheduleConstraints.read_from_str(ctx, req["sc"]).compute_schedule()
        text = "" if sched is None or sched.get_root() is None else sched.to_str()
        res = {"ok": text}
    except isl.Error as exc:
        res = {"error": str(exc)}
    out.write((json.dumps(res) + "\n").encode())
    out.flush()
"""


class _Solver:
    """A helper process running isl's scheduler, started once and reused; killed (and
    started again on the next call) when a problem runs past its budget."""

    proc: subprocess.Popen | None = None

    @classmethod
    def solve(cls, sc_text: str, options: dict[str, int], budget_s: float) -> str:
        allowance = 0.0
        if cls.proc is None or cls.proc.poll() is not None:
            cls.proc = subprocess.Popen(
                [sys.executable, "-c", _SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0
            )
            allowance = _SOLVER_START_S
        proc = cls.proc
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write((json.dumps({"sc": sc_text, "options": options}) + "\n").encode())
        proc.stdin.flush()
        deadline = time.monotonic() + budget_s + allowance
        buf = b""
        while not buf.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([proc.stdout], [], [], left)[0]:
                proc.kill()
                proc.wait()
                cls.proc = None
                raise ScheduleBudgetExceeded(f"isl's scheduler ran past its budget of {budget_s:g}s")
            chunk = os.read(proc.stdout.fileno(), 1 << 16)
            if not chunk:
                cls.proc = None
                raise isl.Error("isl's scheduler process died")
            buf += chunk
        res = json.loads(buf)
        if "error" in res:
            raise isl.Error(res["error"])
        return res["ok"]


_SOLVER_START_S = 2.0  # allowance for starting the helper process (python + islpy import)


def _within_budget(
    ctx: isl.Context, sc: isl.ScheduleConstraints, budget_s: float | None
) -> isl.Schedule | None:
    """``sc.compute_schedule()``; with a budget, in a helper process that is killed when the
    budget runs out (isl cannot be interrupted in-process, and forking this process, whose
    JAX and Torch threads may hold locks, could deadlock)."""
    if budget_s is None or not hasattr(select, "select") or os.name != "posix":
        return sc.compute_schedule()
    options = {name: getattr(ctx, f"get_{name}")() for name in _OPTIONS}
    text = _Solver.solve(sc.to_str(), options, budget_s)
    return isl.Schedule.read_from_str(ctx, text) if text else None


_OPS = isl.ast_expr_op_type
_NODES = isl.ast_node_type
_EXPRS = isl.ast_expr_type


class _AstConverter:
    """isl AST -> timerl AST."""

    def __init__(self, prog: IslProgram) -> None:
        self.prog = prog

    def node(self, n: isl.AstNode, counters: frozenset[str]) -> AstNode:
        t = n.get_type()
        if t == _NODES.block:
            ch = n.block_get_children()
            return Seq(tuple(self.node(ch.get_at(k), counters) for k in range(ch.n_ast_node())))
        if t == _NODES.for_:
            name = n.for_get_iterator().id_get_id().get_name()
            var = Sym(name)
            inner = counters | {name}
            body = self.node(n.for_get_body(), inner)
            if n.for_is_degenerate():  # one iteration: `int c4 = c1 == 0 ? c0 : c0 + c1 - 1;`
                alts = self.cases(n.for_get_init(), counters)
                loops = tuple((c, Loop(var, v, cmp_le(var, v), 1, body)) for c, v in alts)
                return loops[0][1] if len(loops) == 1 else Seq(tuple(If(c, lp) for c, lp in loops))
            init = self.expr(n.for_get_init(), counters)
            cond = self.expr(n.for_get_cond(), inner)
            inc = self.expr(n.for_get_inc(), inner)
            if not isinstance(inc, Const):
                raise ScheduleError(f"isl produced a loop with a symbolic step `{inc}`")
            return Loop(var, init, cond, int(inc.value), body)
        if t == _NODES.if_:
            cond = self.expr(n.if_get_cond(), counters)
            then = self.node(n.if_get_then_node(), counters)
            els = self.node(n.if_get_else_node(), counters) if n.if_has_else_node() else None
            return If(cond, then, els)
        if t == _NODES.user:
            e = n.user_get_expr()
            name = e.op_get_arg(0).id_get_id().get_name()
            nid = int(name[1:])
            kind = _MEM_KIND.get(name[0], Exec)
            alts: list[tuple[Expr, tuple[Expr, ...]]] = [(TRUE, ())]
            for k in range(1, e.op_get_n_arg()):
                alts = [
                    (logical_and(c, c2), (*vs, v))
                    for c, vs in alts
                    for c2, v in self.cases(e.op_get_arg(k), counters)
                ]
            if len(alts) == 1:
                return kind(nid, alts[0][1])
            return Seq(tuple(If(c, kind(nid, vs)) for c, vs in alts))
        if t == _NODES.mark:
            return self.node(n.mark_get_node(), counters)
        raise ScheduleError(f"unexpected isl AST node type {t}")

    def expr(self, e: isl.AstExpr, counters: frozenset[str]) -> Expr:
        t = e.get_type()
        if t == _EXPRS.int:
            return Const(int(e.int_get_val().to_python()))
        if t == _EXPRS.id:
            name = e.id_get_id().get_name()
            if name in counters:
                return Sym(name)
            if name in self.prog.param_syms:
                b = self.prog.param_syms[name]
                return Const(self.prog.fixed[b]) if b in self.prog.fixed else b
            raise ScheduleError(f"isl AST refers to unknown identifier `{name}`")
        op = e.op_get_type()
        args = [self.expr(e.op_get_arg(k), counters) for k in range(e.op_get_n_arg())]
        return self._apply(op, args, e)

    def cases(self, e: isl.AstExpr, counters: frozenset[str]) -> list[tuple[Expr, Expr]]:
        """``e`` as ``(condition, value)`` pairs with disjoint conditions: an integer
        ``c ? x : y`` (which timerl's expressions lack; isl emits it in the points of frees
        grafted at a sequence, ``_c1 == 0 && _c2 == 1 ? _c0 : _c0 + _c1 - 1``) splits in two."""
        if e.get_type() != _EXPRS.op or "?" not in e.to_C_str():
            return [(TRUE, self.expr(e, counters))]
        op = e.op_get_type()
        if op in (_OPS.cond, _OPS.select):
            c = self.expr(e.op_get_arg(0), counters)
            if not is_bool(c):
                raise ScheduleError(f"unsupported isl AST expression `{e.to_C_str()}`")
            out = [(logical_and(c, k), v) for k, v in self.cases(e.op_get_arg(1), counters)]
            return out + [
                (logical_and(logical_not(c), k), v) for k, v in self.cases(e.op_get_arg(2), counters)
            ]
        out: list[tuple[Expr, list[Expr]]] = [(TRUE, [])]
        for k in range(e.op_get_n_arg()):
            out = [
                (logical_and(c, c2), [*vs, v])
                for c, vs in out
                for c2, v in self.cases(e.op_get_arg(k), counters)
            ]
        return [(c, self._apply(op, vs, e)) for c, vs in out]

    def _apply(self, op: object, args: list[Expr], e: isl.AstExpr) -> Expr:
        """isl operation ``op`` on converted arguments."""
        if op in (_OPS.and_, _OPS.and_then):
            return logical_and(args[0], args[1])
        if op in (_OPS.or_, _OPS.or_else):
            return logical_or(args[0], args[1])
        if op in (_OPS.max, _OPS.min):
            f = smax if op == _OPS.max else smin
            out = args[0]
            for a in args[1:]:
                out = f(out, a)
            return out
        if op == _OPS.minus:
            return -args[0]
        if op == _OPS.add:
            return args[0] + args[1]
        if op == _OPS.sub:
            return args[0] - args[1]
        if op == _OPS.mul:
            return args[0] * args[1]
        if op in (_OPS.div, _OPS.fdiv_q, _OPS.pdiv_q):
            return args[0] // args[1]
        if op in (_OPS.pdiv_r, _OPS.zdiv_r):
            return args[0] % args[1]
        if op == _OPS.eq:
            return cmp_eq(args[0], args[1])
        if op == _OPS.le:
            return cmp_le(args[0], args[1])
        if op == _OPS.lt:
            return cmp_lt(args[0], args[1])
        if op == _OPS.ge:
            return cmp_le(args[1], args[0])
        if op == _OPS.gt:
            return cmp_lt(args[1], args[0])
        if op in (_OPS.cond, _OPS.select) and all(is_bool(a) for a in args):
            c, x, y = args
            return logical_or(logical_and(c, x), logical_and(logical_not(c), y))
        raise ScheduleError(f"unsupported isl AST expression `{e.to_C_str()}` (op {op})")
