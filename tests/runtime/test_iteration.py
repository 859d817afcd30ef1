"""The iteration loop's body as one compiled call (``runtime/iteration.py``, option
``compile_iterations``, JAX): the same values as the body run statement by statement, for
the parameters carried across iterations, random draws, values computed from ``i`` and
sinks; bodies the plan cannot compile say why; a trace that fails runs as before."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest

import timerl as trl
from timerl.backends.jax_backend import JaxBackend
from timerl.errors import TimeRLError
from timerl.runtime import iteration

W = np.array([[0.5, -0.3], [0.2, 0.8]], np.float32)


def _program(
    bad_sink_at: int | None = None,
    ckpt: str | None = None,
    steps: int = 7,
    sink_inside: bool = False,
    iterations: int = 7,
) -> tuple[trl.Context, dict, dict]:
    """A rollout over t from the parameter w with noise drawn per (i, t), a step size that
    depends on i and w moved by the rollout's sum; sinks record the values."""
    seen: dict = {"sum": {}, "w": {}, "noise": {}, "x": {}}
    tab = np.linspace(-1.0, 1.0, 2 * steps, dtype=np.float32).reshape(steps, 2)

    def on_sum(v: np.ndarray, p: dict) -> None:
        if p["i"] == bad_sink_at:
            raise ValueError("the sink refuses this value")
        seen["sum"][p["i"]] = float(v)

    ctx = trl.Context(dims=("i", "t"))
    with ctx as ((i, I), (t, T)):
        w = trl.param(np.array([0.3, -0.2], np.float32), domain=(i,), name="w")
        noise = trl.rand((2,), domain=(i, t), name="noise")
        x = trl.empty((2,), domain=(i, t), name="x")
        x[i, 0] = w * 1.0
        x[i, t + 1] = (x @ trl.const(W)).tanh() + trl.const(tab)[t] * 0.1 + noise * 0.01
        if sink_inside:  # the loop over t does not scan
            x.sink(lambda v, p: seen["x"].__setitem__((p["i"], p["t"]), np.array(v)))
        total = x[i, 0:T].sum()
        total.sink(on_sum)
        noise[i, 0:T].sum().sink(lambda v, p: seen["noise"].__setitem__(p["i"], float(v)))
        lr = 0.05 / trl.as_tensor(i + 1)
        w[i + 1] = w * 0.9 - lr * total.tanh()
        w.sink(lambda v, p: seen["w"].__setitem__(p["i"], np.array(v)))
        if ckpt is not None:
            w[(i + 1) % 2 == 0].checkpoint(ckpt)
    return ctx, {I: iterations, T: steps}, seen


