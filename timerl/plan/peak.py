"""The peak-memory estimate of a Plan, and the budget checks built on it.

Before anything runs, :func:`estimate_peak` walks the Plan's AST (loops,
``If``\\ s, ``Exec``\\ s and ``Dealloc``\\ s, with the static bounds' values and every
dynamic bound at 1) keeping the set of live points with their sizes, and returns the most
bytes live at once and, per node, the most bytes it held. A point's size is that of its
outputs (batch dims included: ``prod(batch) * prod(shape) * itemsize``, symbolic shape
dims evaluated like bounds).

The estimate approximates the store's peak (``memory_stats().peak_bytes``) for the dynamic
bounds' smallest value: it leaves out what the runtime adds (block buffers' preallocated
rows) and what the runtime may free besides the schedule's frees: points no edge reads
(``free_iterations`` drops them). A loop the Plan scans runs its body's frees after its
last iteration, so its outputs are walked as all live at its end. A ``MERGE``
stores its branch's tensor itself; the store counts it under both nodes, and so does the
estimate (the branch's node may be freed first: an env step's observation output, freed
per output once merged, ``dealloc.py``). Donation
(``donate``) may lower the store's peak by the inputs donated at one statement. The walk
stops after ``max_steps`` statement instances (the peak so far, of the instances walked).

:func:`check_budget` raises :class:`~timerl.errors.MemoryBudgetError` when the estimate
exceeds the budget, naming the largest tensors, their sizes and the budget.
:func:`fit_by_incrementalizing` tries incrementalization (paper §5.3) with a few
thresholds (``fit_budget.fit_budget``); when that does not fit either, swapping is turned on
(offloads and fetches move tensors to the host pool, which the budget does not count: it is
a device budget) with the largest threshold that fits.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from timerl.errors import MemoryBudgetError
from timerl.pdg.ir import PDG
from timerl.pdg.sizes import bucket, dynamic_values, output_bytes, point_bytes
from timerl.plan.plan import Plan
from timerl.plan.regions import FusedExec
from timerl.schedule.ast import AstNode, Dealloc, Exec, Fetch, If, Loop, Offload, Seq
from timerl.symbolic import Slice, Sym
from timerl.units import fmt_bytes

log = logging.getLogger(__name__)

MAX_STEPS = 2_000_000
"""Statement instances :func:`estimate_peak` walks at most."""


@dataclass(frozen=True)
class TensorEstimate:
    """One node's share: bytes per point and the most bytes (points) it held at once."""

    node: int
    label: str
    point_bytes: int
    peak_bytes: int
    peak_points: int


@dataclass(frozen=True)
class PeakEstimate:
    """:func:`estimate_peak`'s result: the most bytes live at once, the nodes with the
    largest own peaks (largest first), whether the whole schedule was walked, and the
    number of statement instances walked."""

    peak_bytes: int
    tensors: tuple[TensorEstimate, ...]
    complete: bool
    steps: int


