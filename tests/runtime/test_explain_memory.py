"""``ctx.compile(..., explain_memory=True)``: the estimated peak, which tensors grow with which
dynamic bound, the reads that hold them and what would bound them, logged at INFO
(``timerl/plan/explain.py``; issue 33)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest
from test_budget_nstep import _monte_carlo

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from memory_nstep import nstep_program  # noqa: E402

OBS = 256


def test_nstep_window_gradient_grows_and_running_sums_bound_it(caplog: pytest.LogCaptureFixture) -> None:
    """The n-step program under a dynamic T: the stacked weight-gradient terms wait for the
    episode's end (read at ``[i, 0:T]``); running sums (``accumulate``) would bound them."""
    ctx, bounds = nstep_program(8, True, lambda v, p: None, obs=OBS)
    with caplog.at_level(logging.INFO, logger="timerl.compile"):
        ex = ctx.compile(bounds, backend="torch", explain_memory=True)
    exp = ex.memory_explanation
    assert exp is not None and exp.grows and exp.growth is not None
    assert exp.growth.bounds == ("T",) and exp.tensors
    top = exp.tensors[0]
    assert top.bounds == ("T",)
    assert top.peak_bytes[-1] >= 2 * top.peak_bytes[0] >= 2 * 32 * OBS * 4  # one row per step
    assert any("0:T" in h for h in top.held_by)
    assert "running sums" in top.bounded_by and "accumulate=True" in top.bounded_by
    text = exp.describe()
    assert "the peak grows with T" in text and "bounded by: memory_budget" in text
    assert text in caplog.text  # logged at INFO
    assert not ex.options.accumulate  # explaining changes nothing


def test_monte_carlo_returns_are_bounded_by_no_schedule() -> None:
    """``r[t:T]``: every reward waits for the episode's end under each schedule the budget
    tries; the explanation names the read and says so."""
    ctx, bounds = _monte_carlo(lambda v, p: None)
    exp = ctx.compile(bounds, backend="torch", explain_memory=True).memory_explanation
    assert exp is not None and exp.grows
    env = next(t for t in exp.tensors if t.label == "'env'")
    assert any("t:T" in h for h in env.held_by)
    assert env.bounded_by.startswith("no schedule")


def test_static_program_lists_its_largest_tensors() -> None:
    """Without dynamic bounds: the estimate's largest tensors (an episode of observations
    for a static T) and no growth."""
    ctx, bounds = nstep_program(16, False, lambda v, p: None, obs=OBS)
    exp = ctx.compile(bounds, backend="jax", explain_memory=True).memory_explanation
    assert exp is not None and exp.growth is None and not exp.tensors
    obs = next(t for t in exp.peak.tensors if t.label == "'obs'")
    assert obs.peak_points == 16 and obs.point_bytes == OBS * 4
    assert "no dynamic bounds" in exp.describe()


def test_without_the_option_nothing_is_explained() -> None:
    ctx, bounds = nstep_program(8, True, lambda v, p: None, obs=OBS)
    assert ctx.compile(bounds, backend="torch").memory_explanation is None


def test_under_a_budget_the_peak_does_not_grow() -> None:
    """With ``memory_budget`` the chosen schedule (running sums) is explained: no growth."""
    ctx, bounds = nstep_program(8, True, lambda v, p: None, obs=OBS)
    ex = ctx.compile(bounds, backend="torch", memory_budget="1MB", explain_memory=True)
    exp = ex.memory_explanation
    assert ex.options.accumulate and exp is not None and not exp.grows
    assert "does not grow with T" in exp.describe()
