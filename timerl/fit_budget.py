"""``memory_budget``: the search over schedules and Plans for one whose estimated peak fits.

``compile_context`` calls :func:`fit_budget` after scheduling. Each try reschedules the PDG
(``schedule_pdg``: frees, swaps) or rebuilds it (``incrementalize``), makes the Plan for its
peak estimate (``make_plan_for(..., estimate=True)``: ``plan/peak.py``, no second
interpreter) and keeps the first that fits, in the order :func:`fit_search` lists; with
dynamic bounds, :mod:`timerl.fit_dynamic` first looks for a schedule whose peak does not grow
with them. It works on :class:`~timerl.compile.CompileOptions` and returns the options it
chose, so the run and its logs say what was turned on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from timerl.compile import CompileOptions, make_plan_for, swapped_nodes
from timerl.pdg.ir import PDG
from timerl.plan.iterations import kept_values

log = logging.getLogger("timerl.compile")


def fit_budget(
    pdg: PDG,
    sched: Any,
    options: CompileOptions,
    budget: int,
    backend: Any,
    rebuild_with: Callable[[CompileOptions], PDG] | None = None,
) -> tuple[PDG, Any, CompileOptions]:
    """The PDG, schedule and options to run within ``budget`` bytes. With dynamic bounds,
    first a schedule whose peak does not grow with them (``timerl/fit_dynamic.py``; the
    program rebuilt by ``rebuild_with(options)``), kept if its peak fits; then
    :func:`fit_search`, whose choice must not grow either."""
    if not pdg.dynamic_bounds:
        rebuild = None if rebuild_with is None else _rebuilder(rebuild_with, options)
        return fit_search(pdg, sched, options, budget, backend, rebuild)
    from timerl.fit_dynamic import check_dynamic, fit_dynamic

    pdg, sched, options, growth = fit_dynamic(pdg, sched, options, budget, backend, rebuild_with)
    if growth.bounded is not None and growth.bounded <= budget:
        return pdg, sched, options
    rebuild = None if rebuild_with is None else _rebuilder(rebuild_with, options)
    pdg, sched, options = fit_search(pdg, sched, options, budget, backend, rebuild)
    check_dynamic(pdg, sched, options, budget, backend)
    return pdg, sched, options


def _rebuilder(
    rebuild_with: Callable[[CompileOptions], PDG], options: CompileOptions
) -> Callable[[int], PDG]:
    def rebuild(thr: int) -> PDG:
        return rebuild_with(replace(options, incrementalize=thr))

    return rebuild


def fit_search(
    pdg: PDG,
    sched: Any,
    options: CompileOptions,
    budget: int,
    backend: Any,
    rebuild: Callable[[int], PDG] | None = None,
) -> tuple[PDG, Any, CompileOptions]:
    """The PDG, schedule and options to run within ``budget`` bytes, trying in order: as
    given; with frees (``dealloc``); without scanned loops (``scan_loops=False``: a scan holds
    every iteration's outputs until it ends); with frees and incrementalized reductions, unless
    ``incrementalize`` was given (``budget.fit_by_incrementalizing``: no data moves); with
    frees and swapping (:func:`_fit_swapping`); with frees, incrementalization and swapping
    together (the program rebuilt by ``rebuild(threshold)``, :func:`_fit_both`); else
    :class:`MemoryBudgetError` naming the largest tensors (``timerl/plan/peak.py``)."""
    from timerl.errors import MemoryBudgetError
    from timerl.plan.peak import fit_by_incrementalizing
    from timerl.schedule.scheduler import schedule_pdg
    from timerl.units import fmt_bytes

    est = make_plan_for(pdg, sched, options, backend, estimate=True).peak
    if est.peak_bytes <= budget:
        return pdg, sched, options
    if not options.dealloc:  # without frees (and without free_iterations: an upper side)
        freed = schedule_pdg(
            pdg, dealloc=True, keep=kept_values(pdg), swap=swapped_nodes(pdg, replace(options, dealloc=True))
        )
        log.warning(
            "memory_budget %s: without frees the schedule holds about %s at once; turning dealloc on",
            fmt_bytes(budget),
            fmt_bytes(est.peak_bytes),
        )
        sched, options = freed, replace(options, dealloc=True)
        if make_plan_for(pdg, sched, options, backend, estimate=True).peak.peak_bytes <= budget:
            return pdg, sched, options
    if options.scan_loops:  # a scanned loop holds every iteration's outputs until it ends
        unscanned = replace(options, scan_loops=False)
        est = make_plan_for(pdg, sched, unscanned, backend, estimate=True).peak
        if est.peak_bytes <= budget:
            log.warning(
                "memory_budget %s: scanned loops hold their iterations' outputs; running loops "
                "statement by statement (scan_loops=False, estimated peak %s)",
                fmt_bytes(budget),
                fmt_bytes(est.peak_bytes),
            )
            return pdg, sched, unscanned
    if options.incrementalize is None:
        got = fit_by_incrementalizing(
            pdg,
            budget,
            lambda p: schedule_pdg(p, dealloc=True, keep=kept_values(p), swap=swapped_nodes(p, options)),
            lambda p, s: make_plan_for(p, s, replace(options, dealloc=True), backend, estimate=True),
            rebuild=rebuild,
        )
        if got is not None:
            inc, isched, thr, iest = got
            log.warning(
                "memory_budget %s: incrementalizing reductions over %s (estimated peak %s)",
                fmt_bytes(budget),
                fmt_bytes(thr),
                fmt_bytes(iest.peak_bytes),
            )
            return inc, isched, replace(options, incrementalize=thr, dealloc=True)
    try:
        return (pdg, *_fit_swapping(pdg, sched, options, budget, backend))
    except MemoryBudgetError as exc:
        if options.incrementalize is not None:
            raise
        if rebuild is not None:
            got = _fit_both(options, budget, rebuild, backend)
            if got is not None:
                return got
        raise MemoryBudgetError(
            f"{exc}\nIncrementalizing the reductions (thresholds {fmt_bytes(budget // 4)} and smaller) "
            "did not fit either, alone or with swapping."
        ) from exc


def _fit_both(
    options: CompileOptions, budget: int, rebuild: Callable[[int], PDG], backend: Any, tries: int = 3
) -> tuple[PDG, Any, CompileOptions] | None:
    """Incrementalization and swapping together: the program rebuilt with the thresholds of
    ``fit_by_incrementalizing`` (``budget // 4``, then 4x smaller), each with
    :func:`_fit_swapping`; the first that fits, or None. (Learning reads a swapped rollout in
    blocks of steps only when its reductions are incrementalized, and the reductions of each
    large step run as it is made: image PPO, ``docs/memory.md``.)"""
    from timerl.errors import MemoryBudgetError
    from timerl.schedule.scheduler import schedule_pdg
    from timerl.units import fmt_bytes

    thr = budget // 4
    for _ in range(tries):
        if thr < 1:
            break
        inc = rebuild(thr)
        opts = replace(options, incrementalize=thr, dealloc=True)
        isched = schedule_pdg(inc, dealloc=True, keep=kept_values(inc), swap=swapped_nodes(inc, opts))
        try:
            isched, opts = _fit_swapping(inc, isched, opts, budget, backend)
        except MemoryBudgetError as exc:
            log.info("memory_budget %s: incrementalized over %s and swapped: %s", fmt_bytes(budget),
                     fmt_bytes(thr), str(exc).splitlines()[0])  # fmt: skip
            thr //= 4
            continue
        log.warning("memory_budget %s: incrementalizing reductions over %s%s", fmt_bytes(budget),
                    fmt_bytes(thr), " and swapping" if opts.swap else "")  # fmt: skip
        return inc, isched, opts
    return None


MAX_SWAP_TRIES = 3
"""Swap thresholds the budget tries (largest first) after swapping every eligible tensor fits."""


def _fit_swapping(
    pdg: PDG, sched: Any, options: CompileOptions, budget: int, backend: Any
) -> tuple[Any, CompileOptions]:
    """Swapping chosen by the budget: every eligible tensor swapped (the smallest threshold)
    must fit, else :class:`MemoryBudgetError`; then the largest of a few thresholds (the
    eligible tensors' point sizes, largest first) that still fits, so that no more tensors
    move than needed."""
    from timerl.pdg.sizes import point_bytes
    from timerl.plan.peak import check_budget
    from timerl.schedule.scheduler import schedule_pdg
    from timerl.units import fmt_bytes

    eligible = swapped_nodes(pdg, options, threshold=0)
    if not eligible or (options.swap and swapped_nodes(pdg, options) == eligible):
        check_budget(make_plan_for(pdg, sched, options, backend, estimate=True), budget, "with deallocation")
        return sched, options  # fits without (more) swapping: nothing (else) can move
    keep = kept_values(pdg)
    sizes = point_bytes(pdg)
    every = schedule_pdg(pdg, dealloc=True, keep=keep, swap=eligible)
    swapping = replace(options, swap=True)
    check_budget(
        make_plan_for(pdg, every, swapping, backend, estimate=True), budget, "with deallocation and swapping"
    )
    chosen, threshold = every, min(sizes[n] for n in eligible)
    for size in sorted({sizes[n] for n in eligible}, reverse=True)[:MAX_SWAP_TRIES]:
        if size <= threshold:
            break
        tried = schedule_pdg(pdg, dealloc=True, keep=keep, swap=swapped_nodes(pdg, options, threshold=size))
        if make_plan_for(pdg, tried, swapping, backend, estimate=True).peak.peak_bytes <= budget:
            chosen, threshold = tried, size
            break
    log.warning(
        "memory_budget %s: frees alone do not fit; swapping tensors of %s or more per point to host memory",
        fmt_bytes(budget),
        fmt_bytes(threshold),
    )
    return chosen, replace(options, swap=True, swap_threshold=threshold)