class _Walk:
    def __init__(
        self,
        pdg: PDG,
        sizes: dict[int, int],
        max_steps: int,
        dynamic_value: int | Mapping[str, int] = 1,
        scanned: Callable[[Loop], bool] = lambda loop: False,
    ) -> None:
        self.pdg = pdg
        self.scanned = scanned
        self.sizes = sizes
        self.max_steps = max_steps
        self.steps = 0
        self.live: dict[tuple[int, tuple[int, ...]], int] = {}
        self.out_sizes = output_bytes(pdg, dynamic_value)
        self.freed_outputs: dict[tuple[int, tuple[int, ...]], set[int]] = {}  # points freed in part
        self.host: dict[tuple[int, tuple[int, ...]], int] = {}  # offloaded points (not counted)
        self.total = 0
        self.peak = 0
        self.node_live: dict[int, list[int]] = {}  # nid -> [bytes, points, peak bytes, points then]
        self.env: dict[Sym, int] = {s: int(v) for s, v in pdg.static_bounds.items()}
        self.env.update(dynamic_values(pdg, dynamic_value))

    def compile(self, node: AstNode) -> Callable[[], None]:
        from timerl.symbolic.compile import compile_expr, compile_exprs

        env = self.env
        if isinstance(node, Seq):
            fns = [self.compile(c) for c in node.children]

            def seq() -> None:
                for f in fns:
                    f()

            return seq
        if isinstance(node, Loop) and self.scanned(node):
            return self._scanned_loop(node)
        if isinstance(node, Loop):
            var, inc = node.var, int(node.inc)
            init, cond, body = compile_expr(node.init), compile_expr(node.cond), self.compile(node.body)

            def loop() -> None:
                env[var] = init(env)
                while cond(env):
                    body()
                    env[var] += inc
                del env[var]

            return loop
        if isinstance(node, If):
            c = compile_expr(node.cond)
            then = self.compile(node.then)
            other = self.compile(node.else_) if node.else_ is not None else None

            def branch() -> None:
                if c(env):
                    then()
                elif other is not None:
                    other()

            return branch
        pt = compile_exprs(node.point)
        if isinstance(node, FusedExec):
            from timerl.plan.fusable import stored_members

            nodes = [self.pdg.nodes[m] for m in node.members]
            adds = [self._adder(nodes[k].id, pt) for k in stored_members(nodes, self.pdg)]

            def run_region() -> None:
                self.steps += 1
                if self.steps > self.max_steps:
                    raise _Stop
                for a in adds:
                    a()

            return run_region
        nid = node.node
        acc = self.node_live.setdefault(nid, [0, 0, 0, 0])
        if isinstance(node, (Dealloc, Offload, Fetch)):
            batched = any(isinstance(c, Slice) for c in node.point)
            size = self.sizes.get(nid, 0)

            def points() -> Any:
                p = pt(env)
                return (
                    itertools.product(*(c if isinstance(c, range) else (c,) for c in p)) if batched else (p,)
                )

            if isinstance(node, Fetch) and node.outputs:  # a part of the point: not counted (a lower bound)
                return lambda: None
            if isinstance(node, Fetch):  # back on the device (device bytes only are counted)

                def fetch() -> None:
                    for p in points():
                        if self.host.pop((nid, p), None) is not None:
                            self._add(nid, p, size, acc)

                return fetch

            if isinstance(node, Dealloc) and node.outputs:  # some outputs: their share of the point
                return self._partial_free(nid, node.outputs, points, acc)

            def drop() -> None:
                for p in points():
                    b = self.live.pop((nid, p), None)
                    if b is not None:
                        self.total -= b
                        acc[0] -= b
                        acc[1] -= 1
                        if isinstance(node, Offload):
                            self.host[(nid, p)] = b
                    elif isinstance(node, Dealloc):
                        self.host.pop((nid, p), None)

            return drop
        assert isinstance(node, Exec)
        add = self._adder(nid, pt)

        def run() -> None:
            self.steps += 1
            if self.steps > self.max_steps:
                raise _Stop
            add()

        return run

    def _scanned_loop(self, node: Loop) -> Callable[[], None]:
        """A loop run as one compiled scan (``plan.scans`` on JAX): every iteration's
        statements, then the body's frees for every iteration (they run after the scan), so
        its outputs are all live at once at its end."""
        from timerl.plan.scans import frees_only
        from timerl.symbolic.compile import compile_expr

        def stmts(n: AstNode) -> list[AstNode]:
            return [x for c in n.children for x in stmts(c)] if isinstance(n, Seq) else [n]

        kids = stmts(node.body)
        work = [self.compile(c) for c in kids if not frees_only(c)]
        frees = [self.compile(c) for c in kids if frees_only(c)]
        env, var, inc = self.env, node.var, int(node.inc)
        init, cond = compile_expr(node.init), compile_expr(node.cond)

        def loop() -> None:
            env[var] = init(env)
            seen = []
            while cond(env):
                for f in work:
                    f()
                seen.append(env[var])
                env[var] += inc
            for v in seen:
                env[var] = v
                for f in frees:
                    f()
            del env[var]

        return loop

    def _partial_free(
        self, nid: int, outputs: tuple[int, ...], points: Callable[[], Any], acc: list[int]
    ) -> Callable[[], None]:
        """A free of ``outputs`` of ``nid``: each point keeps the bytes of its other outputs
        until they are freed too (outputs freed twice count once)."""
        share = self.out_sizes.get(nid, ())

        def free_part() -> None:
            for p in points():
                key = (nid, p)
                if key not in self.live:
                    continue
                gone = self.freed_outputs.setdefault(key, set())
                new = [o for o in outputs if o not in gone and o < len(share)]
                gone.update(new)
                b = min(self.live[key], sum(share[o] for o in new))
                self.live[key] -= b
                self.total -= b
                acc[0] -= b
                if len(gone) >= len(share):
                    del self.live[key], self.freed_outputs[key]
                    acc[1] -= 1

        return free_part

    def _adder(self, nid: int, pt: Callable[[Any], tuple[int, ...]]) -> Callable[[], None]:
        """Count ``nid``'s point (evaluated by ``pt``) live, once."""
        env = self.env
        size = self.sizes.get(nid, 0)
        acc = self.node_live.setdefault(nid, [0, 0, 0, 0])

        def add() -> None:
            if size:
                self._add(nid, pt(env), size, acc)

        return add

    def _add(self, nid: int, p: tuple[int, ...], size: int, acc: list[int]) -> None:
        key = (nid, p)
        if key in self.live:
            return
        self.live[key] = size
        self.total += size
        acc[0] += size
        acc[1] += 1
        if acc[0] > acc[2]:
            acc[2], acc[3] = acc[0], acc[1]
        if self.total > self.peak:
            self.peak = self.total


