"""``explain_memory``: which tensors grow with which dynamic bound, and what would bound them.

A Plan's peak estimate (:attr:`~timerl.plan.plan.Plan.peak`) walks the schedule with every
dynamic bound at 1; :func:`~timerl.plan.peak.dynamic_growth` walks it at two larger values,
so a tensor held for a whole episode shows as growing. :func:`explain` joins the two with
the readers that hold each growing tensor (a slice up to a dynamic bound, ``r[t:T]``,
``x[0:T]``, or a batch axis padded to ``bucket(T)``) and, per tensor, the first of the
schedules ``memory_budget`` would try (:data:`timerl.fit_dynamic.TRIES`) under which it
stops growing, or that none does.

``ctx.compile(..., explain_memory=True)`` logs :meth:`MemoryExplanation.describe` at INFO
(logger ``timerl.compile``) and keeps it as ``executor.memory_explanation``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from timerl.pdg.ir import PDG, Edge
from timerl.plan.peak import Growth, PeakEstimate
from timerl.symbolic import Slice, Sym
from timerl.symbolic.compile import symbols_of
from timerl.units import fmt_bytes


@dataclass(frozen=True)
class TensorGrowth:
    """A tensor whose most bytes held at once grow with ``bounds``: its bytes at each probe,
    the reads that hold it (``"'g' reads [t:T]"``) and what would bound it (a schedule
    ``memory_budget`` tries, or why none does)."""

    node: int
    label: str
    bounds: tuple[str, ...]
    peak_bytes: tuple[int, ...]
    held_by: tuple[str, ...]
    bounded_by: str


@dataclass(frozen=True)
class MemoryExplanation:
    """The estimated peak with dynamic bounds at 1, its growth with them (None without
    dynamic bounds) and the growing tensors, largest growth first."""

    peak: PeakEstimate
    growth: Growth | None
    tensors: tuple[TensorGrowth, ...]

    @property
    def grows(self) -> bool:
        return self.growth is not None and self.growth.grows

    def describe(self, top: int = 5) -> str:
        """The explanation as text (what ``explain_memory=True`` logs)."""
        lines = [f"memory: estimated peak {fmt_bytes(self.peak.peak_bytes)}"
                 + (" with every dynamic bound at 1" if self.growth is not None else "")]  # fmt: skip
        lines += [
            f"  {t.label}: {fmt_bytes(t.point_bytes)} per point x {t.peak_points} = {fmt_bytes(t.peak_bytes)}"
            for t in self.peak.tensors[:top]
        ]
        g = self.growth
        if g is None:
            lines.append("no dynamic bounds: the peak does not depend on run-time values")
            return "\n".join(lines)
        at = ", ".join(f"{'/'.join(g.bounds)} = {p}" for p in g.probes)
        peaks = " -> ".join(fmt_bytes(b) for b in g.peaks)
        if not g.grows:
            lines.append(f"the peak does not grow with {', '.join(g.bounds)} ({peaks} at {at})")
            return "\n".join(lines)
        lines.append(f"the peak grows with {', '.join(g.bounds)}: {peaks} at {at}; growing tensors:")
        if g.at_max is not None:
            lines.insert(-1, f"at {g.where()}: estimated peak {fmt_bytes(g.at_max)}")
        for t in self.tensors[:top]:
            lines.append(
                f"  {t.label} (with {', '.join(t.bounds)}): {' -> '.join(fmt_bytes(b) for b in t.peak_bytes)}"
            )
            lines += [f"    held while {h}" for h in t.held_by]
            lines.append(f"    bounded by: {t.bounded_by}")
        if len(self.tensors) > top:
            lines.append(f"  ... and {len(self.tensors) - top} more")
        return "\n".join(lines)


def _holding_reads(pdg: PDG, nid: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The reads of ``nid`` over a range up to a dynamic bound (or of a node batched over
    one), as text, and the dynamic bounds involved."""
    dyn = pdg.dynamic_bounds
    node = pdg.nodes[nid]
    reads: list[str] = []
    bounds: set[str] = set()
    padded = [b for b in node.batch if isinstance(b, Sym) and b in dyn]
    if padded:
        reads.append(f"it is batched over {', '.join(str(b) for b in padded)} rows (vectorize_dynamic)")
        bounds.update(b.name for b in padded)

    def names(e: Edge) -> set[str]:
        slices = [c for c in e.phi if isinstance(c, Slice)]
        return {s.name for s in symbols_of(slices) if s in dyn}

    for e in pdg.out_edges(nid):
        if e.order_only:
            continue
        got = names(e)
        if got:
            phi = ", ".join(str(c) for c in e.phi)
            reads.append(f"{pdg.nodes[e.sink].label} reads it at [{phi}]")
            bounds |= got
    return tuple(dict.fromkeys(reads)), tuple(sorted(bounds))


NOT_BOUNDED = (
    "no schedule memory_budget tries (it waits for the episode's end under each): read it through "
    "a window (x[t:min(t + n, T)]), make it smaller, or give the bound a static value"
)


def explain(plan_peak: PeakEstimate, pdg: PDG, growth: Growth | None,
            tries: Sequence[tuple[str, Growth | None]] = ()) -> MemoryExplanation:  # fmt: skip
    """The :class:`MemoryExplanation` of a Plan over ``pdg`` with estimate ``plan_peak`` and
    growth ``growth``; ``tries``: ``(what, growth)`` of the schedules ``memory_budget``
    tries (:data:`timerl.fit_dynamic.TRIES`), in order. A growing tensor counts as bounded
    by the first try in which no tensor of its label grows (nodes are matched by label:
    the tries rebuild the program)."""
    tensors: list[TensorGrowth] = []
    if growth is not None and growth.grows:
        for g in growth.tensors:
            held, bounds = _holding_reads(pdg, g.node)
            bounded = NOT_BOUNDED if tries else "not analysed (no rebuild available)"
            for what, tg in tries:
                if tg is not None and (not tg.grows or all(x.label != g.label for x in tg.tensors)):
                    bounded = f"memory_budget's schedule with {what}"
                    break
            tensors.append(
                TensorGrowth(g.node, g.label, bounds or growth.bounds, g.peak_bytes, held, bounded)
            )
    return MemoryExplanation(plan_peak, growth, tuple(tensors))
