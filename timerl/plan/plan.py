"""The Plan: what the runtime executes, decided once between the schedule and the run.

:func:`make_plan` takes the PDG and the schedule's AST (frees, offloads and fetches already
placed by isl) and decides, before anything runs:

* **regions**: every ``Seq``'s pure statements at one point grouped into compiled regions
  (:class:`~timerl.plan.regions.FusedExec`, reordered where dependences allow,
  :mod:`~timerl.plan.regions`), with the inputs each region may donate
  (:mod:`~timerl.plan.donate`), where the target writes into donated buffers;
* **merge moves**: the ``MERGE`` inputs whose point the merge frees once it stored the
  tensor (:func:`~timerl.plan.donate.merge_moves`), kept only where the merge is the only
  statement reading that source from the store;
* **store kinds**: the outputs kept in block buffers (:mod:`~timerl.plan.storage`);
* **the iteration loop**: the one loop running every iteration of the iteration dim, where
  the schedule is iteration-major (whole iterations are freed at its steps, checkpoints
  written at its ends; :mod:`~timerl.plan.iterations`), and a resumed run's skipped
  iterations;
* **scanned loops**: the static loops the target runs as one compiled scan, and for every
  other loop why not (:func:`~timerl.plan.scans.scan_verdicts`);
* **the peak-memory estimate**, computed from the Plan itself (:attr:`Plan.peak`,
  :mod:`~timerl.plan.peak`), which ``memory_budget`` compares Plans by.

The runtime (``runtime/interpreter.py``) executes a Plan and decides none of these.
:func:`verify_plan` checks a Plan's invariants (every region's members pure, at one point,
of one domain; donated inputs read by their region; the iteration loop inside the AST);
``make_plan`` runs it on what it returns.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from timerl.errors import ScheduleError
from timerl.pdg.ir import PDG
from timerl.pdg.ops import OpKind
from timerl.plan.fusable import fusable, internal_read
from timerl.plan.iteration_body import BodyCond, body_verdict
from timerl.plan.iterations import iteration_dim, iteration_loop, loop_offset
from timerl.plan.regions import FusedExec, plan_regions
from timerl.plan.storage import BlockSpec, plan_block_storage
from timerl.plan.unstored import drop_unstored_frees
from timerl.schedule.ast import AstNode, Dealloc, Exec, Fetch, If, Loop, Offload, Seq, walk
from timerl.symbolic import Sym, free_symbols, smax
from timerl.symbolic.compile import symbols_of

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Target:
    """What the backend that runs a Plan can do: ``donates`` (a compiled region writes an
    output into a donated input's buffer), ``scans``: how a static loop of traceable
    statements runs as one call (``"compiled"``: a compiled scan, JAX; ``"host"``: one loop
    over prepared kernels, Torch, where UDFs without a pure form may take part; ``""``: not).
    A ``"host"`` target runs ``"compiled"`` Plans, not the other way round."""

    name: str
    donates: bool = False
    scans: str = ""

    def runs(self, plan_target: Target) -> bool:
        """Whether this target can run a Plan made for ``plan_target``."""
        if plan_target.donates and not self.donates:
            return False
        return plan_target.scans in ("", self.scans) or (plan_target.scans, self.scans) == (
            "compiled",
            "host",
        )

    @staticmethod
    def of(backend: Any) -> Target:
        """The target of a backend object (``timerl.backends``)."""
        name = str(getattr(backend, "name", type(backend).__name__))
        return Target(name, bool(getattr(backend, "donates", False)), str(getattr(backend, "scans", "")))


NO_TARGET = Target("any")
"""A target that neither donates nor scans (every backend runs its Plans)."""


@dataclass(frozen=True)
class PlanOptions:
    """The runtime switches of ``CompileOptions`` that shape a Plan."""

    fuse: bool = True  # compiled regions (plan/regions.py)
    donate: bool = False  # regions reuse the buffers of inputs they read last (needs fuse)
    scan_loops: bool = False  # static loops of traceable statements as one compiled scan (needs fuse)
    free_iterations: bool = False  # free whole iterations at the iteration loop's steps
    block_store: bool = True  # slice-read outputs in block buffers (plan/storage.py)
    # the iteration loop's body as one compiled call (needs scan_loops); 'auto': where timed faster
    compile_iterations: bool | str = False
    memory_budget: int | None = None  # bytes the device store may hold; checked at run time too
    # (dynamic bound, the most it may reach): run time raises past it; the budget holds up to it
    max_bounds: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True, eq=False)
class Plan:
    """Everything decided before running (see the module doc). ``ast`` is what runs: the
    schedule's AST with regions formed, donations marked and, for a resumed run, the
    finished iterations' loops starting after them."""

    pdg: PDG
    ast: AstNode
    options: PlanOptions
    target: Target
    blocks: Mapping[tuple[int, int], BlockSpec]
    merge_moves: frozenset[tuple[int, int]]
    iter_dim: Sym | None
    iter_loop: Loop | None  # in ``ast``: runs every exec of ``iter_dim`` at ``counter + iter_offset``
    iter_offset: int
    resume_after: int | None  # a resumed run: iterations <= this one do not run again
    scans: Mapping[int, str] = field(
        default_factory=lambda: MappingProxyType({})
    )  # id(loop) -> '' or why not
    # '' when the iteration loop's body runs as one compiled call (plan/iteration_body.py),
    # else why not; the conditions checked per iteration before a traced body is reused
    body: str = "the body of the iteration loop is not compiled (compile_iterations=False)"
    body_conds: tuple[BodyCond, ...] = ()

    @property
    def gc_loop(self) -> Loop | None:
        """The loop at whose steps whole iterations are freed (``free_iterations``), or None."""
        return self.iter_loop if self.options.free_iterations else None

    def scanned(self, loop: Loop) -> bool:
        """Whether ``loop`` (a node of :attr:`ast`) runs as one compiled scan."""
        return self.scans.get(id(loop)) == ""

    def why_not_scanned(self, loop: Loop) -> str:
        """Why ``loop`` does not run as one compiled scan ('' when it does)."""
        return self.scans.get(id(loop), "loops are not scanned (scan_loops=False, or no fusion)")

    @functools.cached_property
    def peak(self) -> Any:
        """The peak-memory estimate of this Plan (:class:`~timerl.plan.peak.PeakEstimate`)."""
        from timerl.plan.peak import estimate_peak

        return estimate_peak(self)

    def regions(self) -> list[FusedExec]:
        """The compiled regions of the Plan, in AST order."""
        return [s for s in walk(self.ast) if isinstance(s, FusedExec)]

    def summary(self) -> str:
        """One line: regions, donations, block-stored outputs, scanned loops, iteration loop."""
        regs = self.regions()
        donated = sum(len(r.donate) for r in regs)
        loops = [s for s in walk(self.ast) if isinstance(s, Loop)]
        scanned = sum(1 for lp in loops if self.scanned(lp))
        it = (
            f"iteration loop over {self.iter_loop.var}" if self.iter_loop is not None else "no iteration loop"
        )
        if self.iter_loop is not None and not self.body:
            it += (
                " (body compiled where timed faster)"
                if self.options.compile_iterations == "auto"
                else " (body compiled)"
            )

        return (
            f"{len(regs)} regions ({sum(len(r.members) for r in regs)} nodes), {donated} donated inputs, "
            f"{len(self.merge_moves)} merge moves, {len(self.blocks)} block-stored outputs, "
            f"{scanned}/{len(loops)} loops scanned on {self.target.name}, {it}"
        )

    def pretty(self) -> str:
        """The Plan as text: the AST with regions (``region[...]``), donations and, per loop,
        whether it is scanned or why not; then the store kinds."""
        lines = [f"plan: {self.summary()}"]
        label = {n.id: n.label for n in self.pdg}

        def pt(p: tuple[Any, ...]) -> str:
            return ", ".join(map(str, p))

        def rec(node: AstNode, ind: int) -> None:
            pad = "  " * ind
            if isinstance(node, Seq):
                for c in node.children:
                    rec(c, ind)
            elif isinstance(node, Loop):
                why = self.why_not_scanned(node)
                tag = "scanned" if not why else f"not scanned: {why}"
                if not why and free_symbols(node.cond) & self.pdg.dynamic_bounds:
                    tag = "scanned (in chunks until its dynamic bound is found)"
                gc = ""
                if node is self.iter_loop:
                    gc = ", iteration loop" + (
                        ", body compiled as one call"
                        if not self.body
                        else f", body not compiled: {self.body}"
                    )
                lines.append(f"{pad}for ({node.var} = {node.init}; {node.cond}; {node.var} += {node.inc})"
                             f"  # {tag}{gc}")  # fmt: skip
                rec(node.body, ind + 1)
            elif isinstance(node, If):
                lines.append(f"{pad}if ({node.cond})")
                rec(node.then, ind + 1)
                if node.else_ is not None:
                    lines.append(f"{pad}else")
                    rec(node.else_, ind + 1)
            elif isinstance(node, FusedExec):
                don = "".join(f" donate {label[m]}.in{k}" for m, k in node.donate)
                lines.append(
                    f"{pad}region[{', '.join(label[m] for m in node.members)}]({pt(node.point)}){don}"
                )
            elif isinstance(node, Exec):
                lines.append(f"{pad}{label[node.node]}({pt(node.point)})")
            else:
                kind = {Dealloc: "free", Offload: "offload", Fetch: "fetch"}[type(node)]
                lines.append(f"{pad}{kind} {label[node.node]}({pt(node.point)})")

        rec(self.ast, 1)
        for (nid, oid), spec in sorted(self.blocks.items()):
            lines.append(
                f"  block store: {label[nid]} out {oid} along {spec.dim} ({spec.rows} rows per block)"
            )
        return "\n".join(lines)


def make_plan(
    pdg: PDG,
    ast: AstNode,
    options: PlanOptions = PlanOptions(),
    target: Target = NO_TARGET,
    keep: frozenset[int] = frozenset(),
    resume_after: int | None = None,
    with_moves: bool = True,
) -> Plan:
    """The Plan for running ``ast`` over ``pdg`` on ``target`` (see the module doc). ``keep``:
    values read after the run (checkpoints), never moved by a merge; ``resume_after``: a
    resumed run's last finished iteration; ``with_moves=False`` leaves the merge moves out (an
    isl analysis the peak estimate does not use: ``memory_budget``'s search compares Plans
    without them)."""
    check_ast(pdg, ast)
    donate = options.donate and options.fuse and target.donates
    dim = iteration_dim(pdg)
    if resume_after is not None and dim is not None:
        ast = _skip_iterations(ast, pdg, dim, resume_after)
    planned = _plan_seqs(ast, pdg, donate) if options.fuse else ast
    found = iteration_loop(planned, pdg, dim) if dim is not None else None
    if options.fuse:  # frees of region members that are never stored
        gc = found[0] if found and options.free_iterations else None
        pruned = drop_unstored_frees(planned, pdg, gc)
        if pruned is not planned:
            planned = pruned
            found = iteration_loop(planned, pdg, dim) if dim is not None else None
    moves: frozenset[tuple[int, int]] = frozenset()
    if donate and with_moves:
        from timerl.plan.donate import merge_moves

        moves = _only_store_reader(merge_moves(pdg, keep), planned, pdg)
    scans: Mapping[int, str] = MappingProxyType({})
    if options.scan_loops and options.fuse and target.scans:
        from timerl.plan.scans import scan_verdicts

        scans = MappingProxyType(
            scan_verdicts(
                planned,
                pdg,
                found[0] if found and options.free_iterations else None,
                host_udfs=target.scans == "host",
                dynamic=options.memory_budget is None,
            )
        )
    elif options.scan_loops and options.fuse:
        why = f"the {target.name} backend runs loops statement by statement"
        scans = MappingProxyType({id(s): why for s in walk(planned) if isinstance(s, Loop)})
    blocks = MappingProxyType(plan_block_storage(pdg) if options.block_store else {})
    body, body_conds = _body(pdg, found[0] if found else None, dim, options, target, scans, bool(blocks))
    plan = Plan(
        pdg=pdg,
        ast=planned,
        options=replace(options, donate=donate),
        target=target,
        blocks=blocks,
        merge_moves=moves,
        iter_dim=dim,
        iter_loop=found[0] if found else None,
        iter_offset=found[1] if found else 0,
        resume_after=resume_after,
        scans=scans,
        body=body,
        body_conds=body_conds,
    )
    verify_plan(plan)
    if options.scan_loops and options.fuse:  # every loop that does not compile, by name
        for lp in (s for s in walk(planned) if isinstance(s, Loop)):
            why = plan.why_not_scanned(lp)
            if why:
                log.info("loop over %s is not compiled as one scan: %s", lp.var, why)
    log.debug("%s", plan.summary())
    return plan


def _body(
    pdg: PDG,
    loop: Loop | None,
    dim: Sym | None,
    options: PlanOptions,
    target: Target,
    scans: Mapping[int, str],
    has_blocks: bool,
) -> tuple[str, tuple[BodyCond, ...]]:
    """Whether the iteration loop's body runs as one compiled call ('' and its conditions)
    or why not (plan/iteration_body.py)."""
    if not options.compile_iterations:
        return Plan.body, ()
    if loop is None or dim is None:
        return "the schedule has no iteration loop (it is not iteration-major)", ()
    if target.scans != "compiled":
        return f"the {target.name} backend does not compile loops", ()
    if not (options.fuse and options.scan_loops):
        return "it needs fuse and scan_loops", ()
    return body_verdict(pdg, loop, dim, scans, has_blocks)


def check_ast(pdg: PDG, ast: AstNode) -> None:
    """Every statement of ``ast`` runs a node of ``pdg`` with one coordinate per dim, and every
    expression uses only loop counters in scope and the program's bounds; else
    :class:`~timerl.errors.ScheduleError`."""
    known = set(pdg.static_bounds) | set(pdg.dynamic_bounds)

    def check(node: AstNode, scope: frozenset[Sym]) -> None:
        if isinstance(node, Seq):
            for c in node.children:
                check(c, scope)
            return
        if isinstance(node, Loop):
            bad = symbols_of((node.init,)) - scope - known
            inner = scope | {node.var}
            bad |= symbols_of((node.cond,)) - inner - known
            if not isinstance(node.inc, int) or node.inc == 0:
                raise ScheduleError(f"loop over {node.var} has a bad increment {node.inc!r}")
            check(node.body, inner)
        elif isinstance(node, If):
            bad = symbols_of((node.cond,)) - scope - known
            check(node.then, scope)
            if node.else_ is not None:
                check(node.else_, scope)
        else:
            bad = symbols_of(node.point) - scope - known
            n = pdg.nodes.get(node.node)
            if n is None:
                raise ScheduleError(f"the schedule runs %{node.node}, which is not in the PDG")
            if len(node.point) != len(n.domain):
                raise ScheduleError(
                    f"the schedule gives {len(node.point)} coordinates for {n.label} "
                    f"whose domain has {len(n.domain)} dims"
                )
        if bad:
            raise ScheduleError(f"schedule expression uses unknown symbol(s) {sorted(s.name for s in bad)}")

    check(ast, frozenset())


def _plan_seqs(node: AstNode, pdg: PDG, donate: bool) -> AstNode:
    """``node`` with the children of every ``Seq`` grouped into regions (and donations)."""
    if isinstance(node, Seq):
        children = plan_regions(node.children, pdg, frozenset(pdg.dynamic_bounds))
        if donate:
            from timerl.plan.donate import plan_donations

            children = plan_donations(children, pdg)
        return Seq(tuple(_plan_seqs(c, pdg, donate) for c in children))
    if isinstance(node, Loop):
        return replace(node, body=_plan_seqs(node.body, pdg, donate))
    if isinstance(node, If):
        other = None if node.else_ is None else _plan_seqs(node.else_, pdg, donate)
        return If(node.cond, _plan_seqs(node.then, pdg, donate), other)
    return node


def _skip_iterations(ast: AstNode, pdg: PDG, i: Sym, k: int) -> AstNode:
    """``ast`` with every loop that runs only iteration ``counter + c`` starting at ``k + 1``
    (a resumed run; other execs of points with ``i <= k`` are skipped by the runtime)."""

    def rec(node: AstNode) -> AstNode:
        if isinstance(node, Seq):
            return Seq(tuple(rec(c) for c in node.children))
        if isinstance(node, Loop):
            c = loop_offset(node, pdg, i)
            if c is None:
                return replace(node, body=rec(node.body))
            return replace(node, init=smax(node.init, k + 1 - c))
        if isinstance(node, If):
            return If(node.cond, rec(node.then), None if node.else_ is None else rec(node.else_))
        return node

    return rec(ast)


def _only_store_reader(
    moves: frozenset[tuple[int, int]], ast: AstNode, pdg: PDG
) -> frozenset[tuple[int, int]]:
    """The merge moves whose merge is the only statement reading the source from the store
    (a region's member reading an earlier member inside the region does not count)."""
    readers: dict[int, set[int]] = {}
    for st in walk(ast):
        if not isinstance(st, Exec):
            continue
        members = st.members if isinstance(st, FusedExec) else (st.node,)
        pos = {m: k for k, m in enumerate(members)}
        for k, m in enumerate(members):
            for e in pdg.data_in_edges(m):
                inside = len(members) > 1 and pos.get(e.src, k) < k and internal_read(e, pdg) is not None
                if not inside:
                    readers.setdefault(e.src, set()).add(m)
    keep = set()
    for merge, iid in moves:
        src = next(e.src for e in pdg.data_in_edges(merge) if e.iid == iid)
        if not readers.get(src, set()) - {merge}:
            keep.add((merge, iid))
    return frozenset(keep)


def verify_plan(plan: Plan) -> None:
    """Check a Plan's invariants; :class:`~timerl.errors.ScheduleError` names what is broken."""
    pdg = plan.pdg
    for r in plan.regions():
        nodes = [pdg.nodes.get(m) for m in r.members]
        if any(n is None for n in nodes):
            raise ScheduleError(f"plan: a region runs {r.members}, not all in the PDG")
        dom = nodes[0].domain  # type: ignore[union-attr]
        for n in nodes:
            assert n is not None
            if not fusable(n):
                raise ScheduleError(f"plan: region member {n.label} ({n.op.kind.name}) is not a pure op")
            if n.domain != dom or len(r.point) != len(dom):
                raise ScheduleError(f"plan: region member {n.label} is not at the region's point {r.point}")
        if r.node != r.members[0]:
            raise ScheduleError(f"plan: region {r.members} is named by %{r.node}, not its first member")
        for m, iid in r.donate:
            if m not in r.members or not any(e.iid == iid for e in pdg.data_in_edges(m)):
                raise ScheduleError(
                    f"plan: region {r.members} donates input {iid} of %{m}, which it does not read"
                )
        if r.donate and not plan.options.donate:
            raise ScheduleError(f"plan: region {r.members} donates inputs but donation is off")
    for merge, _iid in plan.merge_moves:
        n = pdg.nodes.get(merge)
        if n is None or n.op.kind is not OpKind.MERGE:
            raise ScheduleError(f"plan: merge move of %{merge}, which is not a MERGE")
    if plan.iter_loop is not None and not any(s is plan.iter_loop for s in walk(plan.ast)):
        raise ScheduleError("plan: the iteration loop is not a loop of the plan's AST")
    for (nid, oid), spec in plan.blocks.items():
        if nid not in pdg.nodes or oid >= len(pdg.nodes[nid].outputs) or (spec.nid, spec.oid) != (nid, oid):
            raise ScheduleError(f"plan: block store for %{nid} output {oid}, which the PDG lacks")