class _Stop(Exception):
    pass


def _walk(plan: Plan, max_steps: int, dynamic_value: int | Mapping[str, int]) -> tuple[_Walk, bool]:
    """The walk of ``plan``'s AST with every dynamic bound at ``dynamic_value`` (one value,
    or per bound name), and whether it was complete."""
    pdg = plan.pdg
    read = {e.src for e in pdg.edges if not e.order_only}
    sizes = {nid: b for nid, b in point_bytes(pdg, dynamic_value).items() if nid in read}
    # a compiled scan frees its body's points after its last iteration; a host loop (Torch)
    # drops the rows its body frees as it goes, as the loop run statement by statement would
    scanned = plan.scanned if plan.target.scans == "compiled" else (lambda loop: False)
    w = _Walk(pdg, sizes, max_steps, dynamic_value, scanned)
    try:
        w.compile(plan.ast)()
    except _Stop:
        return w, False
    return w, True


def estimate_peak(
    plan: Plan, max_steps: int = MAX_STEPS, top: int = 5, dynamic_value: int = 1
) -> PeakEstimate:
    """An estimate of the store's peak bytes when ``plan`` runs (see the module doc): its
    regions store only the members read outside them, its frees are where it runs them;
    every dynamic bound at ``dynamic_value``."""
    pdg = plan.pdg
    w, complete = _walk(plan, max_steps, dynamic_value)
    ranked = sorted(w.node_live.items(), key=lambda kv: (-kv[1][2], kv[0]))[:top]
    tensors = tuple(
        TensorEstimate(nid, pdg.nodes[nid].label, w.sizes.get(nid, 0), acc[2], acc[3])
        for nid, acc in ranked
        if acc[2] > 0
    )
    return PeakEstimate(w.peak, tensors, complete, w.steps)


DYNAMIC_PROBES = (64, 128)
"""The values of the dynamic bounds :func:`dynamic_growth` walks a Plan at: above the windows
the scheduler lets a node wait for (``scheduler.MAX_WINDOW_LAG``), so an n-step window's
``O(n)`` values do not count as growth."""