@pytest.fixture(autouse=True)
def _check_fed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every call fed from the last call's results also rebuilds the store and checks that it
    holds the same layout and values (``iteration.CHECK_FED``)."""
    monkeypatch.setattr(iteration, "CHECK_FED", True)


def _run(compiled: bool | str, **kw: object) -> tuple[dict, Any]:
    ctx, bounds, seen = _program(**kw)  # type: ignore[arg-type]
    ex = ctx.compile(bounds, backend="jax", compile_iterations=compiled)
    ex.execute()
    return seen, ex._interp


def test_the_body_runs_as_one_call_with_the_same_values() -> None:
    off, ex_off = _run(False)
    on, ex_on = _run(True)
    assert ex_off._iteration is None and ex_on.plan.body == ""
    # iteration 0 (w's initial value) differs from the others; their key is traced the
    # second time it is seen (iteration 2) and reused to the end
    assert ex_on._iteration.calls == 5
    assert ex_on.dispatches < ex_off.dispatches
    assert sorted(on["sum"]) == list(range(7)) and len({round(v, 5) for v in on["sum"].values()}) == 7
    for k in range(7):
        np.testing.assert_allclose(on["sum"][k], off["sum"][k], rtol=1e-6)
        np.testing.assert_allclose(on["w"][k], off["w"][k], rtol=1e-6)
        assert on["noise"][k] == off["noise"][k]  # the same seeds: the same draws


def _held(interp: Any) -> dict[tuple[int, int], list[Any]]:
    """The points every table of the store holds (a rows table's stacked rows included)."""
    out = {}
    for nid, tabs in interp.store.all_tables().items():
        for oid, tab in enumerate(tabs):
            pts = sorted(dict.keys(tab))
            for st in tab.stacks() if hasattr(tab, "stacks") else ():
                pts += sorted(map(tuple, st.cols[st.alive].tolist()))
            if pts:
                out[(nid, oid)] = pts
    return out


@pytest.mark.parametrize("check", [True, False])
def test_calls_are_fed_from_the_last_calls_results(monkeypatch: pytest.MonkeyPatch, check: bool) -> None:
    """Between two calls with known keys the store is not rebuilt: the next call takes its
    inputs from the last call's inputs and outputs. The values equal the statement-by-statement
    run's, and at the end the store holds the same points with the same values."""
    monkeypatch.setattr(iteration, "CHECK_FED", check)
    off, ex_off = _run(False, iterations=12)
    on, ex_on = _run(True, iterations=12)
    it = ex_on._iteration
    # iteration 0 runs alone, 1 is the key's first sight, 2 its trace, 3 rebuilds the store
    # and learns where its values came from; 4..11 are fed
    assert it.calls == 10 and it.fed == 8 and it._pending is None
    for k in range(12):
        np.testing.assert_allclose(on["sum"][k], off["sum"][k], rtol=1e-6)
        np.testing.assert_allclose(on["w"][k], off["w"][k], rtol=1e-6)
    held = _held(ex_on)
    assert held == _held(ex_off) and held
    for nid, oid in held:
        tab_on, tab_off = ex_on.store.all_tables()[nid][oid], ex_off.store.all_tables()[nid][oid]
        for p in dict.keys(tab_off):
            np.testing.assert_allclose(np.asarray(tab_on[p]), np.asarray(tab_off[p]), rtol=1e-6)
    assert ex_on.store.live_points == ex_off.store.live_points


def test_checkpoints_between_fed_calls_hold_the_last_calls_results(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint served between two calls puts the last call's results in the store first:
    its files equal the statement-by-statement run's, and the calls after it are fed again
    (without ``CHECK_FED``, which puts every call's inputs in the store)."""
    monkeypatch.setattr(iteration, "CHECK_FED", False)
    files = {}
    for compiled in (False, True):
        ck = tmp_path / f"ck{compiled}"
        _, ex = _run(compiled, ckpt=str(ck), iterations=16)
        files[compiled] = {f.name: np.load(f) for f in sorted(ck.glob("*.npz"))}
        if compiled:
            assert ex._iteration.fed >= 4
    assert sorted(files[True]) == sorted(files[False]) and len(files[False]) == 8
    for name, arrs in files[True].items():
        assert sorted(arrs.files) == sorted(files[False][name].files) and arrs.files
        for key in arrs.files:
            np.testing.assert_allclose(arrs[key], files[False][name][key], rtol=1e-6)


def _ppo(compiled: bool, **kw: Any) -> tuple[list[np.ndarray], Any]:
    """PPO on gymnax (one epoch, one minibatch, JAX): each iteration's rollout log and the
    compiled iteration (None when off)."""
    from timerl.agents.ppo import PPOArgs, build_fixed

    got: list[np.ndarray] = []
    args = PPOArgs(env_id="gymnax.CartPole-v1", update_epochs=1, num_minibatches=1, backend="jax", **kw)
    ex = build_fixed(args, lambda *a: got.append(np.array(a[0])), compile_iterations=compiled)
    ex.execute()
    return got, ex._interp._iteration


def test_seeds_computed_for_a_chunk_of_calls_equal_those_of_each_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The seeds of a compiled call's random draws are computed for :data:`HOST_CHUNK` calls
    at once (``many``): PPO with two agents (a seed per agent) on gymnax, every such host
    value equal to the one computed for that call alone, across chunk boundaries (a chunk of
    3), and the rollouts equal to the statement-by-statement run's."""
    monkeypatch.setattr(iteration, "TRACE_AFTER", 1)
    monkeypatch.setattr(iteration, "HOST_CHUNK", 3)
    runs = {c: _ppo(c, num_envs=3, num_steps=8, iterations=9, num_seeds=2) for c in (False, True)}
    it = runs[True][1]
    assert it.calls >= 7
    manys = [h for body in it.bodies.values() for h in body.hosts if h[3] is not None]
    assert manys
    for fn, shape, dt, many in manys:
        ds = np.arange(-2, 7)
        together = np.asarray(many(ds), dtype=dt).reshape((len(ds), *shape))
        for k, d in enumerate(ds):
            np.testing.assert_array_equal(together[k], iteration.tracing.host_array(fn, shape, dt, int(d)))
        assert len({together[k].tobytes() for k in range(len(ds))}) == len(ds)  # they move with i
    assert len(runs[True][0]) == len(runs[False][0]) == 18
    for a, b in zip(runs[True][0], runs[False][0], strict=True):
        np.testing.assert_array_equal(a, b)  # the same draws: the same rollouts


def test_nothing_host_side_runs_inside_the_compiled_call() -> None:
    """The noise's seeds and the step size (from i) are inputs of the call, the sinks' values
    outputs: the compiled body has no host callback, and the sinks still see every iteration
    in order."""
    ctx, bounds, seen = _program()
    ex = ctx.compile(bounds, backend="jax", compile_iterations=True)
    ex.execute()
    it = ex._interp._iteration
    assert it.calls == 5 and not it.queued
    (body,) = it.bodies.values()
    assert len(body.hosts) >= 2 and len(body.sinks) == 3  # seeds and lr; sum, noise and w
    text = body.fn.as_text().lower()
    assert "callback" not in text, "a host callback inside the compiled body"
    assert sorted(seen["sum"]) == sorted(seen["w"]) == list(range(7))


def test_a_short_loop_that_does_not_scan_is_unrolled_into_the_body() -> None:
    off, _ = _run(False, sink_inside=True)
    on, ex = _run(True, sink_inside=True)
    assert ex.plan.body == "" and ex._iteration.calls == 5
    assert sorted(on["x"]) == sorted(off["x"]) and len(on["x"]) == 7 * 7
    for k, v in off["x"].items():
        np.testing.assert_allclose(on["x"][k], v, rtol=1e-6)
    _, ex = _run(True, sink_inside=True, steps=300)
    assert "more than 256 times per iteration" in ex.plan.body and ex._iteration is None


def test_every_key_traced_gives_the_same_values(monkeypatch: pytest.MonkeyPatch) -> None:
    """Traced the first time each key is seen: iteration 0 (w's initial value) is a body of
    its own."""
    monkeypatch.setattr(iteration, "TRACE_AFTER", 1)
    off, _ = _run(False)
    on, ex = _run(True)
    assert ex._iteration.calls == 7 and len(ex._iteration.bodies) == 2
    for k in range(7):
        np.testing.assert_allclose(on["sum"][k], off["sum"][k], rtol=1e-6)


def test_ppo_falls_back_where_a_trace_fails(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """PPO on gymnax, traced at the first sight of each key: iteration 0 resets the
    environment (there is no state to trace from yet) and runs statement by statement; the others
    run as one call, with the returns of the statement-by-statement run."""
    monkeypatch.setattr(iteration, "TRACE_AFTER", 1)
    caplog.set_level(logging.INFO, logger="timerl.runtime.iteration")
    (off, _), (on, it) = (_ppo(c, num_envs=4, num_steps=16, iterations=4) for c in (False, True))
    assert it.calls == 3 and any("before reset" in why for why in it.refused.values())
    assert len(on) == len(off) == 4
    for a, b in zip(on, off, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_checkpoints_are_written_at_the_ends_of_compiled_iterations(tmp_path) -> None:
    """Checkpoints every second iteration: the condition on ``i`` gives two keys (odd and
    even iterations), each traced at its second sight; the files equal the
    statement-by-statement run's."""
    files = {}
    for compiled in (False, True):
        ck = tmp_path / f"ck{compiled}"
        _, ex = _run(compiled, ckpt=str(ck))
        files[compiled] = {f.name: np.load(f) for f in sorted(ck.glob("*.npz"))}
        if compiled:
            assert ex._iteration.calls == 4 and len(ex._iteration.bodies) == 2
    names = sorted(files[True])
    assert names == sorted(files[False]) and [n.rsplit("_", 1)[1] for n in names] == [
        "1.npz",
        "3.npz",
        "5.npz",
    ]
    for name, arrs in files[True].items():  # XLA fuses across statements: the last bits may differ
        assert sorted(arrs.files) == sorted(files[False][name].files) and arrs.files
        for key in arrs.files:
            np.testing.assert_allclose(arrs[key], files[False][name][key], rtol=1e-6)


def _updates() -> tuple[trl.Context, dict, dict]:
    """w updated K times per iteration i (an inner loop unrolled into the body: conditions
    over (i, k)), a value sunk after odd iterations only (a condition on i alone)."""
    seen: dict = {}
    ctx = trl.Context(dims=("i", "k"))
    with ctx as ((i, I), (k, K)):
        w = trl.empty((2,), domain=(i, k), name="w")
        w[0, 0] = trl.const(np.array([0.3, -0.2], np.float32))
        w[i, k + 1] = (w * 0.9).tanh() + 0.01
        w[i + 1, 0] = w[i, K - 1] * 1.0
        z = w[i, K - 1].exp()
        z[(i + 1) % 2 == 0].sink(lambda v, p: seen.__setitem__(p["i"], np.array(v)))
    return ctx, {I: 9, K: 3}, seen


def test_signatures_evaluated_in_chunks_equal_one_iteration_at_a_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An iteration's key (its conditions over the inner loops' iterations) is evaluated for
    a chunk of iterations at once: every iteration's equals the conditions evaluated at that
    iteration alone, across chunk boundaries (a chunk of 3 against a period of 2), and runs
    with either chunk give the values of the statement-by-statement run."""

    def one_at_a_time(it: Any, v: int) -> tuple[Any, ...]:
        out = []
        for fn, loops in it.conds:
            env = dict(it.ex._static)
            env[it.var] = v
            if loops:
                env.update(it._grid(loops))
            a = np.asarray(fn(env)[0]).astype(bool)
            out.append(a if a.ndim else bool(a))
        return tuple(out)

    runs = {}
    for name, compiled, chunk in (("off", False, 64), ("64", True, 64), ("3", True, 3)):
        monkeypatch.setattr(iteration, "SIGNATURE_CHUNK", chunk)
        ctx, bounds, seen = _updates()
        ex = ctx.compile(bounds, backend="jax", compile_iterations=compiled)
        ex.execute()
        runs[name] = seen
    it = ex._interp._iteration
    assert it.calls >= 5 and any(loops for _, loops in it.conds) and any(not lp for _, lp in it.conds)
    it._sigs = {}
    keys = [it._signature(v) for v in range(9)]
    for v in range(9):
        for got, want in zip(keys[v], one_at_a_time(it, v), strict=True):
            if isinstance(want, bool):
                assert got == want
            else:
                assert got == np.packbits(want).tobytes() + bytes([want.size % 8])
    assert keys[1] == keys[3] == keys[5] != keys[2] == keys[4] != keys[0]
    for name in ("64", "3"):
        assert sorted(runs[name]) == [1, 3, 5, 7]
        for v in (1, 3, 5, 7):
            np.testing.assert_allclose(runs[name][v], runs["off"][v], rtol=1e-6)


def test_a_sink_error_inside_a_compiled_call_is_raised() -> None:
    with pytest.raises(TimeRLError, match="the sink refuses this value"):
        _run(True, bad_sink_at=4)


def test_a_loop_whose_live_values_change_every_iteration_stops_trying() -> None:
    """Every iteration's y is kept for the sum after the loop: the store's layout differs at
    every iteration, so no traced body could be reused."""
    ctx = trl.Context(dims=("i",))
    with ctx as ((i, I),):
        w = trl.param(np.array([0.3, -0.2], np.float32), domain=(i,), name="w")
        y = trl.empty((2,), domain=(i,), name="y")
        y[i] = w * 2.0
        w[i + 1] = w * 0.5 + 0.1
        total = y[0:I].sum()
        got = []
        total.sink(lambda v, p: got.append(np.array(v)))
    ex = ctx.compile({I: 9}, backend="jax", compile_iterations=True)
    ex.execute()
    it = ex._interp._iteration
    assert ex.plan.body == "" and it.calls == 0 and "differed" in it.off and not it.seen
    want, w_ = np.zeros(2, np.float32), np.array([0.3, -0.2], np.float32)
    for _ in range(9):
        want += w_ * 2.0
        w_ = w_ * 0.5 + 0.1
    np.testing.assert_allclose(got[0], want.sum(), rtol=1e-6)


def test_the_plan_says_why_a_body_is_not_compiled() -> None:
    ctx = trl.Context(dims=("i", "t"))
    tab = np.arange(16, dtype=np.float32).reshape(8, 2)
    with ctx as ((i, I), (t, T)):
        w = trl.param(np.array([0.3, -0.2], np.float32), domain=(i,), name="w")
        w[i + 1] = w * 0.5 + trl.const(tab)[2 * i]  # moves by two rows per iteration
        w.sink(lambda v, p: None)
    ex = ctx.compile({I: 4, T: 2}, backend="jax", compile_iterations=True)
    assert ex.plan.iter_loop is not None and "2*i" in ex.plan.body.replace(" ", "")
    assert ex._interp._iteration is None
    ctx, bounds, _ = _program()
    ex = ctx.compile(bounds, backend="torch", compile_iterations=True)
    assert "does not compile loops" in ex.plan.body
    ex = ctx.compile(bounds, backend="jax", compile_iterations=False)
    assert "compile_iterations=False" in ex.plan.body and ex._interp._iteration is None
    assert ex.iteration_body.startswith("statement by statement: the body of the iteration loop is not")
    ex = ctx.compile(bounds, backend="jax")  # "auto" by default: the plan allows it
    assert ex.plan.body == "" and "where timed faster" in ex.plan.summary()
    with pytest.raises(TimeRLError, match="compile_iterations='yes'"):
        ctx.compile(bounds, backend="jax", compile_iterations="yes")


class _Clock:
    """Stands in for ``time`` in runtime/iteration.py: an iteration statement by statement
    takes ``stmt`` seconds, ``host`` of them on the host thread, and adds ``compiling`` to the
    backend's compile time; a compiled call takes ``call``."""

    def __init__(
        self, monkeypatch: pytest.MonkeyPatch, stmt: float, call: float, host: float, compiling: float = 0.0
    ) -> None:
        self.t = self.cpu = self.compiled = 0.0
        monkeypatch.setattr(iteration, "time", self)
        monkeypatch.setattr(JaxBackend, "compile_seconds", lambda be: self.compiled)
        run, statements = iteration.CompiledIteration._run, iteration.CompiledIteration._statements

        def timed_run(it: Any, *a: Any) -> None:
            self.t += call
            run(it, *a)

        def timed_statements(it: Any) -> None:
            self.t += stmt
            self.cpu += host * stmt
            self.compiled += compiling
            statements(it)

        monkeypatch.setattr(iteration.CompiledIteration, "_run", timed_run)
        monkeypatch.setattr(iteration.CompiledIteration, "_statements", timed_statements)

    def perf_counter(self) -> float:
        return self.t

    def thread_time(self) -> float:
        return self.cpu


@pytest.mark.parametrize(
    ("stmt", "call", "host", "min_left", "compiling", "calls", "want"),
    [
        (
            2.0,
            1.0,
            0.9,
            5,
            1.0,
            20,
            "one compiled call per iteration: measured 1000.0 ms per iteration against 2000.0",
        ),
        (2.0, 3.0, 0.9, 5, 0.0, 4, "statement by statement: one compiled call took 3000.0 ms"),
        (2.0, 1.0, 0.1, 5, 0.0, 0, "statement by statement: the host took 10% of an iteration (2000.0 ms)"),
        (2.0, 1.0, 0.9, 100, 0.0, 0, "statement by statement: only 19 iterations remain"),
        (
            2.0,
            1.0,
            0.9,
            5,
            9.0,
            0,
            "statement by statement: compiling it would take about 36.0 s (what its iterations' "
            "statements took to compile), more than the host's 1800.0 ms per iteration can save "
            "over the 19 iterations left",
        ),
    ],
)
def test_auto_keeps_the_body_compiled_only_where_it_was_timed_faster(
    monkeypatch: pytest.MonkeyPatch,
    stmt: float,
    call: float,
    host: float,
    min_left: int,
    compiling: float,
    calls: int,
    want: str,
) -> None:
    """``compile_iterations="auto"``: a trace only where the host's share of an iteration
    run statement by statement is large, enough iterations remain, and the host time they
    can save exceeds the compile time the statements took (4 x 1 s < 19 x 1.8 s: traced;
    4 x 9 s > 19 x 1.8 s: not); the compiled body kept only where its calls were no slower
    than the statements (clocks stood in for); the values are those of the statements
    whichever way it runs."""
    monkeypatch.setattr(iteration, "SAMPLES", 2)
    monkeypatch.setattr(iteration, "MIN_LEFT", min_left)
    off, _ = _run(False, iterations=24)
    _Clock(monkeypatch, stmt, call, host, compiling)
    on, ex = _run("auto", iterations=24)
    it = ex._iteration
    assert it.status.startswith(want), it.status
    # iteration 0 differs; 1 is its key's first; 2-3 are timed; 4 traces (or not); 5 follows
    # the trace; 6-7 are timed; 8 keeps the compiled body (or not)
    assert it.calls == calls
    if "took" in want:
        assert not it.bodies  # the compiled calls' memory is let go
    for k in range(24):
        np.testing.assert_allclose(on["sum"][k], off["sum"][k], rtol=1e-6)
        np.testing.assert_allclose(on["w"][k], off["w"][k], rtol=1e-6)
        assert on["noise"][k] == off["noise"][k]
