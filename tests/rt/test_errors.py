"""Bad programs raise a ``timerl.TimeRLError`` subclass, as early as it is knowable.

Each message must name the tensor involved (its ``name=``) and give a hint. Undefined
reads and unknown bounds are covered in ``test_end_to_end.py``. Every program is tiny
(T <= 4) and every test runs under an alarm, so a hang fails instead of blocking.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import timerl as trl

BUDGET_S = 30


@pytest.fixture(autouse=True)
def _budget() -> Iterator[None]:
    """Fail a test that runs longer than ``BUDGET_S`` (best effort: fires between bytecodes)."""

    def expire(signum: int, frame: Any) -> None:
        raise TimeoutError(f"test exceeded its {BUDGET_S} s budget")

    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, BUDGET_S)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


# -- non-affine indices: rejected where they are written ---------------------------------


@pytest.mark.parametrize(
    "index, part",
    [
        (lambda i, t: (t * t,), "t * t"),
        (lambda i, t: (t * i,), "t * i"),
        (lambda i, t: (t // (i + 1),), "t // (i + 1)"),
        (lambda i, t: (slice(0, t * i),), "t * i"),
        (lambda i, t: (t, t * i < 3), "t * i"),
    ],
    ids=["t*t", "t*i", "floordiv-by-dim", "slice-stop", "condition"],
)
def test_non_affine_index_names_the_tensor(index: Any, part: str) -> None:
    ctx = trl.Context(dims=("i", "t"))
    with ctx as ((i, I), (t, T)):
        xs = trl.empty((), domain=(t,), name="xs")
        xs[0] = trl.zeros(())
        xs[t + 1] = xs + 1.0
        with pytest.raises(trl.NonAffineIndexError) as err:
            xs[index(i, t)]
    msg = str(err.value)
    assert "'xs'" in msg and "not affine" in msg and f"`{part}`" in msg, msg
    assert "Hint:" in msg and "t + 1" in msg, msg


def test_non_affine_branch_index_names_the_tensor() -> None:
    ctx = trl.Context(dims=("t",))
    with ctx as ((t, T),):
        acc = trl.empty((), domain=(t,), name="acc")
        with pytest.raises(trl.NonAffineIndexError) as err:
            acc[t * t] = trl.zeros(())
    msg = str(err.value)
    assert "'acc'" in msg and "branching definition" in msg and "Hint:" in msg and "t + k" in msg, msg


def test_index_times_static_bound_is_affine() -> None:
    """``i * T`` is affine once ``T`` is static: not rejected at definition time."""
    got: dict[int, float] = {}
    ctx = trl.Context(dims=("i", "t"))
    with ctx as ((i, I), (t, T)):
        xs = trl.as_tensor(t * 10, name="xs")
        xs[i * T // 4].sink(lambda v, p: got.__setitem__(p["i"], float(v)))
    ctx.compile({I: 2, T: 4}, backend="jax").execute()
    assert got == {0: 0.0, 1: 10.0}


# -- shapes: rejected at definition time ----------------------------------------------------


def test_binary_op_shape_mismatch_names_both_operands() -> None:
    ctx = trl.Context(dims=("t",))
    with ctx as ((t, T),):
        a = trl.zeros((3,), domain=(t,), name="a")
        b = trl.ones((4,), name="b")
        with pytest.raises(trl.ShapeError) as err:
            a + b
    msg = str(err.value)
    assert "add of 'a' and 'b'" in msg and "(3,)" in msg and "(4,)" in msg, msg
    assert "reshape or expand" in msg, msg


def test_matmul_shape_mismatch_names_both_operands() -> None:
    ctx = trl.Context(dims=("t",))
    with ctx as ((t, T),):
        m = trl.zeros((2, 3), name="m")
        v = trl.zeros((4,), name="v")
        with pytest.raises(trl.ShapeError) as err:
            m @ v
    msg = str(err.value)
    assert "'m'" in msg and "'v'" in msg and "last dim of the left operand" in msg, msg


def test_branch_value_shape_mismatch_names_the_tensor() -> None:
    ctx = trl.Context(dims=("t",))
    with ctx as ((t, T),):
        acc = trl.empty((3,), domain=(t,), name="acc")
        with pytest.raises(trl.ShapeError) as err:
            acc[0] = trl.zeros((4,))
    msg = str(err.value)
    assert "'acc'" in msg and "(3,)" in msg and "(4,)" in msg and "reshape or expand" in msg, msg


# -- cycles: rejected at compile time ---------------------------------------------------------


def test_mutual_same_point_cycle_is_a_schedule_error() -> None:
    """a[t] = b[t] + 1 and b[t] = 2 a[t]: no order of the two exists."""
    ctx = trl.Context(dims=("t",))
    with ctx as ((t, T),):
        a = trl.empty((), domain=(t,), name="a")
        b = trl.empty((), domain=(t,), name="b")
        a[t] = b + 1.0
        b[t] = a * 2.0
        a.sink(lambda v, p: None)
    with pytest.raises(trl.ScheduleError) as err:
        ctx.compile({T: 3}, backend="jax")
    msg = str(err.value)
    assert "'a'" in msg and "'b'" in msg and "cycle" in msg and "Hint:" in msg, msg


def test_self_read_at_the_same_point_is_a_schedule_error() -> None:
    ctx = trl.Context(dims=("t",))
    with ctx as ((t, T),):
        x = trl.empty((), domain=(t,), name="x")
        x[t] = x + 1.0
        x.sink(lambda v, p: None)
    with pytest.raises(trl.ScheduleError) as err:
        ctx.compile({T: 3}, backend="jax")
    msg = str(err.value)
    assert "'x'" in msg and "cycle" in msg and "x[t - 1]" in msg, msg


def test_opposite_shifts_form_an_unschedulable_cycle() -> None:
    """a[t] reads b[t + 1], b[t + 1] reads a[t]: a cycle through two tensors at distance 0."""
    ctx = trl.Context(dims=("t",))
    with ctx as ((t, T),):
        a = trl.empty((), domain=(t,), name="a")
        b = trl.empty((), domain=(t,), name="b")
        a[T - 1] = trl.zeros(())
        a[t] = b[t + 1] + 1.0
        b[0] = trl.zeros(())
        b[t] = a[t - 1] * 2.0
        a.sink(lambda v, p: None)
    with pytest.raises(trl.ScheduleError) as err:
        ctx.compile({T: 4}, backend="jax")
    msg = str(err.value)
    assert "'a'" in msg and "'b'" in msg and "Hint:" in msg, msg


def test_reading_past_the_last_point_in_a_recurrence_is_undefined() -> None:
    """x[t + 1] = x[t + 2] + 1: x[T - 1] would need x[T]; reported before scheduling."""
    ctx = trl.Context(dims=("t",))
    with ctx as ((t, T),):
        x = trl.empty((), domain=(t,), name="x")
        x[0] = trl.zeros(())
        x[t + 1] = x[t + 2] + 1.0
        x.sink(lambda v, p: None)
    with pytest.raises(trl.UndefinedPointError) as err:
        ctx.compile({T: 3}, backend="jax")
    msg = str(err.value)
    assert "'x'" in msg and "x[2]" in msg and "Hint:" in msg, msg


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_backward_recurrence_from_the_last_point_is_not_a_cycle(backend: str) -> None:
    """x[T - 1] = 0, x[t] = x[t + 1] + 1 runs backwards in t (the GAE pattern); no error."""
    got: dict[int, float] = {}
    ctx = trl.Context(dims=("t",))
    with ctx as ((t, T),):
        x = trl.empty((), domain=(t,), name="x")
        x[T - 1] = trl.zeros(())
        x[t] = x[t + 1] + 1.0
        x.sink(lambda v, p: got.__setitem__(p["t"], float(v)))
    ctx.compile({T: 4}, backend=backend).execute()
    assert got == {0: 3.0, 1: 2.0, 2: 1.0, 3: 0.0}


# -- runtime failures in user code --------------------------------------------------------------


def _env_program(step: Any, name: str | None, steps: int, backend: str = "jax") -> Any:
    """o[0] = 0, o[t + 1] = step(o[t]) over T = ``steps``: a UDF stepping sequentially (like an env)."""
    ctx = trl.Context(dims=("t",))
    with ctx as ((t, T),):
        o = trl.empty((), domain=(t,), name="obs")
        o[0] = trl.zeros(())
        (nxt,) = trl.udf(step, [((), trl.float32)], domain=(t,), inputs=[o], name=name)
        o[t + 1] = nxt
        o.sink(lambda v, p: None)
    return ctx.compile({T: steps}, backend=backend)


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_udf_that_raises_names_the_udf_and_the_point(backend: str) -> None:
    def step(inputs: list[np.ndarray], point: dict[str, int]) -> list[np.ndarray]:
        if point["t"] == 2:
            raise ValueError("env exploded")
        return [inputs[0] + 1.0]

    ex = _env_program(step, "env_step", 4, backend)
    with pytest.raises(trl.RuntimeExecutionError) as err:
        ex.execute()
    msg = str(err.value)
    assert "'env_step'" in msg and "ValueError: env exploded" in msg and "{'t': 2}" in msg, msg
    assert isinstance(err.value.__cause__, ValueError)


def test_unnamed_udf_that_raises_points_at_its_definition() -> None:
    def broken_step(inputs: list[np.ndarray], point: dict[str, int]) -> list[np.ndarray]:
        raise RuntimeError("no connection")

    ex = _env_program(broken_step, None, 3)
    with pytest.raises(trl.RuntimeExecutionError) as err:
        ex.execute()
    msg = str(err.value)
    assert "test_errors.py" in msg and "RuntimeError: no connection" in msg and "{'t': 0}" in msg, msg


def test_udf_returning_a_wrong_shape_names_the_udf() -> None:
    def step(inputs: list[np.ndarray], point: dict[str, int]) -> list[np.ndarray]:
        return [np.zeros(3, np.float32)]

    ex = _env_program(step, "env_step", 3)
    with pytest.raises(trl.RuntimeExecutionError) as err:
        ex.execute()
    msg = str(err.value)
    assert "'env_step'" in msg and "shape (3,)" in msg and "expected ()" in msg, msg


def test_sink_that_raises_names_the_sink_and_the_point() -> None:
    def log(v: np.ndarray, p: dict[str, int]) -> None:
        if p["t"] == 1:
            raise KeyError("missing column")

    ctx = trl.Context(dims=("t",))
    with ctx as ((t, T),):
        trl.as_tensor(t).sink(log, name="logger")
    with pytest.raises(trl.RuntimeExecutionError) as err:
        ctx.compile({T: 3}, backend="jax").execute()
    msg = str(err.value)
    assert "'logger'" in msg and "KeyError" in msg and "{'t': 1}" in msg, msg


def test_udf_runs_once_per_point_of_its_domain() -> None:
    """A UDF over t without ``batch_dims`` is called once per t (not vectorized over t)."""
    calls: list[dict[str, int]] = []

    def obs(inputs: list[np.ndarray], point: dict[str, int]) -> list[np.ndarray]:
        calls.append(dict(point))
        return [np.float32(point.get("t", -1))]

    ctx = trl.Context(dims=("t",))
    with ctx as ((t, T),):
        (o,) = trl.udf(obs, [((), trl.float32)], domain=(t,), name="obs")
        o.sink(lambda v, p: None)
    ctx.compile({T: 3}, backend="jax").execute()
    assert calls == [{"t": 0}, {"t": 1}, {"t": 2}]


# -- autodiff misuse ------------------------------------------------------------------------------


def test_backward_on_a_non_scalar_names_the_loss_and_suggests_a_reduction() -> None:
    ctx = trl.Context(dims=("t",))
    with ctx as ((t, T),):
        w = trl.param(np.ones(2, np.float32), name="w")
        loss = trl.empty((2,), domain=(t,), name="loss")
        loss[t] = w * trl.as_tensor(t)
        with pytest.raises(trl.AutodiffError) as err:
            loss.backward()
    msg = str(err.value)
    assert "'loss'" in msg and "(2,)" in msg and "loss.sum()" in msg, msg