@dataclass(frozen=True)
class GrowingTensor:
    """A node whose most bytes held at once grow with the dynamic bounds: at each probe."""

    node: int
    label: str
    peak_bytes: tuple[int, ...]


@dataclass(frozen=True)
class Growth:
    """The peak of a Plan as a function of its dynamic bounds, sampled at ``probes`` (every
    dynamic bound at each value): the peaks, the nodes whose own peak grows (largest growth
    first), and whether every walk was complete."""

    bounds: tuple[str, ...]
    probes: tuple[int, ...]
    peaks: tuple[int, ...]
    tensors: tuple[GrowingTensor, ...]
    complete: bool
    # every dynamic bound at the most the user said it reaches (``max_bounds``), when each has
    # one: those values and the peak there (walked; extrapolated from the probes if the walk
    # stopped at its step limit)
    maxima: tuple[tuple[str, int], ...] = ()
    at_max: int | None = None

    @property
    def grows(self) -> bool:
        """Whether the peak grows with the dynamic bounds."""
        return self.peaks[-1] > self.peaks[0]

    @property
    def bounded(self) -> int | None:
        """The most the schedule holds at once for every value of the dynamic bounds the
        program may take (the peak at the largest probe when it does not grow, else the peak
        at ``max_bounds``); None when it grows without a bound."""
        if not self.grows:
            return self.peaks[-1]
        return self.at_max

    def where(self) -> str:
        """The bounds' values the peak is given at (``T = 1000`` with ``max_bounds``)."""
        if self.grows and self.at_max is not None:
            return ", ".join(f"{k} = {v}" for k, v in self.maxima) + " (max_bounds)"
        return f"{'/'.join(self.bounds)} = {self.probes[-1]}"

    def describe(self, top: int = 5) -> str:
        """The growing tensors as lines: bytes held at each probe."""
        at = ", ".join(f"{'/'.join(self.bounds)} = {p}" for p in self.probes)
        rows = [f"  {g.label}: {' -> '.join(fmt_bytes(b) for b in g.peak_bytes)}" for g in self.tensors[:top]]
        more = len(self.tensors) - top
        return f"held at {at}:\n" + "\n".join(rows) + (f"\n  ... and {more} more" if more > 0 else "")


def dynamic_growth(
    plan: Plan, probes: tuple[int, ...] = DYNAMIC_PROBES, max_steps: int = MAX_STEPS
) -> Growth | None:
    """How ``plan``'s estimated peak grows with its dynamic bounds (None without any): the
    estimate walked at each of ``probes``. A tensor held for a whole episode grows (one
    point per step, or a batch axis padded to ``bucket(T)``); an n-step window does not."""
    pdg = plan.pdg
    if not pdg.dynamic_bounds:
        return None
    walks = [_walk(plan, max_steps, v) for v in probes]
    per_node: dict[int, list[int]] = {}
    for k, (w, _) in enumerate(walks):
        for nid, acc in w.node_live.items():
            per_node.setdefault(nid, [0] * len(probes))[k] = acc[2]
    growing = sorted(
        ((nid, b) for nid, b in per_node.items() if b[-1] > b[0]),
        key=lambda kv: (kv[1][0] - kv[1][-1], kv[0]),
    )
    peaks = tuple(w.peak for w, _ in walks)
    names = tuple(sorted(s.name for s in pdg.dynamic_bounds))
    maxima = dict(plan.options.max_bounds)
    at_max = None
    if peaks[-1] > peaks[0] and all(b in maxima for b in names):
        at_max = _peak_at(plan, maxima, probes, peaks, max_steps)
    return Growth(
        names,
        tuple(probes),
        peaks,
        tuple(GrowingTensor(nid, pdg.nodes[nid].label, tuple(b)) for nid, b in growing),
        all(c for _, c in walks),
        tuple((b, maxima[b]) for b in names if b in maxima),
        at_max,
    )


