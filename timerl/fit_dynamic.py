"""``memory_budget`` for programs with dynamic bounds (issue 33: budgets that hold for them).

The peak of a program over a per-episode ``T`` is a function of ``T``; the Plan's estimate
walks the schedule at one value of the bounds, so a budget checked there (``T = 1``) says
nothing about an episode of 1,000 steps. Here the schedule is walked at two values
(:func:`timerl.plan.peak.dynamic_growth`): a tensor held for a whole episode (one point
per step, or a batch axis padded to ``bucket(T)``) grows, an n-step window does not.

:func:`fit_dynamic` tries, in order, schedules that hold less per step, and keeps the first
whose peak does not grow:

1. the program as given, with frees (``dealloc``);
2. with sums over whole episodes as running sums (``accumulate``: a weight gradient over
   the episode's steps is added step by step, so its terms and the observations they read
   are freed while the episode goes on: the learner interleaved with acting);
3. the same without vectorizing over the dynamic dim (``vectorize_dynamic=False``: nodes
   batched over ``bucket(T)`` rows hold the episode);

Swapping is not tried: the estimate does not count partial fetches nor block-stored
outputs, which stay on the device, so a swapped schedule's growth cannot be verified yet
(Monte-Carlo returns ``r[t:T]`` fetch the whole episode back for learning).

When none stops growing, :class:`~timerl.errors.MemoryBudgetError` names the growing
tensors before anything runs (an unbounded ``T`` cannot fit a budget then); when one does,
:func:`check_dynamic` compares its peak at the larger probe with the budget.

With ``max_bounds`` (``{T: 1000}``: the most each dynamic bound reaches; the runtime raises
:class:`~timerl.errors.BoundError` when an episode runs past it), a try whose peak grows is
kept when its estimate at those values (``Growth.at_max``, walked at ``T = 1000``) fits.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from timerl.errors import MemoryBudgetError
from timerl.pdg.ir import PDG
from timerl.units import fmt_bytes

log = logging.getLogger("timerl.compile")

TRIES: tuple[tuple[str, dict[str, Any]], ...] = (
    ("frees", {"dealloc": True}),
    ("running sums over episodes", {"dealloc": True, "accumulate": True}),
    (
        "running sums, the dynamic dim not vectorized",
        {"dealloc": True, "accumulate": True, "vectorize_dynamic": False},
    ),
)
"""The settings :func:`fit_dynamic` tries, in order (module doc)."""


def _growth(pdg: PDG, sched: Any, options: Any, backend: Any) -> Any:
    from timerl.compile import make_plan_for
    from timerl.plan.peak import dynamic_growth

    return dynamic_growth(make_plan_for(pdg, sched, options, backend, estimate=True))


def _variant(
    pdg: PDG, sched: Any, options: Any, change: dict[str, Any], rebuild: Callable[[Any], PDG] | None
) -> tuple[PDG, Any, Any] | None:
    """The PDG, schedule and options of ``options`` with ``change`` (the program rebuilt by
    ``rebuild`` unless only ``dealloc`` changes); None when it needs a rebuild and there is none."""
    from timerl.compile import swapped_nodes
    from timerl.plan.iterations import kept_values
    from timerl.schedule.scheduler import schedule_pdg

    opts = replace(options, **change)
    if opts == options:
        return pdg, sched, opts
    if replace(opts, dealloc=options.dealloc) == options:
        p = pdg
    elif rebuild is None:
        return None
    else:
        p = rebuild(opts)
    return p, schedule_pdg(p, dealloc=True, keep=kept_values(p), swap=swapped_nodes(p, opts)), opts


def try_growths(
    pdg: PDG, sched: Any, options: Any, backend: Any, rebuild: Callable[[Any], PDG] | None
) -> list[tuple[str, Any]]:
    """``(what, growth)`` of each of :data:`TRIES` that changes ``options`` (``explain_memory``:
    what would bound a growing tensor); a try that needs a rebuild without ``rebuild`` is left out."""
    out = []
    for what, change in TRIES:
        if replace(options, **change) == options:
            continue
        got = _variant(pdg, sched, options, change, rebuild)
        if got is not None:
            how = ", ".join(f"{k}={v}" for k, v in change.items() if k != "dealloc")
            out.append((f"{what} ({how})" if how else what, _growth(*got, backend)))
    return out


def fit_dynamic(
    pdg: PDG, sched: Any, options: Any, budget: int, backend: Any, rebuild: Callable[[Any], PDG] | None
) -> tuple[PDG, Any, Any, Any]:
    """The first of :data:`TRIES` (applied to ``options``) whose estimated peak does not grow
    with the dynamic bounds: its PDG (``rebuild(options)`` builds the program anew), schedule,
    options and :class:`~timerl.plan.peak.Growth`. :class:`MemoryBudgetError` naming the
    growing tensors when every try grows."""
    first = None
    best: tuple[str, Any] | None = None  # the try with the smallest peak at max_bounds
    for what, change in TRIES:
        got = _variant(pdg, sched, options, change, rebuild)
        if got is None:
            continue
        p, s, opts = got
        growth = _growth(p, s, opts, backend)
        at_max = "" if growth.at_max is None else f", {fmt_bytes(growth.at_max)} at {growth.where()}"
        log.info(
            "memory_budget %s, %s: estimated peak %s at %s%s",
            fmt_bytes(budget), what, " -> ".join(fmt_bytes(b) for b in growth.peaks),
            ", ".join(f"{'/'.join(growth.bounds)} = {v}" for v in growth.probes), at_max,
        )  # fmt: skip
        if first is None:
            first = growth
        if growth.at_max is not None and (best is None or growth.at_max < best[1].at_max):
            best = (what, growth)
        if not growth.grows or (growth.bounded is not None and growth.bounded <= budget):
            if opts != options:
                log.warning(
                    "memory_budget %s: the peak %s with %s; %s: at most %s%s",
                    fmt_bytes(budget), "grows" if growth.grows else "grew", "/".join(growth.bounds), what,
                    fmt_bytes(growth.bounded or 0), f" at {growth.where()}" if growth.grows else "",
                )  # fmt: skip
            elif growth.grows:
                log.info(
                    "memory_budget %s: the peak grows with %s, up to %s at %s",
                    fmt_bytes(budget), "/".join(growth.bounds), fmt_bytes(growth.bounded or 0), growth.where(),
                )  # fmt: skip
            return p, s, opts, growth
    assert first is not None
    names = ", ".join(first.bounds)
    if best is not None:
        what, g = best
        raise MemoryBudgetError(
            f"memory_budget={fmt_bytes(budget)} cannot be met up to {g.where()}: the estimated peak "
            f"grows with {names}, and the schedule that holds least ({what}) reaches {fmt_bytes(g.at_max or 0)} "
            f"there ({' -> '.join(fmt_bytes(b) for b in g.peaks)} at the probes). Growing tensors, "
            f"{g.describe()}\nTried: {'; '.join(w for w, _ in TRIES)}.\n"
            "Fix: raise memory_budget, lower max_bounds, or read the episode through a window "
            "(r[t:min(t + n, T)])."
        )
    raise MemoryBudgetError(
        f"memory_budget={fmt_bytes(budget)} cannot be met for every value of the dynamic bound(s) "
        f"{names}: the estimated peak grows with them "
        f"({' -> '.join(fmt_bytes(b) for b in first.peaks)}), so a long enough episode exceeds any budget. "
        f"Growing tensors, {first.describe()}\n"
        f"Tried: {'; '.join(w for w, _ in TRIES)}; each still grows.\n"
        "Fix: give the most each bound reaches (max_bounds={T: 1000}), read the episode through a window "
        "(r[t:min(t + n, T)]) or make what waits for its end smaller, or give a static bound."
    )


def check_dynamic(pdg: PDG, sched: Any, options: Any, budget: int, backend: Any) -> None:
    """:class:`MemoryBudgetError` when the chosen schedule's peak grows with the dynamic
    bounds or exceeds ``budget`` at the larger probe."""
    growth = _growth(pdg, sched, options, backend)
    if growth is None:
        return
    if growth.bounded is None or growth.bounded > budget:
        at_max = "" if growth.at_max is None else f", {fmt_bytes(growth.at_max)} at {growth.where()}"
        raise MemoryBudgetError(
            f"memory_budget={fmt_bytes(budget)} cannot be met: the schedule's estimated peak is "
            f"{' -> '.join(fmt_bytes(b) for b in growth.peaks)}{at_max} {growth.describe()}\n"
            "Fix: raise memory_budget, give or lower max_bounds, or shrink the largest tensors."
        )
