"""``memory_budget`` on issue 33's n-step REINFORCE-shaped program (``benchmarks/memory_nstep.py``):
observations from an environment UDF, a linear policy, returns over ``r[t:min(t + 8, T)]``,
SGD; static and dynamic ``T``, observations of 1,024 floats (4 KiB).

Without a budget the learner holds an episode of observations (the weight gradient is one
contraction of the stacked steps): its peak grows with ``T``. Under the budget the
compiler picks a schedule whose peak does not (dynamic ``T``: running sums over the episode,
the learner ``n - 1`` steps behind acting; static ``T``: incrementalization), the trained
weights equal those without the budget, and the store never exceeds the budget. A program
whose peak grows with an unbounded dynamic ``T`` under every schedule fails before running.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import timerl as trl
from timerl.errors import MemoryBudgetError
from timerl.plan.peak import dynamic_growth

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from memory_nstep import nstep_program  # noqa: E402

OBS = 1024  # floats per observation
SHORT, LONG = 16, 128
BUDGET = 512 * 1000  # bytes; the default schedule holds about 1 MB at T = LONG (static)


@functools.cache
def _run(length: int, dynamic: bool, backend: str, budget: bool) -> tuple[Any, tuple[np.ndarray, ...]]:
    got: list[np.ndarray] = []
    ctx, bounds = nstep_program(length, dynamic, lambda v, p: got.append(np.array(v)), obs=OBS)
    ex = ctx.compile(bounds, backend=backend, **({"memory_budget": BUDGET} if budget else {}))
    ex.execute()
    return ex, tuple(got)


@pytest.mark.parametrize("backend", ["jax", "torch"])
@pytest.mark.parametrize("dynamic", [True, False], ids=["dynamic", "static"])
def test_budget_on_equals_off(backend: str, dynamic: bool) -> None:
    """The same weights with and without the budget (which changes the schedule: running
    sums for a dynamic T, incrementalized contractions for a static one)."""
    length = SHORT if dynamic else LONG
    base, want = _run(length, dynamic, backend, False)
    ex, got = _run(length, dynamic, backend, True)
    if dynamic:
        assert ex.options.accumulate and not base.options.accumulate
    else:
        assert ex.options.incrementalize is not None
    assert len(got) == len(want) == 2
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    assert ex.memory_stats().peak_bytes <= BUDGET


@pytest.mark.parametrize("backend", ["jax", "torch"])
@pytest.mark.parametrize("dynamic", [True, False], ids=["dynamic", "static"])
def test_peak_does_not_grow_with_the_episode_under_the_budget(backend: str, dynamic: bool) -> None:
    """Peak store bytes at T = 128 at most 1.5x those at T = 16, never above the budget; the
    default schedule's peak grows by more than the budget over the same lengths."""
    short = _run(SHORT, dynamic, backend, True)[0].memory_stats().peak_bytes
    long = _run(LONG, dynamic, backend, True)[0].memory_stats().peak_bytes
    assert 0 < long <= 1.5 * short
    assert max(short, long) <= BUDGET
    if not dynamic:
        assert _run(LONG, dynamic, backend, False)[0].memory_stats().peak_bytes > BUDGET
    else:  # the default schedule's estimate grows (by the observations the contraction stacks)
        growth = dynamic_growth(_run(SHORT, dynamic, backend, False)[0].plan)
        assert growth is not None and growth.grows
        assert growth.peaks[-1] - growth.peaks[0] >= 64 * OBS * 4


def _monte_carlo(sink: Any) -> tuple[trl.Context, dict]:
    """Returns over the rest of each episode, ``r[t:T]``: every reward waits for the end."""
    ctx = trl.Context(dims=("i", "t"))
    with ctx as ((i, I), (t, T)):
        x = trl.empty((), domain=(i, t), name="x")
        x[i, 0] = trl.zeros(())

        def step(ins: list[np.ndarray], pt: dict[str, int]) -> list[np.ndarray]:
            return [ins[0] + np.float32(1), np.float32(pt["t"] % 3), np.array(pt["t"] + 1 >= 50)]

        specs = [((), trl.float32), ((), trl.float32), ((), trl.bool_)]
        nxt, r, d = trl.udf(step, specs, domain=(i, t), inputs=[x], name="env")
        x[i, t + 1] = nxt
        r[i, t:T].sum(0).sink(sink)
    return ctx, {I: 2, T: d}