def _peak_at(
    plan: Plan, maxima: Mapping[str, int], probes: tuple[int, ...], peaks: tuple[int, ...], max_steps: int
) -> int:
    """The estimated peak with each dynamic bound at ``maxima``; when that walk stops at
    ``max_steps``, at least the line through the probes' peaks at the padded length
    ``bucket(max)`` (growth per step is at most linear in an episode's points, doubled by
    the padding of batch axes)."""
    w, complete = _walk(plan, max_steps, maxima)
    if complete:
        return w.peak
    most = bucket(max(maxima.values()))
    slope = (peaks[-1] - peaks[0]) / (probes[-1] - probes[0])
    return max(w.peak, int(peaks[-1] + slope * max(0, most - probes[-1])))


def check_budget(plan: Plan, budget: int, what: str = "") -> PeakEstimate:
    """The estimate of ``plan``'s peak; :class:`MemoryBudgetError` when it exceeds ``budget``."""
    pdg = plan.pdg
    est = plan.peak
    log.info(
        "memory_budget %s: estimated peak %s (%s, %d statement instances)%s",
        fmt_bytes(budget), fmt_bytes(est.peak_bytes), "whole schedule" if est.complete else "partial walk",
        est.steps, f" {what}" if what else "",
    )  # fmt: skip
    if est.peak_bytes <= budget:
        return est
    rows = "\n".join(
        f"  {t.label}: {fmt_bytes(t.point_bytes)} per point x {t.peak_points} points live = {fmt_bytes(t.peak_bytes)}"
        for t in est.tensors
    )
    dyn = ", ".join(sorted(s.name for s in pdg.dynamic_bounds))
    raise MemoryBudgetError(
        f"memory_budget={fmt_bytes(budget)} cannot be met: the schedule{f' {what}' if what else ''} holds at "
        f"least {fmt_bytes(est.peak_bytes)} at once (estimated before running from each tensor's size"
        f"{f' with {dyn} = 1' if dyn else ''}). Largest tensors at their peak:\n{rows}\n"
        "Fix: raise memory_budget, or shrink the largest tensors (fewer envs or steps per iteration, "
        "smaller minibatches)."
    )


def fit_by_incrementalizing(
    pdg: PDG,
    budget: int,
    schedule: Callable[[PDG], Any],
    plan_of: Callable[[PDG, Any], Plan],
    tries: int = 3,
    rebuild: Callable[[int], PDG] | None = None,
) -> tuple[PDG, Any, int, PeakEstimate] | None:
    """Incrementalize ``pdg`` (``timerl/pdg/passes/incrementalize.py``) with the largest of a
    few thresholds whose schedule's estimated peak fits ``budget``: ``budget // 4``, then
    4x smaller ones (``tries`` in all), skipping thresholds the pass cannot use (no tensor
    above them, or nothing to tile). ``schedule(pdg)`` gives the schedule (with frees).
    Returns the incrementalized PDG, its schedule, the threshold and the estimate; None
    when no threshold fits. ``rebuild(threshold)``, when given, builds the program anew with
    ``incrementalize=threshold`` (so the vectorization's choices for it apply too) instead of
    running the pass on ``pdg``."""
    from timerl.pdg.passes.incrementalize import incrementalize
    from timerl.pdg.verify import verify_pdg

    largest = max(point_bytes(pdg).values(), default=0)
    thr = budget // 4
    for _ in range(tries):
        if thr < 1:
            break
        if thr < largest:
            inc = incrementalize(pdg, thr) if rebuild is None else rebuild(thr)
            if inc is not pdg and (len(inc.nodes), inc.dims) != (len(pdg.nodes), pdg.dims):
                verify_pdg(inc)
                sched = schedule(inc)
                est = plan_of(inc, sched).peak
                log.info(
                    "memory_budget %s: incrementalized over %s, estimated peak %s",
                    fmt_bytes(budget), fmt_bytes(thr), fmt_bytes(est.peak_bytes),
                )  # fmt: skip
                if est.peak_bytes <= budget:
                    return inc, sched, thr, est
        thr //= 4
    return None
