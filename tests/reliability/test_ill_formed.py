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


def _build_new_op(mutant: str, backend: str = "torch") -> None:
    """A forward recurrence read through the ops the fuzzer added (matmul, reshape/permute,
    a UDF); ``mutant`` breaks one of them. Compiles and runs the program."""
    ctx = trl.Context(dims=("t",))
    with ctx as ((t, T),):
        x = trl.empty((2,), domain=(t,), name="x")
        x[0] = trl.ones((2,))
        x[t + 1] = (x[t] * 0.5).tanh()
        m = trl.const(np.eye(2, dtype=np.float32) * 0.5, name="m")

        def host(ins: list[np.ndarray], pt: dict[str, int]) -> list[np.ndarray]:
            return [np.zeros(3, np.float32) if mutant == "udf returns a wrong shape" else ins[0] * 2.0]

        if mutant == "matmul of wrong shapes":
            y = x @ trl.const(np.ones((3, 2), np.float32), name="m3")
        elif mutant == "t*t index in a matmul":
            y = x[t * t] @ m
        elif mutant == "t*t index in reshape/permute":
            y = x[t * t].reshape(2, 1).permute(1, 0).reshape(2)
        elif mutant == "t*t index into a udf":
            (y,) = trl.udf(host, [((2,), trl.float32)], domain=(t,), inputs=[x[t * t]], name="host")
        elif mutant == "udf declares a wrong shape":
            (u,) = trl.udf(host, [((3,), trl.float32)], domain=(t,), inputs=[x], name="host")
            y = trl.empty((2,), domain=(t,), name="y")
            y[0] = trl.zeros((2,))
            y[t + 1] = u
        elif mutant == "dropped guard into a udf":
            (y,) = trl.udf(host, [((2,), trl.float32)], domain=(t,), inputs=[x[t + 1]], name="host")
        elif mutant == "dropped window clip in a matmul":
            y = (x[t : t + 2] @ m).sum(0)
        else:
            (u,) = trl.udf(host, [((2,), trl.float32)], domain=(t,), inputs=[x], name="host")
            y = (u.reshape(2, 1).permute(1, 0) @ m).reshape(2) + (x[t : trl.min(t + 2, T)] @ m).sum(0)
        y.sink(lambda v, p: None, name="y_sink")
    ctx.compile({T: 4}, backend=backend).execute()


@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_the_well_formed_new_op_program_runs(backend: str) -> None:
    _build_new_op("none", backend)


NEW_OP_MUTANTS: dict[str, tuple[type[trl.TimeRLError], str]] = {
    "matmul of wrong shapes": (trl.errors.ShapeError, "'x'"),
    "t*t index in a matmul": (trl.errors.NonAffineIndexError, "'x'"),
    "t*t index in reshape/permute": (trl.errors.NonAffineIndexError, "'x'"),
    "t*t index into a udf": (trl.errors.NonAffineIndexError, "'x'"),
    "udf declares a wrong shape": (trl.errors.ShapeError, "'y'"),
    "dropped guard into a udf": (trl.errors.UndefinedPointError, "'x'"),
    "dropped window clip in a matmul": (trl.errors.UndefinedPointError, "'x'"),
}


@pytest.mark.parametrize("mutant", sorted(NEW_OP_MUTANTS))
def test_new_op_mutant_is_a_compile_time_error(mutant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Raised while writing or compiling: ``execute`` is never reached."""
    kind, names = NEW_OP_MUTANTS[mutant]

    def no_run(*args: Any, **kwargs: Any) -> None:
        raise AssertionError(f"{mutant}: compiled without an error")

    monkeypatch.setattr(trl.Context, "compile", _compile_only(trl.Context.compile, no_run))
    with pytest.raises(kind) as info:
        _build_new_op(mutant)
    assert names in str(info.value), str(info.value)


def _compile_only(compile_fn: Callable[..., Any], no_run: Callable[..., Any]) -> Callable[..., Any]:
    """``Context.compile`` whose executor fails the test if it is run."""

    def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
        ex = compile_fn(self, *args, **kwargs)

        class _NoRun:
            execute = staticmethod(no_run)

        del ex
        return _NoRun()

    return wrapped


def test_a_udf_returning_a_wrong_shape_fails_at_its_first_call_naming_it() -> None:
    """A host function's result shape is known only when it runs: the first call is a
    ``TimeRLError`` naming the UDF, the point and both shapes (never a wrong value)."""
    with pytest.raises(trl.errors.RuntimeExecutionError) as info:
        _build_new_op("udf returns a wrong shape")
    msg = str(info.value)
    assert "'host'" in msg and "{'t': 0}" in msg and "(3,)" in msg and "(2,)" in msg, msg