def test_a_peak_growing_with_an_unbounded_dynamic_bound_fails_before_running() -> None:
    """Monte-Carlo returns: under any schedule an episode's rewards wait for its end
    (``r[t:T]``), so no budget holds for every T: ``MemoryBudgetError`` names the growing
    tensor before anything runs."""
    ran: list[object] = []
    ctx, bounds = _monte_carlo(lambda v, p: ran.append(v))
    with pytest.raises(MemoryBudgetError) as info:
        ctx.compile(bounds, backend="torch", memory_budget="1MB")
    msg = str(info.value)
    assert "grows with them" in msg and "'env'" in msg and "T = 64" in msg and "Fix:" in msg
    assert not ran
    ctx, bounds = _monte_carlo(lambda v, p: ran.append(v))
    ctx.compile(bounds, backend="torch").execute()  # runs without a budget
    assert len(ran) == 100


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_max_bounds_lets_a_growing_peak_run_under_the_budget(backend: str) -> None:
    """Monte-Carlo returns with ``max_bounds={T: 64}``: the peak grows with ``T`` but its
    estimate at ``T = 64`` fits, so the program runs (same values as without a budget) and
    the store stays under the budget."""
    want: list[object] = []
    ctx, bounds = _monte_carlo(lambda v, p: want.append(np.array(v)))
    ctx.compile(bounds, backend=backend).execute()
    got: list[object] = []
    ctx, bounds = _monte_carlo(lambda v, p: got.append(np.array(v)))
    ex = ctx.compile(bounds, backend=backend, memory_budget="1MB", max_bounds={"T": 64})
    ex.execute()
    assert ex.options.max_bounds == (("T", 64),)
    assert len(got) == len(want) == 100
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6)
    growth = dynamic_growth(ex.plan)
    assert growth is not None and growth.grows and growth.at_max is not None
    assert growth.peaks[0] <= growth.at_max <= 1_000_000
    assert ex.memory_stats().peak_bytes <= 1_000_000


def test_an_episode_past_max_bounds_stops_the_run() -> None:
    """Episodes of 50 steps under ``max_bounds={T: 40}``: ``BoundError`` at the step that
    passes it, naming the bound, the point and the fix."""
    ctx, bounds = _monte_carlo(lambda v, p: None)
    ex = ctx.compile(bounds, backend="torch", max_bounds={"T": 40})
    with pytest.raises(trl.BoundError) as info:
        ex.execute()
    msg = str(info.value)
    assert "max_bounds T <= 40" in msg and "t = 39" in msg and "{i: 0}" in msg and "Fix:" in msg


def test_a_peak_past_the_budget_at_max_bounds_fails_before_running() -> None:
    """At ``T = 100,000`` the rewards of an episode (400 KB per tensor holding them) do not fit
    64 KB: ``MemoryBudgetError`` before running, naming ``max_bounds`` and the growing
    tensor."""
    ran: list[object] = []
    ctx, bounds = _monte_carlo(lambda v, p: ran.append(v))
    with pytest.raises(MemoryBudgetError) as info:
        ctx.compile(bounds, backend="torch", memory_budget="64KB", max_bounds={"T": 100_000})
    msg = str(info.value)
    assert "up to T = 100000 (max_bounds)" in msg and "'env'" in msg and "lower max_bounds" in msg
    assert not ran


@pytest.mark.parametrize(
    ("given", "words"),
    [({"B": 5}, "not a bound of the program"), ({"I": 5}, "a static bound"), ({"T": 0}, "an int >= 1")],
)
def test_max_bounds_names_dynamic_bounds(given: dict, words: str) -> None:
    ctx, bounds = _monte_carlo(lambda v, p: None)
    with pytest.raises(trl.TimeRLError, match=words):
        ctx.compile(bounds, backend="torch", max_bounds=given)


def test_the_peak_at_max_bounds_is_extrapolated_where_the_walk_stops() -> None:
    """A walk at ``max_bounds`` cut short by its step limit gives at least the complete walk's
    peak (the line through the probes at the padded length), and at most twice it."""
    ctx, bounds = _monte_carlo(lambda v, p: None)
    ex = ctx.compile(bounds, backend="torch", max_bounds={"T": 100_000})
    full = dynamic_growth(ex.plan)
    cut = dynamic_growth(ex.plan, max_steps=5_000)  # the probes' walks (<= 1,281 steps) complete
    assert full is not None and cut is not None and full.at_max is not None and cut.at_max is not None
    assert cut.peaks == full.peaks
    assert full.at_max <= cut.at_max <= 2 * full.at_max
