"""Ill-formed programs (the fuzz mutants of issue 15) keep failing at compile time.

Each mutant breaks one well-formed program in one way; the error must be a
``TimeRLError`` raised while the program is written or compiled (never at run time,
never a wrong value), and it must name the tensor at fault.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import timerl as trl


def _build(mutant: str) -> None:
    """A forward recurrence, a clipped window, a clamped lookbehind and a gradient; ``mutant``
    breaks one of them. Compiles (and would run) the program."""
    ctx = trl.Context(dims=("t",))
    with ctx as ((t, T),):
        w = trl.param(np.array([0.5, -0.5], np.float32), name="w")
        x = trl.empty((2,), domain=(t,), name="x")
        if mutant != "missing base case":
            x[0] = w * 1.0
        if mutant == "self cycle":
            x[t] = x[t] * 0.5 + 1.0
        elif mutant == "wrong-shaped branch":
            x[t + 1] = trl.const(np.ones(3, np.float32)) * x[t].sum()
        else:
            x[t + 1] = (x[t] * w).tanh() + 0.1
        if mutant == "dropped window clip":
            g = x[t : t + 2].sum(0)
        else:
            g = x[t : trl.min(t + 2, T)].sum(0)
        if mutant == "dropped clamp":
            back = x[t - 1]
        elif mutant == "dropped guard":
            back = x[t + 1]
        elif mutant == "t*t index":
            back = x[t * t]
        else:
            back = x[trl.max(t - 1, 0)]
        loss = ((g + back) * (g + back)).sum()
        loss.backward()
        w.grad.sink(lambda v, p: None, name="grad_sink")
    ctx.compile({T: 4}, backend="torch")


def test_the_well_formed_program_compiles() -> None:
    _build("none")


MUTANTS: dict[str, tuple[type[trl.TimeRLError], str]] = {
    "missing base case": (trl.errors.UndefinedPointError, "'x'"),
    "self cycle": (trl.errors.ScheduleError, "'x'"),
    "dropped guard": (trl.errors.UndefinedPointError, "'x'"),
    "dropped clamp": (trl.errors.UndefinedPointError, "'x'"),
    "dropped window clip": (trl.errors.UndefinedPointError, "'x'"),
    "t*t index": (trl.errors.NonAffineIndexError, "'x'"),
    "wrong-shaped branch": (trl.errors.ShapeError, "'x'"),
}


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_mutant_is_a_compile_time_error(mutant: str) -> None:
    kind, names = MUTANTS[mutant]
    with pytest.raises(kind) as info:
        _build(mutant)
    assert isinstance(info.value, trl.TimeRLError)
    assert names in str(info.value), str(info.value)


@pytest.mark.parametrize(
    "make",
    [
        lambda x, i, t, T: x[i, t - 1],  # reads t = -1 at the first step
        lambda x, i, t, T: x[i, t : t + 3].sum(0),  # reads t = T at the last steps
        lambda x, i, t, T: x[t, t],  # indexes i with t: i = t >= I
    ],
)
def test_unguarded_reads_in_two_dims_fail_at_compile_time(make: Callable[..., Any]) -> None:
    ctx = trl.Context(dims=("i", "t"))
    with ctx as ((i, I), (t, T)):
        x = trl.as_tensor(t) * (trl.as_tensor(i) + 1.0)
        y = trl.empty((), domain=(i, t), name="y")
        y[i, 0] = trl.zeros(())
        y[i, t + 1] = y[i, t] + make(x, i, t, T)
        y.sink(lambda v, p: None)
    with pytest.raises(trl.errors.UndefinedPointError):
        ctx.compile({I: 2, T: 4}, backend="torch")
