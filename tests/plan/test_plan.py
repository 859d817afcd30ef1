"""The Plan (``timerl/plan/plan.py``): one frozen value between the schedule and the run.

Its decisions are the ones the runtime executes (regions, donations, scanned loops), it is
checked by ``verify_plan``, it names every loop that does not compile and why, and a run of
a Plan made without an optimisation gives the values of one made with it."""

from __future__ import annotations

import dataclasses
import logging

import numpy as np
import pytest

import timerl as trl
from timerl.backends import get_backend
from timerl.errors import ScheduleError
from timerl.plan.plan import Plan, PlanOptions, Target, make_plan, verify_plan
from timerl.plan.regions import FusedExec
from timerl.runtime.interpreter import Executor
from timerl.schedule.ast import Exec, Loop, walk

W = np.array([[0.5, -0.3], [0.2, 0.8]], np.float32)


def _program(seen: dict) -> tuple[trl.Context, dict]:
    """A recurrence over t inside iterations i, learning from it (as in test_scan.py)."""
    ctx = trl.Context(dims=("i", "t"))
    with ctx as ((i, I), (t, T)):
        w = trl.param(np.array([0.3, -0.2], np.float32), domain=(i,), name="w")
        x = trl.empty((2,), domain=(i, t), name="x")
        x[i, 0] = w * 1.0
        x[i, t + 1] = (x @ trl.const(W)).tanh() * 0.9
        total = x[i, 0:T].sum()
        total.sink(lambda v, p: seen.__setitem__(p["i"], float(v)))
        (total * total).backward()
        w[i + 1] = w - 0.05 * w.grad
    return ctx, {I: 3, T: 6}


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_compiled_program_runs_its_plan(backend: str) -> None:
    seen: dict = {}
    ctx, bounds = _program(seen)
    ex = ctx.compile(bounds, backend=backend)
    plan = ex.plan
    assert isinstance(plan, Plan) and ex._interp.plan is plan
    verify_plan(plan)
    regions = plan.regions()
    assert regions and max(len(r.members) for r in regions) >= 2
    assert plan.iter_dim is not None and plan.iter_dim.name == "i"
    text = plan.pretty()
    assert text.startswith("plan: ") and "region[" in text and "for (" in text
    ex.execute()
    assert sorted(seen) == [0, 1, 2]
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.ast = plan.ast  # type: ignore[misc]


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_every_loop_that_does_not_compile_is_named(backend: str, caplog) -> None:
    ctx, bounds = _program({})
    with caplog.at_level(logging.INFO, logger="timerl.plan.plan"):
        ex = ctx.compile(bounds, backend=backend)
    loops = [s for s in walk(ex.plan.ast) if isinstance(s, Loop)]
    assert loops
    # the recurrence over t is scanned (JAX: one lax.scan; Torch: one host loop); the loop
    # over i holds it
    assert any(ex.plan.scanned(lp) for lp in loops)
    assert "# scanned" in ex.plan.pretty()
    named = [r.getMessage() for r in caplog.records if "is not compiled as one scan" in r.getMessage()]
    assert len(named) == sum(1 for lp in loops if not ex.plan.scanned(lp))


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_plans_with_and_without_regions_give_the_same_values(backend: str) -> None:
    """The runtime executes whatever Plan it is given: regions (and donation, scans) off
    give the same values, and no region is formed."""
    be = get_backend(backend)
    runs = {}
    for fuse in (True, False):
        seen: dict = {}
        ctx, bounds = _program(seen)
        ex = ctx.compile(bounds, backend=backend)
        plan = make_plan(ex.pdg, ex.schedule.ast, PlanOptions(fuse=fuse, scan_loops=fuse), Target.of(be))
        assert bool(plan.regions()) == fuse
        Executor(plan, be).execute()
        runs[fuse] = seen
    assert sorted(runs[True]) == sorted(runs[False]) == [0, 1, 2]
    for k in runs[True]:
        np.testing.assert_allclose(runs[True][k], runs[False][k], rtol=1e-5)


def test_verify_plan_rejects_a_broken_plan() -> None:
    ctx, bounds = _program({})
    ex = ctx.compile(bounds, backend="torch")
    plan = ex.plan
    sink = next(n.id for n in ex.pdg if n.op.kind.name == "SINK")
    region = plan.regions()[0]
    bad = FusedExec(region.node, region.point, region.members + (sink,))

    def swap(node):  # the AST with the region replaced by the bad one
        from timerl.schedule.ast import If, Seq

        if node is region:
            return bad
        if isinstance(node, Seq):
            return Seq(tuple(swap(c) for c in node.children))
        if isinstance(node, Loop):
            return dataclasses.replace(node, body=swap(node.body))
        if isinstance(node, If):
            return If(node.cond, swap(node.then), None if node.else_ is None else swap(node.else_))
        return node

    with pytest.raises(ScheduleError, match="not a pure op"):
        verify_plan(dataclasses.replace(plan, ast=swap(plan.ast), iter_loop=None))
    with pytest.raises(ScheduleError, match="not in the PDG"):
        make_plan(ex.pdg, Exec(10_000, ()), PlanOptions())


def test_a_plan_for_another_backend_is_refused() -> None:
    """A plan that scans loops does not run on a backend that cannot (here Torch with its host
    loops switched off); Torch runs JAX's plans (it donates and scans too)."""
    from timerl.backends.torch_backend import TorchBackend

    class NoScans(TorchBackend):
        scans = ""

    ctx, bounds = _program({})
    ex = ctx.compile(bounds, backend="jax")
    assert ex.plan.target.scans
    Executor(ex.plan, get_backend("torch"))
    with pytest.raises(ScheduleError, match="made for the jax backend"):
        Executor(ex.plan, NoScans())


def test_plot_schedule_lists_the_plan(tmp_path) -> None:
    ctx, bounds = _program({})
    ex = ctx.compile(bounds, backend="jax")
    txt, _ = ex.plot_schedule(tmp_path / "schedule")
    text = txt.read_text()
    assert "plan: " in text and "region[" in text and "# scanned" in text


def test_a_window_whose_length_moves_with_the_loop_is_not_scanned(caplog) -> None:
    """``y[i, t:min(t + 2, T)]`` summed in a loop over t: the windows differ in length, so the
    plan says why that loop is not one scan (before, the scan failed at run time and fell
    back to running statement by statement)."""
    got: dict = {}
    ctx = trl.Context(dims=("i", "t"))
    with ctx as ((i, I), (t, T)):
        x = trl.empty((), domain=(i, t), name="x")
        x[i, 0] = trl.const(np.float32(1.0))
        x[i, t + 1] = x * 0.5 + 1.0
        m = (x * 2.0)[i, t : trl.min(t + 2, T)].sum(0)
        z = (m * 3.0)[i, 0:T].sum(0)
        z.sink(lambda v, p: got.__setitem__(p["i"], float(v)))
    with caplog.at_level(logging.WARNING, logger="timerl.runtime.scan"):
        ex = ctx.compile({I: 2, T: 5}, backend="jax")
        ex.execute()
    reasons = [ex.plan.why_not_scanned(lp) for lp in walk(ex.plan.ast) if isinstance(lp, Loop)]
    assert any("whose length changes along the loop" in r for r in reasons), reasons
    assert not [r for r in caplog.records if "failed to run as one scan" in r.getMessage()]
    xs = [1.0]
    for _ in range(4):
        xs.append(xs[-1] * 0.5 + 1.0)
    want = sum(3.0 * sum(2.0 * v for v in xs[k : min(k + 2, 5)]) for k in range(5))
    assert got == pytest.approx({0: want, 1: want})
