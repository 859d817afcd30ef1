"""``ctx.compile(..., memory_budget=...)``: the peak estimated from the schedule before
running (``plan/peak.py``), frees turned on when only they fit, and a
``MemoryBudgetError`` naming the largest tensors and the budget when nothing fits."""

from __future__ import annotations

from dataclasses import replace

import pytest
from test_dealloc import _fixed_program, nstep_program
from test_donate import N, momentum_program

from timerl.compile import Executor
from timerl.errors import MemoryBudgetError, TimeRLError
from timerl.schedule.ast import Loop, walk
from timerl.units import parse_bytes


def test_parse_bytes() -> None:
    assert parse_bytes("2GB") == 2 * 10**9
    assert parse_bytes("512MiB") == parse_bytes("512M") == 512 << 20
    assert parse_bytes("1.5 kb") == 1500
    assert parse_bytes(4096) == 4096
    for bad in ("two GB", "5 parsecs", 0, -3, True):
        with pytest.raises(MemoryBudgetError):
            parse_bytes(bad)


@pytest.mark.parametrize("dealloc", [False, True])
@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_estimate_is_a_lower_bound_with_frees(backend: str, dealloc: bool) -> None:
    """With frees the estimate is at most the store's peak and close to it (the momentum
    program: ``w``, ``m`` and a few temporaries of 2 KiB live at once). Donation off: a
    region taking its donated input out of the store early lowers the peak by that input."""
    ctx, bounds = momentum_program(lambda k, v: None, iters=30)
    ex = ctx.compile(bounds, backend=backend, dealloc=dealloc, free_iterations=False, donate=False)
    est = ex.plan.peak
    ex.execute()
    peak = ex.memory_stats().peak_bytes
    assert est.complete and est.peak_bytes > 0
    if dealloc:
        assert est.peak_bytes <= peak <= 2 * est.peak_bytes
    else:  # nothing is freed: every stored point of the read nodes
        assert est.peak_bytes >= 30 * 2 * N * 4


def test_budget_too_small_fails_before_running() -> None:
    ran: list[object] = []
    ctx, bounds = momentum_program(lambda k, v: ran.append(k), iters=30)
    with pytest.raises(MemoryBudgetError) as info:
        ctx.compile(bounds, backend="torch", memory_budget="1KiB")
    msg = str(info.value)
    assert "memory_budget=1.00 KiB" in msg and "KiB per point" in msg and "Fix:" in msg
    assert "'w'" in msg or "w defined" in msg or "w[" in msg or "w " in msg  # a tensor named
    assert isinstance(info.value, TimeRLError)
    assert not ran


def test_budget_turns_frees_on_when_only_they_fit() -> None:
    """60 iterations: with frees ``g[0:I]`` (kept for its sink) and a few 2 KiB tensors,
    about 130 KiB; without, every ``w``, ``m`` and temporary too."""
    ctx, bounds = momentum_program(lambda k, v: None, iters=60)
    ex = ctx.compile(bounds, backend="torch", dealloc=False, memory_budget="256KiB")
    assert ex.options.dealloc
    ex.execute()
    assert ex.memory_stats().peak_bytes <= 256 << 10
    ctx, bounds = momentum_program(lambda k, v: None, iters=60)
    big = ctx.compile(bounds, backend="torch", dealloc=False, memory_budget="1GB")
    assert not big.options.dealloc  # fits as given


def test_dynamic_bounds_are_estimated_at_their_smallest() -> None:
    """The n-step program's episodes (dynamic T) are walked with T = 1: a lower bound."""
    ctx, bounds = nstep_program(50, 8, lambda v, p: None)
    ex = ctx.compile(bounds, backend="torch")
    est = ex.plan.peak
    ex.execute()
    assert 0 < est.peak_bytes <= ex.memory_stats().peak_bytes


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_a_run_over_the_budget_stops_with_an_error_naming_the_tensor(backend: str) -> None:
    """Without frees a 400-step episode keeps 400 observations of 1 KiB. The compiler sees the
    peak grow with the dynamic T and turns the frees on (``fit_dynamic``); an executor made
    without that search (the Plan's estimate at T = 1 fits 64 KiB) is stopped by the store
    when the run passes the budget. With frees the same budget holds the whole run."""
    ctx, bounds = nstep_program(400, 8, lambda v, p: None)
    chosen = ctx.compile(bounds, backend=backend, dealloc=False, memory_budget="64KiB")
    assert chosen.options.dealloc
    ctx, bounds = nstep_program(400, 8, lambda v, p: None)
    plain = ctx.compile(bounds, backend=backend, dealloc=False)
    ex = Executor(plain.pdg, plain.schedule, plain.backend, replace(plain.options, memory_budget="64KiB"))
    assert ex.plan.peak.peak_bytes <= 64 << 10
    with pytest.raises(MemoryBudgetError) as info:
        ex.execute()
    msg = str(info.value)
    assert "memory_budget=64.00 KiB exceeded at run time" in msg and "obs" in msg and "Fix:" in msg
    ctx, bounds = nstep_program(400, 8, lambda v, p: None)
    ok = ctx.compile(bounds, backend=backend, dealloc=True, memory_budget="64KiB")
    ok.execute()
    assert 0 < ok.memory_stats().pools[0][1].peak_bytes <= 64 << 10


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_scanned_loops_are_estimated_and_unscanned_under_a_budget(backend: str) -> None:
    """A compiled scan (JAX) frees its body's points after its last iteration: the estimate
    counts every iteration's outputs live at its end (it counted one iteration's, and a 32 KiB
    budget stopped the run at run time). Under the budget the loop runs statement by statement
    (``scan_loops=False``), within it and with the same values. Torch's host loop drops the
    rows its body frees as it goes: it stays scanned, within the budget."""
    runs = {}
    for budget in (None, "32KiB"):
        got: dict[int, float] = {}
        ctx, bounds = _fixed_program(64, lambda v, p, g=got: g.__setitem__(p["i"], float(v)))
        ex = ctx.compile(bounds, backend=backend, **({} if budget is None else {"memory_budget": budget}))
        ex.execute()
        runs[budget] = (got, ex)
    (want, base), (got, ex) = runs[None], runs["32KiB"]
    assert got == want
    assert base.plan.peak.peak_bytes >= 0.95 * base.memory_stats().peak_bytes  # the scan's rows counted
    assert ex.memory_stats().peak_bytes <= 32 << 10
    scanned = any(base.plan.scanned(lp) for lp in walk(base.plan.ast) if isinstance(lp, Loop))
    if backend == "torch":  # the env (no pure form) is scanned by Torch's host loop only
        assert scanned and base.memory_stats().peak_bytes <= 32 << 10 and ex.options.scan_loops
    elif scanned:
        assert base.memory_stats().peak_bytes > 32 << 10 and not ex.options.scan_loops
